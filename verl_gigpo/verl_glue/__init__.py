"""Everything that subclasses, registers into or patches verl: the files to check when verl releases a new version
(:mod:`.contract` lists every verl symbol touched and its guard; docs/upgrading.md).

* :mod:`.trainer` — the V1 trainer mode ``gigpo_sync`` (overrides of verl's ``PPOTrainer``, listed in its docstring),
  with :mod:`.replay_buffer` (dynamic sampling) and :mod:`.dead_actor` (a Ray actor that died, named in one line);
* :mod:`.agent_loop` — the agent loop ``gigpo_env_agent`` (episodes to verl's rows);
* :mod:`.preflight`, :mod:`.launch`, :mod:`.cluster` — what ``python -m verl_gigpo.main`` checks and prepares before
  verl starts Ray; :mod:`.metrics_file` — the metrics file and verl's file-logger patch;
* :mod:`.contract` — the table of every verl symbol touched, and the guards; :mod:`.verl_version` — the supported
  verl versions;
* :mod:`.lora` — verl's LoRA adapters merged into full weights (the ``hf`` rollout backend and the export);
* :mod:`.cpu` — the ``cpu`` platform, the ``hf`` rollout backend and their shims (verl's pipeline on a CPU).

The plug-in entry point that verl imports, :mod:`verl_gigpo.plugin`, registers these.
"""
