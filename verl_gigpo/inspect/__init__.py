"""See what the step-credit estimator (GiGPO, HGPO, GraphGPO, G2PO) credited: a report on the per-step credit
records of a run (:mod:`verl_gigpo.credit`).

    python -m verl_gigpo.inspect RUN_DIR_OR_FILE [--iter K] [--group ID] [--out DIR] [--compare OTHER_RUN]
        [--methods gigpo,hgpo,graphgpo,g2po] [--gamma G]

writes, into ``--out`` (default: ``<run dir>/credit/report/``):

* ``credit_graph_iter<K>_group<ID>.png``: the anchor-state graph of one episode group (:mod:`.graph`), its edges
  coloured by the step term of the method that ran (GraphGPO's nodes show their distance to a win, G2PO's their
  value);
* with ``--compare OTHER_RUN``, ``credit_compare_iter<K>_group<ID>.png``: the same group's graph in both runs, side by
  side on one colour scale;
* with ``--methods``, ``credit_methods_iter<K>_group<ID>.png``: the drawn group's rows credited again by each method
  named (:func:`.recredit.recredit`), two per row on one colour scale;
* ``credit_distributions.png``: anchor-group sizes, rows in singleton anchor groups per iteration, A_E vs A_S,
  how often the two terms disagree in sign (:func:`.report.plot_distributions`);
* ``credit_summary.txt`` (also printed) and ``credit_report.html``, one self-contained page with all of it.

Records come from a run with ``trainer.credit_log_freq > 0`` on either engine.
"""

from verl_gigpo.inspect.graph import anchor_graph, credit_colour, draw_anchor_graph, draw_side_by_side
from verl_gigpo.inspect.load import CreditReportError, CreditRun, load_credit_run
from verl_gigpo.inspect.recredit import recredit
from verl_gigpo.inspect.report import CreditReport, default_group, make_report, plot_distributions
from verl_gigpo.inspect.stats import PairCredit, RunStats, credit_pairs, run_stats, summary_text, top_pairs

__all__ = [
    "CreditReport",
    "CreditReportError",
    "CreditRun",
    "PairCredit",
    "RunStats",
    "anchor_graph",
    "credit_colour",
    "credit_pairs",
    "default_group",
    "draw_anchor_graph",
    "draw_side_by_side",
    "load_credit_run",
    "make_report",
    "recredit",
    "plot_distributions",
    "run_stats",
    "summary_text",
    "top_pairs",
]
