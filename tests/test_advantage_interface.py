"""The one estimator interface (CPU-only): ``estimator(rows, options, common)``, the arrays forms over it, the public
API that docs/adding-an-estimator.md lists, that page's example estimator, and the step-row schema of both engines."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import verl_gigpo.advantage as adv
from verl_gigpo.advantage import ESTIMATOR_TERMS, ESTIMATORS, CommonOptions, GiGPOOptions, StepRows
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.rollout.rows import REQUIRED_FIELDS, ROW_FIELDS, episode_rows, schema_table
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.types import Episode, StepRecord, TaskSpec

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "adding-an-estimator.md"
FENCE = re.compile(r"^ *```python\n(.*?)^ *```", re.MULTILINE | re.DOTALL)


def _batch(seed: int) -> StepRows:
    """Random step rows: 3 groups of 3 trajectories of 1-5 steps over 3 states, shuffled, some rows masked."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(3):
        for k in range(3):
            won = bool(rng.random() < 0.5)
            for s in range(int(rng.integers(1, 6))):
                key, reward, valid = f"s{rng.integers(0, 3)}", float(rng.normal()), bool(rng.random() < 0.8)
                rows.append((f"g{g}", f"g{g}t{k}", s, key, reward, won, valid))
    rows = [rows[i] for i in rng.permutation(len(rows))]
    columns = list(zip(*rows, strict=True))
    g, t, a = (np.array(columns[i], dtype=object) for i in (0, 1, 3))
    s, r, w, v = (np.array(columns[i]) for i in (2, 4, 5, 6))
    n = len(rows)
    mask = rng.random(n) < 0.9
    return StepRows(r.astype(np.float64), torch.ones(n, 2), g, t, s, a, row_mask=mask, won=w, action_valid=v)


OPTIONS = {
    "gigpo": {"step_advantage_w": 0.5},
    "hgpo": {"history_length": 1, "alpha": 0.5, "weight_base": "depth_plus_one", "std": "population"},
    "graphgpo": {"omega": 0.2, "progress": True, "invalid_penalty": 0.1},
    "g2po": {"invalid_penalty": 0.3, "success_reward": 5.0},
}


@pytest.mark.parametrize("method", list(ESTIMATORS))
def test_the_arrays_form_routes_every_keyword_to_the_interface(method):
    """``f(arrays..., **keywords)`` equals ``estimator(StepRows, Options, CommonOptions)`` built by hand, with
    non-default options on every side (a keyword sent to the wrong object would change the numbers)."""
    spec = ESTIMATORS[method]
    common = {"gamma": 0.7, "norm": "mean", "epsilon": 1e-3, "episode_stats": "step"}
    for seed in range(5):
        batch = _batch(seed)
        want = spec.terms(batch, spec.options(**OPTIONS[method]), CommonOptions(**common))
        inputs = [getattr(batch, f.name) for f in dataclasses.fields(StepRows)[:6]]
        outcome = {"won": batch.won, "action_valid": batch.action_valid} if spec.needs_outcome else {}
        got = ESTIMATOR_TERMS[method](*inputs, row_mask=batch.row_mask, **outcome, **common, **OPTIONS[method])
        for name in ("advantage", "episode_adv", "step_adv", "step_return", "anchor_group"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        default = spec.terms(batch, spec.options(), CommonOptions())
        assert not np.array_equal(default.advantage, want.advantage)  # the options reached the maths


def test_the_arrays_form_refuses_what_its_signature_lacks():
    batch = _batch(0)
    inputs = [getattr(batch, f.name) for f in dataclasses.fields(StepRows)[:6]]
    with pytest.raises(TypeError, match="omgea"):
        adv.graphgpo_advantage_terms(*inputs, won=batch.won, omgea=0.1)
    with pytest.raises(TypeError, match="won"):  # GiGPO reads no outcome
        adv.gigpo_advantage_terms(*inputs, won=batch.won)
    with pytest.raises(TypeError):
        adv.gigpo_advantage_terms(*inputs[:5])


def test_options_are_checked_at_construction_naming_the_key():
    with pytest.raises(ValueError, match=r"gamma=1\.5"):
        CommonOptions(gamma=1.5)
    with pytest.raises(ValueError, match="similarity_threshold"):
        CommonOptions(similarity_threshold=0.0)
    with pytest.raises(ValueError, match="step_advantage_w=-1"):
        GiGPOOptions(step_advantage_w=-1)
    assert CommonOptions(gamma=1).gamma == 1.0 and isinstance(CommonOptions(gamma=1).gamma, float)


def test_the_config_entry_is_the_registered_estimator():
    """``GiGPOConfig.estimate`` runs ``ESTIMATORS[method]`` with the config's options, and ``StepBatch`` hands it the
    rows (float64 rewards) through ``estimator_rows``."""
    batch = _batch(3)
    cfg = GiGPOConfig(method="hgpo", gamma=0.9, key_mode="state")
    want = ESTIMATORS["hgpo"].terms(batch, cfg.hgpo, CommonOptions(gamma=0.9))
    np.testing.assert_array_equal(cfg.estimate(batch).advantage, want.advantage)
    steps = StepBatch(
        group_ids=batch.group_ids,
        traj_ids=batch.traj_ids,
        step_ids=batch.step_ids,
        anchor_keys=batch.anchor_keys,
        step_rewards=batch.step_rewards,
        action_valid=batch.action_valid.astype(bool),
        won=batch.won.astype(bool),
        env_error=np.zeros(len(batch.step_rewards), dtype=bool),
        task_types=np.full(len(batch.step_rewards), None, dtype=object),
        history_dropped=np.zeros(len(batch.step_rewards), dtype=np.int64),
        row_mask=batch.row_mask,
    )
    rows = steps.estimator_rows()
    assert rows.step_rewards.dtype == np.float64 and tuple(rows.response_mask.shape) == (len(steps), 1)
    np.testing.assert_array_equal(steps.advantage_terms(cfg).advantage, want.advantage)


# ---------------------------------------------------------------------------------------------------- the docs page
def _documented(marker: str) -> list[str]:
    text = PAGE.read_text()
    block = text.split(f"<!-- {marker}: begin -->")[1].split(f"<!-- {marker}: end -->")[0]
    return re.findall(r"^- `(.+)`$", block, re.MULTILINE)


def test_the_documented_public_api_matches_the_code():
    """Every function the page lists exists with that signature, and every public function is listed."""
    listed = _documented("api")
    have = {
        f"{name}{inspect.signature(getattr(adv, name))}"
        for name in adv.__all__
        if inspect.isfunction(getattr(adv, name))
    }
    assert set(listed) == have


def test_the_documented_verl_estimators_match_the_registered_ones():
    from verl_gigpo.plugin import ADV_ESTIMATORS

    listed = _documented("verl")
    assert listed == [f"{f.__name__}{inspect.signature(f)}" for f in ADV_ESTIMATORS.values()]
    assert list(ADV_ESTIMATORS) == list(ESTIMATORS)


def test_the_pages_example_estimator_runs_and_reduces_to_gigpo(monkeypatch):
    """The example on the page, executed as printed: with every row in one anchor state its step term is GiGPO's,
    and with w = 0 its advantage is the episode term."""
    (source,) = [block for block in FENCE.findall(PAGE.read_text()) if "def stepgrpo_terms" in block]
    module = types.ModuleType("stepgrpo")
    monkeypatch.setitem(sys.modules, "stepgrpo", module)  # dataclasses look their module up
    code = compile(inspect.cleandoc(source), "stepgrpo.py", "exec", dont_inherit=True)  # not this file's __future__
    exec(code, module.__dict__)  # noqa: S102 - the docs' own code
    batch = dataclasses.replace(_batch(1), anchor_keys=np.full(len(_batch(1).step_rewards), "same", dtype=object))
    common = CommonOptions(gamma=0.8)
    terms = module.stepgrpo_terms(batch, module.StepGRPOOptions(), common)
    gigpo = adv.gigpo_terms(batch, GiGPOOptions(), common)
    np.testing.assert_allclose(terms.step_adv, gigpo.step_adv, rtol=0, atol=1e-12)
    assert terms.method == "stepgrpo" and np.abs(terms.step_adv).max() > 0.1
    flat = module.stepgrpo_terms(batch, module.StepGRPOOptions(step_advantage_w=0.0), common)
    np.testing.assert_array_equal(flat.advantage, gigpo.episode_adv)
    with pytest.raises(ValueError, match="step_advantage_w=-2"):
        module.StepGRPOOptions(step_advantage_w=-2)


# ---------------------------------------------------------------------------------------------------- the row schema
def test_the_docs_table_is_the_schema():
    text = (REPO / "docs" / "estimators.md").read_text()
    block = text.split("<!-- rows.py ROW_FIELDS: begin -->\n")[1].split("<!-- rows.py ROW_FIELDS: end -->")[0]
    assert block == schema_table(), "regenerate the table with verl_gigpo.rollout.rows.schema_table()"


def _episode(steps: int) -> Episode:
    """An episode of ``steps`` steps (every odd step invalid); 0 steps: its environment failed at reset."""
    played = [
        StepRecord(
            step_id=i,
            observation=f"obs {i}",
            anchor_key=f"k{i}",
            prompt_text="",
            prompt_ids=[1],
            response_ids=[2],
            response_logprobs=None,
            response_text="go!",
            action="go",
            action_valid=i % 2 == 0,
            env_reward=0.0,
            step_reward=-0.1 * i,
            terminated=False,
            truncated=False,
            won=False,
        )
        for i in range(steps)
    ]
    error = None if steps else "reset failed"
    return Episode(traj_id=f"t{steps}", task=TaskSpec("counter", seed=3), steps=played, won=steps > 1, env_error=error)


def test_the_writer_and_the_reader_follow_the_schema():
    """Every row the writer makes carries exactly the schema's fields (the placeholder row too, at the placeholder
    values), and ``StepBatch`` reads each field with a column into it with the schema's dtype."""
    names = [f.name for f in ROW_FIELDS]
    real, failed = _episode(3), _episode(0)
    for ep in (real, failed):
        for text_chars, fields in ((0, [f.name for f in ROW_FIELDS if not f.text]), (50, names)):
            assert all(list(r.fields) == fields for r in episode_rows(ep, text_chars=text_chars))
    (placeholder,) = episode_rows(failed)
    assert placeholder.placeholder
    assert all(placeholder.fields[f.name] == f.placeholder for f in ROW_FIELDS if f.level == "step" and not f.text)
    assert set(REQUIRED_FIELDS) <= set(names)
    steps = StepBatch.from_episodes([real, failed], text_chars=50)
    step_batch_fields = {f.name for f in dataclasses.fields(StepBatch)}
    for f in ROW_FIELDS:
        if f.column:
            assert f.column in step_batch_fields
            assert getattr(steps, f.column).dtype == np.dtype(f.dtype), f.name
    np.testing.assert_array_equal(steps.step_rewards, [0.0, -0.1, -0.2, 0.0])
    assert list(steps.actions) == ["go", "go!", "go", ""] and not steps.row_mask[3]
