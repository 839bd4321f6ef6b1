"""The credit report (python -m verl_gigpo.inspect), CPU-only: the anchor-state graph of a hand-built group has the
expected nodes, edges and colours (the data behind the picture, not pixels); the report and the CLI work on real
record files and give clear errors for a missing file, an unknown iteration or group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb

from verl_gigpo.advantage import ESTIMATOR_TERMS, NEEDS_OUTCOME
from verl_gigpo.credit.graph import CMAP, INVALID, NOT_WON, WON, anchor_graph, credit_colour
from verl_gigpo.credit.load import CreditReportError, CreditRun, load_credit_run
from verl_gigpo.credit.records import credit_records, write_credit_records
from verl_gigpo.credit.report import make_report
from verl_gigpo.credit.stats import credit_pairs, run_stats, top_pairs
from verl_gigpo.inspect.__main__ import main
from verl_gigpo.rollout.step_rows import StepBatch

# One episode group, gridnav-like, gamma = 1, mean_std:
#   a: s0 -right-> s1 -down-> goal (won, rewards 0, 1)
#   c: the same as a
#   b: s0 -left-> s0 (a wall: same state) -right-> s1 -up-> s2 -(reply with no action)-> step limit (not won;
#      rewards 0, 0, 0, -0.1)
# R_t: a, c: 1, 1; b: -0.1 on every step. Anchor groups: s0 = {a0, c0, b0, b1} (R_t 1, 1, -0.1, -0.1: A_S = +-0.866),
# s1 = {a1, c1, b2} (1, 1, -0.1: A_S = 0.577, 0.577, -1.155), s2 = {b3} (singleton: A_S = 0).
GROUP = [  # (traj, step, state, action, valid, reward, won)
    ("a", 0, "s0", "right", True, 0.0, True),
    ("a", 1, "s1", "down", True, 1.0, True),
    ("b", 0, "s0", "left", True, 0.0, False),
    ("b", 1, "s0", "right", True, 0.0, False),
    ("b", 2, "s1", "up", True, 0.0, False),
    ("b", 3, "s2", "fly away", False, -0.1, False),
    ("c", 0, "s0", "right", True, 0.0, True),
    ("c", 1, "s1", "down", True, 1.0, True),
]


def _records(rows=GROUP, *, iteration=3, group="g0", gamma=1.0, method="gigpo"):
    """Credit records of ``rows`` built from the real estimator's terms (GiGPO's unless ``method`` says otherwise),
    as the engines build them."""
    n = len(rows)
    trajs = [r[0] for r in rows]
    steps = [r[1] for r in rows]
    keys = [r[2] for r in rows]
    rewards = [r[5] for r in rows]
    groups = [group] * n
    outcome = {"won": np.array([r[6] for r in rows]), "action_valid": np.array([r[4] for r in rows])}
    terms = ESTIMATOR_TERMS[method](
        torch.tensor(rewards, dtype=torch.float64),
        torch.ones(n, 1),
        groups,
        trajs,
        steps,
        keys,
        gamma=gamma,
        **(outcome if method in NEEDS_OUTCOME else {}),
    )
    steps_batch = StepBatch(
        group_ids=np.array(groups, dtype=object),
        traj_ids=np.array(trajs, dtype=object),
        step_ids=np.array(steps, dtype=np.int64),
        anchor_keys=np.array(keys, dtype=object),
        step_rewards=np.array(rewards, dtype=np.float64),
        action_valid=outcome["action_valid"],
        won=outcome["won"],
        env_error=np.zeros(n, dtype=bool),
        task_types=np.full(n, "goal", dtype=object),
        history_dropped=np.zeros(n, dtype=np.int64),
        row_mask=np.ones(n, dtype=bool),
        task_ids=np.full(n, "task-1", dtype=object),
        observations=np.array([f"you are in {k}" for k in keys], dtype=object),
        actions=np.array([r[3] for r in rows], dtype=object),
    )
    return credit_records(terms, iteration=iteration, steps=steps_batch)


def test_graph_of_a_hand_built_group_has_the_expected_nodes_edges_and_colours():
    records = _records()
    graph = anchor_graph(records)
    s0, s1, s2 = (records[i]["anchor_group"] for i in (0, 1, 5))  # the estimator's anchor group ids
    assert set(graph.nodes) == {s0, s1, s2, WON, NOT_WON}
    nodes = graph.nodes
    assert [nodes[s]["visits"] for s in (s0, s1, s2, WON, NOT_WON)] == [4, 3, 1, 2, 1]
    assert [s for s in graph if nodes[s]["start"]] == [s0]
    assert [nodes[s]["depth"] for s in (s0, s1, s2, WON, NOT_WON)] == [0, 1, 3, 4, 4]
    assert nodes[WON]["terminal"] and nodes[WON]["won"] and not nodes[NOT_WON]["won"]
    assert nodes[s0]["label"] == "you are in s0"

    edges = {(u, v, k): d for u, v, k, d in graph.edges(keys=True, data=True)}
    expected = {  # (from, to, action): (times taken, mean A_S), the values written out by hand
        (s0, s1, "right"): (3, (0.866 + 0.866 - 0.866) / 3),
        (s0, s0, "left"): (1, -0.866),  # a self-loop: the move kept the state
        (s1, WON, "down"): (2, 0.577),
        (s1, s2, "up"): (1, -1.155),
        (s2, NOT_WON, INVALID): (1, 0.0),  # a reply with no valid action: one edge per state, whatever the text
    }
    assert set(edges) == set(expected)
    for edge, (count, mean) in expected.items():
        assert edges[edge]["count"] == count, edge
        assert edges[edge]["step_adv_mean"] == pytest.approx(mean, abs=1e-3), edge
    assert graph.graph["vmax"] == pytest.approx(1.155, abs=1e-3)  # symmetric scale: the largest |mean|
    # colours: the most blamed edge is the map's low end (red), the singleton's edge its middle (grey), credited
    # edges blue; each is the map's colour of its mean
    assert edges[(s1, s2, "up")]["color"] == to_hex(colormaps[CMAP](0.0))
    assert edges[(s2, NOT_WON, INVALID)]["color"] == to_hex(colormaps[CMAP](0.5))
    for edge, data in edges.items():
        assert data["color"] == credit_colour(data["step_adv_mean"], graph.graph["vmax"]), edge
        red, _, blue = to_rgb(data["color"])
        if data["step_adv_mean"] > 0.01:
            assert blue > red, edge
        elif data["step_adv_mean"] < -0.01:
            assert red > blue, edge
    assert edges[(s0, s1, "right")]["width"] == max(d["width"] for d in edges.values())  # taken most often
    assert (graph.graph["trajectories"], graph.graph["won_trajectories"]) == (3, 2)


# a: s0 -left-> s0, s0 -up-> s0 (two walls), s0 -right-> s1 -down-> goal (won); b: s0 -right-> s1 -right-> limit
LOOPS = [
    ("a", 0, "s0", "left", True, 0.0, True),
    ("a", 1, "s0", "up", True, 0.0, True),
    ("a", 2, "s0", "right", True, 0.0, True),
    ("a", 3, "s1", "down", True, 1.0, True),
    ("b", 0, "s0", "right", True, 0.0, False),
    ("b", 1, "s1", "right", True, 0.0, False),
]


def _box(text, renderer):
    return text.get_window_extent(renderer)


def test_a_states_loops_get_one_label_under_it_apart_from_its_own_label():
    """The loops' labels used to be drawn at each loop, over the state's label and over each other."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from verl_gigpo.credit.graph import anchor_graph_figure, loop_labels

    records = _records(LOOPS)
    graph = anchor_graph(records)
    s0 = records[0]["anchor_group"]
    assert loop_labels(graph) == {s0: "stay: left (1), up (1)"}
    fig = anchor_graph_figure(graph)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    texts = {t.get_text(): t for t in fig.axes[0].texts}
    assert "left (1)" not in texts and "up (1)" not in texts  # no label at the loops themselves
    assert {"right (2)", "down (1)", "right (1)"} <= set(texts)  # the moves keep theirs
    stay, own = _box(texts["stay: left (1), up (1)"], renderer), _box(texts["you are in s0"], renderer)
    assert not stay.overlaps(own) and stay.y1 < own.y0  # under the state's label
    others = [_box(t, renderer) for name, t in texts.items() if name != "stay: left (1), up (1)"]
    assert not any(stay.overlaps(box) for box in others)


def test_graph_wants_one_group_of_one_iteration():
    with pytest.raises(ValueError, match="got none"):
        anchor_graph([])
    with pytest.raises(ValueError, match="ONE episode group"):
        anchor_graph(_records(group="g0") + _records(group="g1"))
    with pytest.raises(ValueError, match=r"one method.*\['gigpo', 'graphgpo'\]"):
        anchor_graph(_records() + _records(method="graphgpo"))


def test_graph_shows_each_methods_step_term_and_node_values():
    # GraphGPO on GROUP: s1 -> SUCCESS (a, c won), so d(s1) = 1, d(s0) = 2 (s0 -> s1); s2 leads only to b's dead
    # end: unreachable, d = d_max + 1 = 3. Edge colours are the method's step term, A_G here.
    records = _records(method="graphgpo")
    graph = anchor_graph(records)
    s0, s1, s2 = (records[i]["anchor_group"] for i in (0, 1, 5))
    assert graph.graph["method"] == "graphgpo"
    assert [graph.nodes[s]["value"] for s in (s0, s1, s2)] == [2.0, 1.0, 3.0]
    assert graph.nodes[s0]["label"] == "you are in s0\nd=2"
    right = [d for u, v, k, d in graph.edges(keys=True, data=True) if (u, v, k) == (s0, s1, "right")][0]
    assert right["step_adv_mean"] == pytest.approx(np.mean([r["step_adv"] for r in records if r["action"] == "right"]))
    # G2PO: the node value V(s) (gamma 1: the share of won visits, R_tau = 10)
    g2po = anchor_graph(_records(method="g2po"))
    assert graph.nodes[s0]["label"].startswith("you are in s0")
    assert g2po.nodes[s0]["value"] == pytest.approx(10 * 2 / 4) and g2po.nodes[s0]["label"].endswith("V=5")
    # GiGPO's and HGPO's nodes carry no value
    assert "value" not in anchor_graph(_records(method="hgpo")).nodes[s0]


def test_run_statistics_and_top_pairs():
    records = _records()
    # a second iteration whose group has all-distinct states: every row is a singleton (A_S = 0)
    distinct = [(t, s, f"{t}{s}", a, v, r, w) for t, s, _, a, v, r, w in GROUP]
    run = CreditRun(source=Path("memory"), records={3: records, 4: _records(distinct, iteration=4)})
    stats = run_stats(run)
    assert stats.rows == 16 and stats.episode_groups == 2 and stats.anchor_groups == 3 + 8
    assert stats.flat_episode_groups == 0  # both groups have a won and a lost trajectory
    assert sorted(stats.anchor_group_sizes.tolist()) == [1] * 9 + [3, 4]
    assert stats.singleton_row_frac == {3: 1 / 8, 4: 1.0}
    # iteration 3: A_E = +0.577 for a and c (won), -1.155 for b; every row but b3 (A_S = 0) has both terms nonzero,
    # and each has the sign of its trajectory's A_E (a, c only beat b; b's steps only lose), so none disagree
    a_e = {r["traj"]: r["episode_adv"] for r in records}
    assert a_e["a"] == pytest.approx(0.577, abs=1e-3) and a_e["b"] == pytest.approx(-1.155, abs=1e-3)
    assert stats.both_nonzero_frac[3] == 7 / 8
    assert stats.disagree_frac[3] == 0.0
    assert np.isnan(stats.disagree_frac[4])  # no row has a step term
    best = top_pairs(credit_pairs(records), 2)
    assert [(p.action, p.count) for p in best] == [("down", 2), ("right", 3)]
    worst = top_pairs(credit_pairs(records), 5, credited=False)
    assert [p.action for p in worst] == ["up", "left"]  # the singleton's invalid reply (A_S = 0) is neither
    assert worst[0].step_adv_mean == pytest.approx(-1.155, abs=1e-3)


def test_the_terms_can_disagree_in_sign():
    # gamma = 0.5: w won after a detour from s0 (R_t 0.25 there), x won directly (0.5), l lost (0)
    rows = [
        ("w", 0, "s0", "left", True, 0.0, True),
        ("w", 1, "s0", "right", True, 0.0, True),
        ("w", 2, "s1", "down", True, 1.0, True),
        ("x", 0, "s0", "right", True, 0.0, True),
        ("x", 1, "s1", "down", True, 1.0, True),
        ("l", 0, "s0", "up", True, 0.0, False),
        ("l", 1, "s3", "up", True, 0.0, False),
    ]
    records = _records(rows, iteration=1, gamma=0.5)
    stats = run_stats(CreditRun(source=Path("memory"), records={1: records}))
    # w0 (the detour from s0): A_E > 0 (won) but A_S < 0 (below the mean 0.3125 of s0's R_t) -> they disagree
    w0 = records[0]
    assert w0["episode_adv"] > 0 > w0["step_adv"]
    assert 0 < stats.disagree_frac[1] < 1


def _write_run(run_dir):
    write_credit_records(_records(iteration=3), run_dir, 3)
    write_credit_records(_records(iteration=6, group="g7") + _records(iteration=6, group="g8"), run_dir, 6)
    return run_dir


def test_report_writes_pngs_and_a_self_contained_page(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    report = make_report(run_dir)
    assert report.iteration == 6 and report.group == "g7"  # last iteration; equal signal: the first group
    out = run_dir / "credit" / "report"
    for path in (report.graph_png, report.distributions_png):
        assert path.parent == out and path.read_bytes()[:4] == b"\x89PNG"
    assert report.graph_png.name == "credit_graph_iter6_groupg7.png"
    page = report.html.read_text()
    assert page.count('src="data:image/png;base64,') == 2 and "http" not in page.split("<body>")[1]
    assert "right (+0.87)" in page  # the group's trajectories with each action's A_S
    assert report.summary_txt.read_text().strip() == report.summary
    assert "2 logged iteration(s) (3, 6); 24 step rows of 3 episode group(s)" in report.summary
    assert "all have the same return (A_E = 0, only the step term teaches): 0 of 3" in report.summary
    chosen = make_report(run_dir / "credit" / "iter_3.jsonl", group="g0", out_dir=tmp_path / "one")
    assert (chosen.iteration, chosen.group) == (3, "g0") and chosen.html.parent == tmp_path / "one"


def test_cli_prints_the_summary_and_the_files(tmp_path, capsys):
    run_dir = _write_run(tmp_path / "run")
    assert main([str(run_dir), "--iter", "3", "--group", "g0", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "top-credited (state, action) pairs" in out and "'you are in s1' -> 'down'" in out
    assert "graph: iteration 3, episode group g0 (task task-1): 3 trajectories, 2 won; 3 anchor states" in out
    assert f"report: {tmp_path / 'rep' / 'credit_report.html'}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing"], "does not exist"),
        (["empty"], "no credit records in"),
        (["run", "--group", "nope"], "episode group 'nope' is not in the credit records of iteration 6"),
        (["run", "--iter", "5"], "iteration 5 has no credit records"),
    ],
)
def test_cli_errors_say_what_is_wrong(tmp_path, capsys, args, message):
    _write_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / args[0]), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    if "--group" in args:
        assert "groups there: g7, g8" in err
    if "--iter" in args:
        assert "logged iterations: 3, 6" in err


def test_a_file_that_is_not_credit_records_is_refused(tmp_path):
    bad = tmp_path / "credit" / "iter_1.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"iteration": 1}\n')
    with pytest.raises(CreditReportError, match="is not a credit record"):
        load_credit_run(tmp_path)


def test_report_puts_two_runs_credit_for_the_same_group_side_by_side(tmp_path, capsys):
    """The same episodes credited by GiGPO (run a) and GraphGPO (run b): one picture, one colour scale."""
    write_credit_records(_records(iteration=1), tmp_path / "a", 1)
    write_credit_records(_records(iteration=1, method="graphgpo"), tmp_path / "b", 1)
    report = make_report(tmp_path / "a", compare=tmp_path / "b", out_dir=tmp_path / "rep")
    assert report.compare_png == tmp_path / "rep" / "credit_compare_iter1_groupg0.png"
    assert report.compare_png.read_bytes()[:4] == b"\x89PNG"
    page = report.html.read_text()
    assert page.count('src="data:image/png;base64,') == 3 and "Beside the other run" in page
    assert f"compared with {tmp_path / 'b'}" in report.summary
    assert main([str(tmp_path / "b"), "--compare", str(tmp_path / "a"), "--out", str(tmp_path / "rep2")]) == 0
    out = capsys.readouterr().out
    assert f"side by side: {tmp_path / 'rep2' / 'credit_compare_iter1_groupg0.png'}" in out
    assert "What graphgpo credited" in (tmp_path / "rep2" / "credit_report.html").read_text()
    write_credit_records(_records(iteration=1, group="g9"), tmp_path / "c", 1)
    with pytest.raises(CreditReportError, match=r"episode group 'g0' .*iteration 1"):
        make_report(tmp_path / "a", compare=tmp_path / "c", out_dir=tmp_path / "rep3")


def test_recredit_gives_each_method_its_own_terms_on_the_same_rows():
    from verl_gigpo.credit.recredit import recredit

    gigpo = _records()  # gamma 1
    for method in ("gigpo", "hgpo", "graphgpo", "g2po"):
        again = recredit(gigpo, method, gamma=1.0)
        direct = _records(method=method)  # the estimator on the raw keys, as an engine writes its records
        assert [r["method"] for r in again] == [method] * len(gigpo)
        for key in ("step_adv", "episode_adv", "advantage", "anchor_group_size", "observation", "anchor_key"):
            assert [r[key] for r in again] == pytest.approx([r[key] for r in direct]), (method, key)
    with pytest.raises(ValueError, match=r"method='ppo' is not a step-credit estimator"):
        recredit(gigpo, "ppo")


def test_cli_credits_one_group_by_every_method(tmp_path, capsys):
    write_credit_records(_records(iteration=1), tmp_path / "a", 1)
    args = [str(tmp_path / "a"), "--out", str(tmp_path / "rep"), "--gamma", "1"]
    assert main([*args, "--methods", "gigpo,hgpo,graphgpo,g2po"]) == 0
    png = tmp_path / "rep" / "credit_methods_iter1_groupg0.png"
    assert f"every method: {png}" in capsys.readouterr().out and png.read_bytes()[:4] == b"\x89PNG"
    assert "The same rows credited by each method" in (tmp_path / "rep" / "credit_report.html").read_text()
    with pytest.raises(SystemExit) as exit_code:
        main([*args, "--methods", "gigpo,ppo"])
    assert exit_code.value.code == 2 and "['ppo'] are not step-credit estimators" in capsys.readouterr().err
