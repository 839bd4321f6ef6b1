"""What the step-credit estimator (GiGPO, HGPO, GraphGPO, G2PO) credited: the per-step records both engines write,
and the report on them.

* :mod:`verl_gigpo.credit.records` — the records (``<run dir>/credit/iter_<k>.jsonl``, ``trainer.credit_log_freq``);
  the only part the engines import;
* the report, ``python -m verl_gigpo.inspect RUN`` (docs/credit-report.md): :mod:`.load` reads a run's records,
  :mod:`.stats` summarises them, :mod:`.graph` draws one group's anchor-state graph, :mod:`.recredit` credits its
  rows again with every method, :mod:`.report` writes the page. These import matplotlib; import them by module.
"""
