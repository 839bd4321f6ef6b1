"""The command ``python -m verl_gigpo.inspect RUN_DIR_OR_FILE [--iter K] [--group ID] [--out DIR]
[--compare OTHER_RUN] [--methods gigpo,hgpo,graphgpo,g2po] [--gamma G]``: a report on the per-step credit records of
a run (docs/credit-report.md).

The report's code lives in :mod:`verl_gigpo.credit` (records, loading, statistics, graphs, the page); this package
holds only the command line (:mod:`verl_gigpo.inspect.__main__`).
"""
