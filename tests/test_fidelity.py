"""CPU tests of the fidelity table (``recipes/reference_settings.yaml``, ``recipes/fidelity.py``): each recipe's
command composes exactly what the table lists, every difference from the reference implementation has a stated
reason, and docs/fidelity.md shows the table as it is.

A recipe's command is composed as it would run (``recipe_config.compose_recipe``): ``DRY_RUN=1 bash
recipes/run_<recipe>.sh`` prints it, and Hydra composes the printed overrides over verl's own config (as
``python -m verl_gigpo.main`` does before Ray starts).
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from recipe_config import compose_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["alfworld", "webshop", "sokoban", "search", "ezpoints", "numberline", "blackjack"]
ESTIMATORS = ["hgpo", "graphgpo", "g2po"]

# the settings every recipe's table must cover (a row may come from the common rows)
REQUIRED_SETTINGS = {
    "model",
    "advantage estimator",
    "tasks per iteration",
    "group size",
    "training tasks",
    "validation split",
    "validation episodes",
    "validation every (iterations)",
    "validate before training",
    "validation temperature",
    "validation sampling",
    "iterations",
    "discount gamma",
    "step-advantage weight w",
    "advantage normalisation",
    "anchor key",
    "episode-level statistics",
    "learning rate",
    "KL loss",
    "KL loss coefficient",
    "KL loss type",
    "entropy coefficient",
    "invalid-action penalty",
    "prompt length (tokens)",
    "response length (tokens)",
    "history length",
    "step rows per optimizer step",
    "PPO epochs per iteration",
    "clip ratio",
    "rollout temperature",
    "task-order seed",
    "loss normalisation",
    "actor micro-batch (rows per GPU)",
    "log-prob micro-batch (rows per GPU)",
    "padding-free packing (actor and reference model)",
    "GPUs",
    "rollout tensor parallelism",
    "vLLM chunked prefill",
    "vLLM frees its memory during training",
    "vLLM concurrent sequences",
    "checkpoint every (iterations)",
    "validation batch (tasks)",
    "step limit stated in the prompt",
    "history step numbers start at",
    "first step's prompt",
    "over-long prompts",
    "over-long task rows filtered",
    "prompt wording",
    "reply case",
    "reply whitespace",
    "over-long observations",
    "float32 step statistics",
}


def _load_module():
    spec = importlib.util.spec_from_file_location("gigpo_recipes_fidelity", ROOT / "recipes" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fidelity = _load_module()

# the settings every recipe's LoRA rows must cover (from the LoRA rows, or the recipe's own rows they replace)
REQUIRED_LORA_SETTINGS = {
    "LoRA rank",
    "LoRA alpha",
    "LoRA target modules",
    "adapter in the rollout",
    "learning rate",
    "KL loss",
}
# settings in which the reference's LoRA scripts differ from its full fine-tuning scripts: each needs a LoRA row
LORA_SCRIPT_DIFFERENCES = {"model", "LoRA rank", "LoRA alpha", "learning rate", "KL loss"}


# the settings each successor's rows must cover for a recipe its authors ran a script for (every option of the method,
# `algorithm.<method>.*`, needs a row too: test_successor_rows_cover_the_settings_the_issue_names)
REQUIRED_ESTIMATOR_SETTINGS = {
    "advantage estimator",
    "iterations",
    "prompt length (tokens)",
    "advantage normalisation",
    "padding rows",
}


@pytest.fixture(scope="module")
def table():
    return fidelity.load_table()


def test_table_is_sound(table):
    assert fidelity.table_problems(table) == []
    assert list(table["recipes"]) == RECIPES
    assert list(table["estimators"]) == ESTIMATORS
    for spec in table["recipes"].values():
        assert (ROOT / spec["script"]).is_file()


@pytest.mark.parametrize("recipe", RECIPES)
def test_table_covers_every_setting_that_decides_training(table, recipe):
    names = [row["setting"] for row in fidelity.recipe_rows(table, recipe)]
    assert REQUIRED_SETTINGS - set(names) == set()
    assert len(names) == len(set(names))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_what_the_table_lists(table, recipe):
    cfg, prep = compose_recipe(recipe)
    assert fidelity.fidelity_problems(table, recipe, cfg, prep) == []


def test_a_changed_recipe_value_fails_the_check(table):
    """The check is not vacuous: a recipe variable, an extra Hydra override and a data-prep size each break it."""
    cfg, prep = compose_recipe("alfworld", "actor_rollout_ref.actor.kl_loss_coef=0.05", MINI_BATCH_ROWS="2048")
    problems = fidelity.fidelity_problems(table, "alfworld", cfg, prep)
    assert len(problems) == 2, problems
    assert "'step rows per optimizer step': the recipe composes trainer.v1.gigpo_sync.mini_batch_rows=2048" in (
        problems[0] + problems[1]
    )
    assert any("'KL loss coefficient'" in p and "kl_loss_coef=0.05" in p for p in problems)
    cfg, prep = compose_recipe("alfworld", TRAIN_SIZE="2048", VAL_SIZE="128")
    problems = fidelity.fidelity_problems(table, "alfworld", cfg, prep)
    assert [p.split(":")[1].strip() for p in problems] == ["'training tasks'", "'validation episodes'"]


def test_a_difference_without_a_reason_is_a_table_problem(table):
    broken = copy.deepcopy(table)
    row = next(r for r in broken["common"] if r["setting"] == "row order within mini-batches")
    del row["deviation"]
    problems = fidelity.table_problems(broken)
    assert len(problems) == 1 and "ours=True differs from reference=False" in problems[0]
    row = next(r for r in broken["recipes"]["alfworld"]["rows"] if r["setting"] == "learning rate")
    row["deviation"] = "no reason"
    assert any("a deviation on a row where ours equals the reference" in p for p in fidelity.table_problems(broken))
    row["surprise"] = 1
    assert any("unknown field(s) ['surprise']" in p for p in fidelity.table_problems(broken))


def test_values_compare_as_the_config_holds_them():
    assert fidelity.same(1, 1.0) and fidelity.same(1e-6, 1.0e-06) and fidelity.same("all", "all")
    assert not fidelity.same(True, 1) and not fidelity.same(0, False) and not fidelity.same(0.1, 0.01)
    assert fidelity.composed_value(None, ["--train-size", "3553"], "prep:--train-size") == 3553
    assert fidelity.composed_value(None, ["--train-size", "3553"], "prep:--val-size") == "all"


def test_docs_page_is_the_rendering_of_the_table(table):
    assert (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8") == fidelity.render_markdown(table)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_lora_recipe_composes_what_the_lora_rows_list(table, recipe):
    """``LORA_RANK=64``: the LoRA rows replace the rows of the same setting; every other row still holds."""
    cfg, prep = compose_recipe(recipe, **table["lora"]["env"])
    assert fidelity.fidelity_problems(table, recipe, cfg, prep, lora=True) == []
    names = [row["setting"] for row in fidelity.recipe_rows(table, recipe, lora=True)]
    assert REQUIRED_SETTINGS | REQUIRED_LORA_SETTINGS <= set(names) and len(names) == len(set(names))
    lora_names = {row["setting"] for row in table["lora"]["common"]}
    if recipe in table["lora"]["recipes"]:
        lora_names |= {row["setting"] for row in table["lora"]["recipes"][recipe]["rows"]}
        assert LORA_SCRIPT_DIFFERENCES <= lora_names
    # without LoRA the recipe composes no LoRA and its own learning rate and KL loss
    plain, _ = compose_recipe(recipe)
    assert plain.actor_rollout_ref.model.lora_rank == 0 and plain.actor_rollout_ref.actor.use_kl_loss is True


def test_a_changed_lora_value_fails_the_lora_check(table):
    cfg, prep = compose_recipe("webshop", **table["lora"]["env"], LORA_ALPHA="32", LR="1e-6")
    problems = fidelity.fidelity_problems(table, "webshop", cfg, prep, lora=True)
    assert len(problems) == 2, problems
    assert any("'LoRA alpha'" in p and "lora_alpha=32" in p for p in problems)
    assert any("'learning rate'" in p and "optim.lr=1e-06" in p for p in problems)
    # the LoRA rows do not hold without LoRA
    cfg, prep = compose_recipe("webshop")
    problems = fidelity.fidelity_problems(table, "webshop", cfg, prep, lora=True)
    assert any("'LoRA rank'" in p and "lora_rank=0" in p for p in problems)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_dynamic_recipe_composes_what_the_dynamic_rows_list(table, recipe):
    """``DYNAMIC=episode``: the reference's dynamic GiGPO rows replace the rows of the same setting; every other row
    still holds; without it the recipe composes no dynamic sampling and verl's clip range."""
    cfg, prep = compose_recipe(recipe, **table["dynamic"]["env"])
    assert fidelity.fidelity_problems(table, recipe, cfg, prep, dynamic=True) == []
    names = [row["setting"] for row in fidelity.recipe_rows(table, recipe, dynamic=True)]
    assert REQUIRED_SETTINGS <= set(names) and len(names) == len(set(names))
    plain, prep = compose_recipe(recipe)
    assert plain.algorithm.filter_groups.enable is False and plain.actor_rollout_ref.actor.clip_ratio_high == 0.2
    problems = fidelity.fidelity_problems(table, recipe, plain, prep, dynamic=True)
    assert any("'dynamic sampling'" in p and "enable=False" in p for p in problems)


# ------------------------------------------------------------------ HGPO, GraphGPO, G2PO as their authors ran them


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("method", ESTIMATORS)
def test_a_successor_recipe_composes_what_its_rows_list(table, method, recipe):
    """``ADV_ESTIMATOR=<method>``: the method's rows (its authors' settings) replace the rows of the same setting, and
    every other row of the recipe still holds."""
    cfg, prep = compose_recipe(recipe, **table["estimators"][method]["env"])
    assert fidelity.fidelity_problems(table, recipe, cfg, prep, estimator=method) == []
    names = [row["setting"] for row in fidelity.recipe_rows(table, recipe, estimator=method)]
    assert REQUIRED_SETTINGS <= set(names) and len(names) == len(set(names))
    if recipe in table["estimators"][method]["recipes"]:
        section = table["estimators"][method]
        own = {row["setting"]: row for row in section["common"] + section["recipes"][recipe]["rows"]}
        assert REQUIRED_ESTIMATOR_SETTINGS <= set(own)
        # every option of the method has a row of the authors' value, read from the composed config
        keys = {row["key"] for row in own.values()}
        assert {f"algorithm.{method}.{option}" for option in cfg.algorithm[method]} <= keys


def test_successor_rows_cover_the_settings_the_issue_names(table):
    """The settings issue 27.5 names, per method: HGPO's weights, std, iterations and prompt length; GraphGPO's omega
    and norm per environment (its penalty, a row for every recipe); G2PO's iterations."""
    est = table["estimators"]

    def value(method, recipe, key):
        rows = fidelity.recipe_rows(table, recipe, estimator=method)
        return next(row["ours"] for row in rows if row["key"] == key)

    assert value("hgpo", "alfworld", "algorithm.hgpo.weight_base") == "depth_plus_one"
    assert value("hgpo", "alfworld", "algorithm.hgpo.std") == "population"
    assert [value("hgpo", r, "trainer.total_training_steps") for r in ("alfworld", "webshop")] == [160, 160]
    assert value("hgpo", "alfworld", "data.max_prompt_length") == 4096
    omega = {r: value("graphgpo", r, "algorithm.graphgpo.omega") for r in est["graphgpo"]["recipes"]}
    assert omega == {"alfworld": 0.1, "webshop": 0.2, "sokoban": 0.8}
    assert value("graphgpo", "webshop", "algorithm.gigpo.norm") == "mean_std"
    assert value("graphgpo", "search", "algorithm.graphgpo.invalid_penalty") == 0.0
    assert [value("g2po", r, "trainer.total_training_steps") for r in ("alfworld", "webshop")] == [100, 100]
    # a recipe the authors ran no script for keeps its GiGPO settings
    assert value("g2po", "sokoban", "trainer.total_training_steps") == 150


def test_user_settings_win_over_the_authors_settings(table):
    """A recipe variable and an extra override still win under ADV_ESTIMATOR=hgpo (the paper's k^alpha weights), and
    the check names each changed setting."""
    cfg, prep = compose_recipe("alfworld", "algorithm.hgpo.weight_base=depth", ADV_ESTIMATOR="hgpo", TOTAL_ITERS="150")
    assert cfg.algorithm.hgpo.weight_base == "depth" and cfg.trainer.total_training_steps == 150
    problems = fidelity.fidelity_problems(table, "alfworld", cfg, prep, estimator="hgpo")
    assert len(problems) == 2, problems
    assert any("'depth weights'" in p and "weight_base='depth'" in p for p in problems)
    assert any("'iterations'" in p and "total_training_steps=150" in p for p in problems)


def test_the_successor_rows_do_not_hold_for_gigpo(table):
    """Without ADV_ESTIMATOR the recipe composes GiGPO exactly as its own rows say, and none of a method's settings."""
    cfg, prep = compose_recipe("webshop")
    assert fidelity.fidelity_problems(table, "webshop", cfg, prep) == []
    problems = fidelity.fidelity_problems(table, "webshop", cfg, prep, estimator="graphgpo")
    settings = {p.split(":")[1].strip() for p in problems}
    assert {"'advantage estimator'", "'distance decay omega'", "'advantage normalisation'"} <= settings
    assert "'prompt length (tokens)'" in settings


@pytest.mark.parametrize("baseline", ["grpo", "rloo"])
def test_baselines_change_only_the_estimator(baseline):
    """``ADV_ESTIMATOR=grpo|rloo`` keeps every other setting of the GiGPO recipe."""
    gigpo, gigpo_prep = compose_recipe("alfworld")
    base, base_prep = compose_recipe("alfworld", ADV_ESTIMATOR=baseline)
    a, b = (OmegaConf.to_container(c, resolve=False) for c in (gigpo, base))
    for c in (a, b):
        del c["algorithm"]["adv_estimator"], c["trainer"]["experiment_name"]
    assert a == b and gigpo_prep == base_prep
    assert base.algorithm.adv_estimator == baseline


def test_webshop_trains_on_every_goal_of_the_simulator(table):
    """The WebShop recipe's training tasks are every training goal of the project's simulator."""
    from environments import make_env

    env = make_env("webshop")
    try:
        goals = env.num_tasks("train")
    finally:
        env.close()
    row = next(r for r in fidelity.recipe_rows(table, "webshop") if r["setting"] == "training tasks")
    _, prep = compose_recipe("webshop")
    assert row["ours"] == goals == fidelity.composed_value(None, prep, "prep:--train-size")


def test_the_table_says_what_differs_in_prompts_parsing_grouping_and_rounding(table):
    """The rows of issue 38: the prompt's words differ (a template from the user's checkout matches them), the search
    recipe groups as the reference does, the float32 row names its reproducer, and the reference is named as its
    upstream repository."""
    assert "upstream langfengQ/verl-agent" in table["sources"]["reference"]
    assert "vanzll/verl-agent" in table["sources"]["reference"]  # the snapshot that holds the cited commit
    for recipe in RECIPES:
        rows = {row["setting"]: row for row in fidelity.recipe_rows(table, recipe)}
        assert "PROMPT_TEMPLATE" in rows["prompt wording"]["deviation"]  # how a user matches the reference's words
        assert "fidelity_checks float32-residue" in rows["float32 step statistics"]["deviation"]
        assert rows["reply case"]["ours"] is (recipe != "search")
    search = {row["setting"]: row for row in fidelity.recipe_rows(table, "search")}
    row = search["similarity measure and clustering"]
    assert (row["key"], row["ours"], row["reference"]) == (
        "algorithm.gigpo.similarity_grouping",
        *2 * ["difflib_first_fit"],
    )
    text = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert "differs only" not in text.split("## Every recipe")[1].split("## LoRA runs")[0]
