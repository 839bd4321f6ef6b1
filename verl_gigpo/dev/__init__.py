"""Development tools, off the runtime import path (training never imports them):

* :mod:`.tiny_model` — ``python -m verl_gigpo.dev.tiny_model --out DIR``: the tiny local models of the tests, the
  demo and the CPU smoke runs, with :mod:`.imitation` (a few imitation steps towards an expert's actions);
* :mod:`.demo` — ``make demo`` (``python -m verl_gigpo.dev.demo``): the CPU demo, a command that builds its tiny model;
* :mod:`.smoke` — ``python -m verl_gigpo.dev.smoke``: launches of verl's pipeline on a CPU, checked from their files;
* :mod:`.timeline` — start-up timestamps of a verl launch, installed only when ``GIGPO_TIMELINE`` names a file.
"""
