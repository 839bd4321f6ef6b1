"""The command ``python -m verl_gigpo.inspect RUN_DIR_OR_FILE [--iter K] [--group ID] [--out DIR] ...``: a report on
the per-step credit records of a run (docs/credit-report.md); the report's code lives in :mod:`verl_gigpo.credit`.
"""
