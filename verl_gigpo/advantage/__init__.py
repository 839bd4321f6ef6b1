"""Step-credit advantage estimators: GiGPO and its successors HGPO, GraphGPO and G2PO. Pure maths (no verl, no I/O).

Every estimator takes one :class:`StepRows` (one row per environment step), its options dataclass and
:class:`CommonOptions`, and returns :class:`AdvantageTerms` (episode term, step term, advantage, diagnostics).
:data:`ESTIMATORS` registers the four; each ``<method>_advantage_terms`` is its arrays form. The maths:
docs/estimators.md; the interface and how to add one: docs/adding-an-estimator.md; the numbered deviations from the
authors' code: docs/estimators.md, "Deliberate deviations from the authors' code".
"""

from __future__ import annotations

from collections.abc import Callable

from verl_gigpo.advantage._inputs import EPISODE_STATS, NORMS, invalid_row_penalty
from verl_gigpo.advantage._rows import SIGNAL_ATOL, SIGNAL_RTOL, differs_in_groups, discounted_step_returns
from verl_gigpo.advantage.g2po import G2PO_STAT_NAMES, G2POOptions, check_g2po_options, g2po_advantage_terms, g2po_terms
from verl_gigpo.advantage.gigpo import (
    GiGPOOptions,
    check_estimator_options,
    compute_gigpo_advantage,
    gigpo_advantage_terms,
    gigpo_terms,
)
from verl_gigpo.advantage.graphgpo import (
    GRAPHGPO_STAT_NAMES,
    GraphGPOOptions,
    check_graphgpo_options,
    graphgpo_advantage_terms,
    graphgpo_terms,
)
from verl_gigpo.advantage.hgpo import HGPO_STAT_NAMES, HGPOOptions, check_hgpo_options, hgpo_advantage_terms, hgpo_terms
from verl_gigpo.advantage.interface import CommonOptions, EstimatorSpec, StepRows
from verl_gigpo.advantage.terms import STAT_NAMES, AdvantageTerms, GiGPOTerms

__all__ = [
    "EPISODE_STATS",
    "ESTIMATORS",
    "ESTIMATOR_TERMS",
    "G2PO_STAT_NAMES",
    "GRAPHGPO_STAT_NAMES",
    "HGPO_STAT_NAMES",
    "NEEDS_OUTCOME",
    "NORMS",
    "SIGNAL_ATOL",
    "SIGNAL_RTOL",
    "STAT_NAMES",
    "AdvantageTerms",
    "CommonOptions",
    "EstimatorSpec",
    "G2POOptions",
    "GiGPOOptions",
    "GiGPOTerms",
    "GraphGPOOptions",
    "HGPOOptions",
    "StepRows",
    "check_estimator_options",
    "check_g2po_options",
    "check_graphgpo_options",
    "check_hgpo_options",
    "compute_gigpo_advantage",
    "differs_in_groups",
    "discounted_step_returns",
    "g2po_advantage_terms",
    "g2po_terms",
    "gigpo_advantage_terms",
    "gigpo_terms",
    "graphgpo_advantage_terms",
    "graphgpo_terms",
    "hgpo_advantage_terms",
    "hgpo_terms",
    "invalid_row_penalty",
]

ESTIMATORS: dict[str, EstimatorSpec] = {
    "gigpo": EstimatorSpec(gigpo_terms, GiGPOOptions),
    "hgpo": EstimatorSpec(hgpo_terms, HGPOOptions),
    "graphgpo": EstimatorSpec(graphgpo_terms, GraphGPOOptions, needs_outcome=True),
    "g2po": EstimatorSpec(g2po_terms, G2POOptions, needs_outcome=True),
}
"""method name (``algorithm.adv_estimator``) -> ``estimator(rows, options, common)``, its options class, and whether it
reads the outcome (docs/adding-an-estimator.md)."""

ESTIMATOR_TERMS: dict[str, Callable[..., AdvantageTerms]] = {
    "gigpo": gigpo_advantage_terms,
    "hgpo": hgpo_advantage_terms,
    "graphgpo": graphgpo_advantage_terms,
    "g2po": g2po_advantage_terms,
}
"""method name -> its terms function in the arrays form (``f(step_rewards, ..., anchor_keys, **keywords)``)."""

NEEDS_OUTCOME = frozenset(name for name, spec in ESTIMATORS.items() if spec.needs_outcome)
"""The methods that also take ``won`` and ``action_valid`` per row."""
