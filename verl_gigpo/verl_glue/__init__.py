"""Everything that subclasses, registers into or patches verl: the files to check when verl releases a new version.

:mod:`.trainer` (trainer mode), :mod:`.replay_buffer`, :mod:`.dead_actor`, :mod:`.agent_loop`; :mod:`.preflight`,
:mod:`.launch`, :mod:`.cluster`, :mod:`.metrics_file` (before Ray); :mod:`.contract` and :mod:`.verl_version` (the
guards); :mod:`.lora`; :mod:`.cpu` (verl's pipeline on a CPU). docs/verl-integration.md, docs/upgrading.md.
"""
