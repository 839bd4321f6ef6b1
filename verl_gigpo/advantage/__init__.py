"""Step-credit advantage estimators: GiGPO and its successors HGPO, GraphGPO and G2PO. Pure maths.

No verl types, no I/O, no prints. Every estimator takes the same per-row inputs (one row per environment step:
step reward, episode group, trajectory id, step id, anchor key; GraphGPO and G2PO also the episode outcome and
G2PO the action validity), masks padding rows and rows of failed episodes out of every statistic, and returns the
same kind of terms, :class:`AdvantageTerms` (episode term, step term, the advantage, anchor groups, diagnostics),
so that metrics, credit records and the credit report work for all of them.

======== ============================= ===================================================================
method   function                      step credit (see each module for the maths)
======== ============================= ===================================================================
gigpo    :func:`gigpo_advantage_terms`    R_t normalised within the anchor group (same state, same task)
hgpo     :func:`hgpo_advantage_terms`     R_t normalised within groups keyed by the last 1..K+1 states, mixed
graphgpo :func:`graphgpo_advantage_terms` r_succ omega^d(next state) over the group's merged state graph
g2po     :func:`g2po_advantage_terms`     one-step TD of merged-state values V(next) - V(current)
======== ============================= ===================================================================

One interface (:mod:`.interface`, docs/adding-an-estimator.md): ``estimator(rows, options, common)`` takes a
:class:`StepRows`, the method's options dataclass and :class:`CommonOptions`; :data:`ESTIMATORS` registers the four,
and each ``<method>_advantage_terms`` is its arrays form. Modules: :mod:`.gigpo`, :mod:`.hgpo`, :mod:`.graphgpo`,
:mod:`.g2po` (one estimator each), :mod:`.terms` (what they return), :mod:`._rows` (the row helpers they share:
trajectory structure, anchor groups, returns, group statistics) and :mod:`._inputs` (option and input checks; ids
are read by :mod:`verl_gigpo.advantage._ids`).

Deliberate deviations from the authors' implementations, numbered once for all estimators. GiGPO: verl-agent's
``gigpo/core_gigpo.py`` and trainer (upstream langfengQ/verl-agent d0b9724; docs/fidelity.md names the snapshot read).
HGPO: ``recipe/hgpo/core_hgpo.py`` of a verl-agent fork (zzj1111/alfworldauto 37aec78: weights lines 195-205, nonzero
test 196, depths 241-248, population std 260; the earlier CazeroZ/hgpo ``hgpo/core_hgpo.py`` weighs by ``len(key) + 1``,
line 193). GraphGPO: ``recipe/GraphGPO/core_graph.py`` (distances 285-325, returns 823-825, advantage 841-),
``rollout_loop.py`` (SUCCESS, 288-292) and ``graphgpo_ray_trainer.py`` (returns 1148, penalty 225 and 1191) of the same
fork. G2PO: ``g2po/core_g2po.py`` (Nala-YN/G2PO b8ffaf5: node values 65-132, steps 135-213) and its
``verl/trainer/ppo/ray_trainer.py``.

GiGPO

1. Episode statistics over trajectories by default (``episode_stats="trajectory"``): each trajectory counts once
   in its group's mean and std, as in Eq. 3. The reference counts every step row, so long trajectories weigh
   more; that behaviour is available as ``episode_stats="step"``. (The same option serves every estimator.)
2. Padding and duplicate rows (``row_mask`` False) take part in no statistic and get advantage 0. The reference
   counts verl's padding rows (deep copies of real rows) in group statistics: its trainer pads the batch
   (``adjust_batch``, ``verl/trainer/ppo/ray_trainer.py`` line 1118) before the advantages (1221). G2PO's trainer
   does the same; the HGPO and GraphGPO trainers pad after their advantages (item 25).
3. Step returns are accumulated in step-id order, never in batch order: a shuffled batch gives the same R_t.
4. A group with a single member gets 0 at both levels, and so does an episode group whose returns are all equal
   (one trajectory of several steps). The reference's episode statistics run over step rows
   (``episode_norm_reward`` in ``gigpo/core_gigpo.py``: ``compute_mean_std_cross_steps=True`` by default, line
   180, called without it at 161), so its singleton is a group of one row, a lone trajectory of one step, and that
   row gets its raw episode return (mean 0, std 1, lines 225-227); a lone trajectory of several steps is a group
   of several equal values there. The successors' code does the same
   (items 15, 21, 25): HGPO's ``trajectory_advantages`` (``core_hgpo.py`` lines 129-131, called with step-row
   statistics at 169-177), GraphGPO through GiGPO's ``episode_norm_reward`` (``core_graph.py`` 897), G2PO's own
   ``episode_norm_reward`` (``core_g2po.py`` 44-46, called at 241).
5. The std is the unbiased one (N - 1), written out explicitly; the option names say what they do:
   ``norm="mean_std" | "mean"`` (the reference's ``mode="mean_norm"`` meant "do not divide by the std"). Statistics
   are float64, so equal returns give exactly 0 (the reference's float32 ones need not: docs/fidelity.md).
6. One reward signal by default: the episode return is the sum of the same step rewards that give R_t, and shaping
   (the invalid-action penalty) is part of r_t before discounting. The reference reads the episode score from a
   separate token-level reward tensor, and its trainer subtracts the penalty from the invalid row's own R_t and own
   episode score after discounting (``verl/trainer/ppo/ray_trainer.py`` lines 200-220, called at 1203-1207;
   ``agent_system/reward_manager/episode.py`` lines 72-79); the HGPO, GraphGPO and G2PO trainers do the same. That
   placement is available for every estimator as ``row_penalty`` (``env.invalid_action_penalty_mode=reference``,
   with ``episode_stats="step"``), and the paper recipes use it.
7. Vectorised: hash factorisation of the ids (O(N)), one O(N log N) sort by (trajectory, step id) and an
   O(N log T_max) segmented scan for R_t; no Python loop over rows and no O(N^2) ``np.where`` per group.
8. Group ids come from the ids passed in, never from positions (``i % n``) or ``uuid4`` inside the maths; the
   result depends only on ids and values, so permuting the batch permutes the output.
9. Diagnostics are returned as floats (:attr:`AdvantageTerms.stats`), never printed.
10. The second output is the discounted step return R_t (the reference returns the advantages twice).
11. Inputs are validated; bad input raises ``ValueError`` saying what is wrong and what to do.
12. Similarity grouping of free-text anchors (see :mod:`verl_gigpo.advantage.anchors`) is order-independent connected
    components of a documented similarity, not greedy first-fit clustering against a cluster representative. It is
    an option of the estimator itself (``similarity_threshold``), which
    :meth:`verl_gigpo.config.GiGPOConfig.advantage_terms` sets for ``key_mode="similarity"`` in every caller (and
    for every estimator: GraphGPO's code has its own optional merging, greedy first-fit with difflib's ratio 0.95).
    The reference's grouping is an option, ``GiGPOConfig.similarity_grouping="difflib_first_fit"`` (order-dependent;
    the search recipe uses it).

HGPO

13. Depth k weighs k^alpha, the paper's (j + 1)^alpha over history lengths j = k - 1 (``weight_base="depth"``);
    the recipe's ``L = k + 1`` weighs (k + 1)^alpha, available as ``weight_base="depth_plus_one"`` (the earlier
    CazeroZ/hgpo code weighs like the paper). The weights are normalised exactly (the recipe adds epsilon to
    their sum).
14. Group statistics use the unbiased std, as GiGPO here; the authors' population std is ``std="population"``.
15. No episode term by default (the paper); ``episode_term=True`` is the recipe's ``base_group`` (A^E joins the
    mix with weight 1^alpha = 1 when it is nonzero; off by default there too, line 157 and
    ``config/hgpo_trainer.yaml`` line 25), with this package's A^E (deviations 1 and 4; the recipe uses GiGPO's
    step-row statistics, line 176).
16. History keys follow step ids within a trajectory (the code takes a trajectory's rows in batch order).
17. Depth k is in V when R_t is not the mean of its group C_k, and the episode item joins when the episode return is
    not its group's mean: x counts as the mean when |x - mean| <= 1e-12 * max(1, |mean|), decided on x and the mean
    before any division, as exact arithmetic would (``norm="mean"`` and ``"mean_std"`` alike). The recipe keeps an
    item whose float32 advantage is nonzero (``advs != 0``, line 196; the episode item too, 278-280), so a row at
    its group's mean counts or not by rounding, and when it counts its remainder takes full weight and pulls the mix
    toward 0 (R_t = 0.2, 0.3, 0.4 in one group: the recipe's 0.3 gets a_k = 3.6e-7; in float64, a_k != 0 gives
    -0.1633 instead of -0.4899 on the case of ``test_hgpo_depths_by_the_exact_rule``).

GraphGPO

18. The distance decay omega is its own option (``algorithm.graphgpo.omega``); the authors' scripts pass it as
    ``algorithm.gamma`` (0.10 ALFWorld, 0.20 WebShop), which here keeps meaning the discount of R_t.
19. The last step of a lost or truncated trajectory leads to a dead end (d_max + 1, as the issue's equations have
    it); the code links it to the observation the environment returned after that step, which can be a state of
    another trajectory. Step rows carry no observation after the last step.
20. R_G has no invalid-action term by default; the code's trainer subtracts the environment's penalty (0.1) from
    the invalid row's own R_G and its own episode score through ``apply_invalid_action_penalty`` (item 6): that is
    ``row_penalty`` (``env.invalid_action_penalty_mode=reference``, which the paper recipes use);
    ``invalid_penalty`` subtracts a penalty from R_G alone. ``progress=True`` is the code's
    ``normalize_distance`` (off by default there too: ``config/graphgpo_trainer.yaml`` line 29, trainer 1152).
21. A group with no win gets A_G = 0 whatever the penalty; SUCCESS comes from the ``won`` flag (the code: the
    episode reward > 0); next states follow step ids (the code reads ``next_obs`` per row and picks each
    trajectory's first step by batch position); the episode term is this package's A^E (deviations 1 and 4; the
    code calls GiGPO's ``episode_norm_reward``, ``core_graph.py`` line 897).

G2PO

22. The discount of the node values is ``algorithm.gamma`` (the code hard-codes 0.95, the value its scripts set
    for ``algorithm.gamma``) and c is ``algorithm.g2po.invalid_penalty`` (the code uses its function default 0.1).
23. A trajectory's outcome R_tau is ``success_reward`` if ``won`` (the code: its episode reward, and a success is
    an episode reward equal to 10).
24. Positions t and next states follow step ids (the code takes a trajectory's rows in batch order).
25. A_2 of an episode group with a single valid row is 0 (the code's std of one value is NaN); the episode term
    is this package's A^E (deviations 1 and 4; the code's ``episode_norm_reward``, ``core_g2po.py`` lines 9-62).
    Padding copies count in nothing (deviation 2). The code's trainer pads with copies of random rows before its
    advantages (``adjust_batch``, ``ray_trainer.py`` line 1122; advantages at 1220), so there the copies count in
    A^E, A_1 and A_2, though not in the node values (computed before the padding, 1117); the HGPO and GraphGPO
    trainers pad after (``hgpo_ray_trainer.py`` advantages 1199, padding 1219; ``graphgpo_ray_trainer.py`` 1207,
    1224), so their copies count in no statistic.
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
