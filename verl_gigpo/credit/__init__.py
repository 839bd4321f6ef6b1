"""What the step-credit estimator credited: the per-step records both engines write (:mod:`.records`, the only part
the engines import) and the report on them, ``python -m verl_gigpo.inspect RUN`` (docs/credit-report.md; its modules
import matplotlib, so import them by module).
"""
