"""CPU tests of ``verl_gigpo.verl_glue.preflight``: ``python -m verl_gigpo.main`` checks ``algorithm.gigpo.*``,
``env.*`` and the supported verl path on the driver, before verl starts Ray, with the messages of the components that
read those keys later (``GiGPOConfig.from_algorithm`` in the trainer mode, ``episode_config_from`` in the agent loop).

Configs are composed by Hydra from the real ``verl_gigpo/config/gigpo_trainer.yaml`` over verl's own ``ppo_trainer``,
with a model folder and task files that exist (:data:`FILES`) unless a test sets those keys itself (the checks of
the paths themselves are in ``tests/test_runs.py``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.utils.import_utils import load_class_from_fqn

from environments import list_envs
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.config.rules import (
    bypass_mode_problem,
    estimator_problem,
    kl_in_reward_problem,
    training_sampling_problem,
)
from verl_gigpo.local.config import ESTIMATORS, load_config
from verl_gigpo.verl_glue.agent_loop import episode_config_from
from verl_gigpo.verl_glue.preflight import GiGPOConfigError, config_problems, config_warnings, preflight

ROOT = Path(__file__).resolve().parents[1]
#: key -> an existing path for it (filled by the autouse fixture below)
FILES: dict[str, str] = {}


@pytest.fixture(autouse=True, scope="module")
def existing_files(tmp_path_factory):
    """A model folder (config.json) and task files that exist, so that only the keys under test are wrong."""
    root = tmp_path_factory.mktemp("preflight")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    for split in ("train", "val"):
        (root / f"{split}.parquet").write_bytes(b"")
    FILES.update(
        {
            "actor_rollout_ref.model.path": str(root / "model"),
            "data.train_files": str(root / "train.parquet"),
            "data.val_files": str(root / "val.parquet"),
        }
    )


def compose_gigpo(overrides: list[str]):
    """Compose verl_gigpo/config/gigpo_trainer.yaml (verl's ppo_trainer + ours) with Hydra overrides, plus existing
    paths for the model and task files when ``overrides`` does not set them."""
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    paths = [f"{key}={value}" for key, value in FILES.items() if key not in given]
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=[*paths, *overrides])


def reader_message(reader, argument) -> str:
    """The ValueError message the component's own reader gives for this config."""
    with pytest.raises(ValueError) as info:
        reader(argument)
    return str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [[], ["algorithm.adv_estimator=grpo"], ["env.name=alfworld", "env.kwargs={}"], ["env.invalid_action=format"]],
)
def test_valid_configs_pass(overrides, tmp_path, monkeypatch):
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)  # the layout ALFWorld's data check looks for
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    cfg = compose_gigpo(overrides)
    assert config_problems(cfg) == []
    assert preflight(cfg) is None


def test_wandb_logging_without_credentials_stops_before_ray(tmp_path, monkeypatch):
    """trainer.logger with wandb and no W&B key: wandb.init would stop the run inside Ray after start-up; preflight
    names the key and the ways out instead. Offline mode or a netrc entry for api.wandb.ai pass."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    cfg = compose_gigpo(["trainer.logger=[console,wandb]"])
    with pytest.raises(GiGPOConfigError, match=r"trainer.logger=\['console', 'wandb'\] includes wandb.*WANDB_MODE"):
        preflight(cfg)
    assert preflight(compose_gigpo([])) is None  # the default: console and verl's file logger
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert preflight(cfg) is None
    (tmp_path / "netrc").write_text("machine example.org login user password abc\n")
    with pytest.raises(GiGPOConfigError):
        preflight(cfg)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert preflight(cfg) is None


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.gigpo.norm=foo",
        "algorithm.gigpo.norm=mean_norm",
        "algorithm.gigpo.epsilon=0",
        "algorithm.gigpo.step_advantage_w=-1",
        "algorithm.gigpo.episode_stats=episode",
        "algorithm.gigpo.key_mode=history",
        "algorithm.gigpo.similarity_threshold=1.5",
        "+algorithm.gigpo.step_weight=2",
        "algorithm.gamma=-0.5",  # gamma=0 is a valid discount (R_t = r_t)
    ],
)
def test_gigpo_errors_are_the_trainer_modes_messages(override):
    """Each bad algorithm.gigpo.* value is reported on the driver with GiGPOConfig.from_algorithm's own message."""
    cfg = compose_gigpo([override])
    expected = reader_message(GiGPOConfig.from_algorithm, cfg.algorithm)
    assert config_problems(cfg) == [expected]
    with pytest.raises(GiGPOConfigError, match="found before starting Ray") as info:
        preflight(cfg)
    assert isinstance(info.value, ValueError)
    assert info.value.problems == [expected]


def test_gamma_under_gigpo_is_rejected_naming_algorithm_gamma():
    cfg = compose_gigpo(["+algorithm.gigpo.gamma=0.5"])
    # what happened before: the trainer mode's reader takes algorithm.gamma and drops the other one silently
    assert GiGPOConfig.from_algorithm(cfg.algorithm).gamma == 0.95
    [problem] = config_problems(cfg)
    assert problem.startswith("algorithm.gigpo.gamma=0.5 is not read")
    assert "set algorithm.gamma=0.5 and drop algorithm.gigpo.gamma" in problem


def test_gamma_under_gigpo_does_not_hide_other_gigpo_errors():
    cfg = compose_gigpo(["+algorithm.gigpo.gamma=0.5", "algorithm.gigpo.norm=foo"])
    problems = config_problems(cfg)
    assert len(problems) == 2
    assert problems[0].startswith("algorithm.gigpo.gamma=0.5 is not read")
    assert problems[1].startswith("algorithm.gigpo.norm='foo' is not a norm")


@pytest.mark.parametrize(
    "override",
    [
        "env.max_steps=0",
        "env.history_length=-1",
        "env.invalid_action_penalty=-0.5",
        "data.max_response_length=0",
        "env.invalid_action=formatted",
    ],
)
def test_env_range_errors_are_the_agent_loops_messages(override):
    """Values of the right type but out of range: the agent loop's reader (episode_config_from) says it, verbatim."""
    cfg = compose_gigpo([override])
    assert config_problems(cfg) == [reader_message(episode_config_from, cfg)]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.name=alfwrold", "env.name='alfwrold' is not a registered environment; known environments: "),
        ("env.name=null", "env.name=None is not a registered environment"),
        ("env.max_steps=2.5", "env.max_steps=2.5 must be a whole number >= 1 (steps per episode)"),
        ("env.max_steps=ten", "env.max_steps='ten' must be a whole number >= 1 (steps per episode)"),
        ("env.history_length=true", "env.history_length=True must be a whole number >= 0 (past steps shown"),
        ("env.invalid_action_penalty=nan", "env.invalid_action_penalty=nan must be a finite number >= 0"),
        ("env.invalid_action_penalty=inf", "env.invalid_action_penalty=inf must be a finite number >= 0"),
        ("env.invalid_action_penalty=high", "env.invalid_action_penalty='high' must be a finite number >= 0"),
        ("env.kwargs=3", "env.kwargs must be a mapping of environment constructor arguments"),
        ("+env.kwargs.max_steps=9", "env.kwargs.max_steps is set by the agent loop from env.max_steps"),
        ("+env.kwargs.key_mode=state", "env.kwargs.key_mode is set by the agent loop from algorithm.gigpo.key_mode"),
        ("+env.max_step=9", "unknown env key(s) ['max_step']: nothing reads them; known keys: "),
        ("env.seeded_sampling=maybe", "env.seeded_sampling must be true or false, got 'maybe'"),
    ],
)
def test_env_errors_the_readers_let_through(override, message):
    """What episode_config_from would truncate (2.5 -> 2), fail on with Python's own words, or never look at."""
    [problem] = config_problems(compose_gigpo([override]))
    assert problem.startswith(message)


def test_unknown_env_name_lists_the_registry():
    [problem] = config_problems(compose_gigpo(["env.name=alfwrold"]))
    assert problem.endswith(
        f"known environments: {', '.join(list_envs())} (add yours with +env.registry.<name>=package.module:Class)"
    )


def test_env_name_may_come_from_env_registry():
    """env.registry names the user's environments for the agent-loop workers; they count as registered."""
    cfg = compose_gigpo(["+env.registry.my_env=my_pkg.envs:MyEnv", "env.name=my_env"])
    assert config_problems(cfg) == []
    [problem] = config_problems(compose_gigpo(["+env.registry.my_env=my_pkg.envs:MyEnv", "env.name=other"]))
    known = ", ".join(sorted({*list_envs(), "my_env"}))  # the registry, plus env.registry's names
    assert f"known environments: {known} (" in problem and "my_env" in known and "gridnav" in known


def test_every_problem_is_reported_at_once():
    cfg = compose_gigpo(["algorithm.gigpo.norm=foo", "env.name=nope", "env.max_steps=2.5", "trainer.use_v1=false"])
    problems = config_problems(cfg)
    assert len(problems) == 4
    with pytest.raises(GiGPOConfigError) as info:
        preflight(cfg)
    message = str(info.value)
    assert message.startswith(
        "the config has 4 problem(s), found before starting Ray (verl_gigpo.verl_glue.preflight):\n"
    )
    assert all(f"\n  - {p}" in message for p in problems)


@pytest.mark.parametrize("estimator", ["gigpo", "grpo"])
def test_legacy_v0_trainer_is_rejected(estimator):
    """The agent loop returns one output per step (a list), which only verl's V1 TransferQueue path stores: with
    either estimator the run would crash in the V0 trainer after the first rollout."""
    [problem] = config_problems(compose_gigpo([f"algorithm.adv_estimator={estimator}", "trainer.use_v1=false"]))
    assert problem.startswith("trainer.use_v1=false selects verl's legacy (V0) trainer")
    assert problem.endswith("set trainer.use_v1=true (verl's default)")


def test_custom_agent_loop_manager_is_rejected():
    cfg = compose_gigpo(["+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my_pkg.manager.MyManager"])
    [problem] = config_problems(cfg)
    assert problem.startswith("actor_rollout_ref.rollout.agent.agent_loop_manager_class=my_pkg.manager.MyManager")
    assert "remove the override (agent_loop_manager_class=null)" in problem


@pytest.mark.parametrize(
    "fqn", ["verl.trainer.ppo.v1.AgentLoopManagerTQ", "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ"]
)
def test_naming_verls_own_manager_is_accepted(fqn):
    assert load_class_from_fqn(fqn, "AgentLoopManager") is AgentLoopManagerTQ  # verl resolves it to its default
    assert config_problems(compose_gigpo([f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={fqn}"])) == []


def test_gigpo_needs_the_gigpo_trainer_mode():
    [problem] = config_problems(compose_gigpo(["trainer.v1.trainer_mode=sync"]))
    assert problem.startswith("adv_estimator=gigpo with trainer.v1.trainer_mode=sync: only the gigpo_sync trainer mode")
    # a baseline estimator may use verl's own sync mode
    assert config_problems(compose_gigpo(["algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=sync"])) == []


def test_a_run_without_our_estimator_or_agent_loop_is_not_path_checked():
    cfg = compose_gigpo(
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            "trainer.use_v1=false",
        ]
    )
    assert config_problems(cfg) == []


def test_main_rejects_a_bad_config_before_ray_starts():
    """``python -m verl_gigpo.main`` with bad GiGPO keys exits with the messages instead of starting Ray (where the
    trainer mode would have rejected them minutes later)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_gigpo.main",
            # the two settings verl's own validate_config (run before Ray) needs: without the driver-side check of
            # verl_gigpo.main, this config goes on to start Ray and fails only inside its actors
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            *(f"{key}={value}" for key, value in FILES.items()),
            "algorithm.gigpo.norm=foo",
            "+algorithm.gigpo.gamma=0.9",
            "trainer.use_v1=false",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert "ray init kwargs" not in proc.stdout  # verl's run_ppo prints this just before ray.init
    assert "error: the config has 3 problem(s), found before starting Ray" in proc.stderr
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert "algorithm.gigpo.norm='foo' is not a norm" in proc.stderr
    assert "set algorithm.gamma=0.9 and drop algorithm.gigpo.gamma" in proc.stderr
    assert "set trainer.use_v1=true" in proc.stderr


def test_invalid_action_rule_is_read_by_the_agent_loop_and_named_when_wrong():
    assert episode_config_from(compose_gigpo([])).invalid_action == "admissible"  # the yaml default
    assert episode_config_from(compose_gigpo(["env.invalid_action=format"])).invalid_action == "format"
    [problem] = config_problems(compose_gigpo(["env.invalid_action=Format"]))
    assert problem.startswith("env.invalid_action must be one of ['admissible', 'format'] (") and "'Format'" in problem


# ---------------------------------------------------------------- one rule, both engines (verl_gigpo.config.rules)


def local_message(override: str) -> str:
    """The ValueError message of the local engine's config check (run before a model loads) for one override."""
    with pytest.raises(ValueError) as info:
        load_config([override])
    return str(info.value)


@pytest.mark.parametrize(
    ("override", "head"),
    [
        ("env.invalid_action_penalty=-0.5", "env.invalid_action_penalty=-0.5 must be a finite number >= 0 (subtracted"),
        ("env.invalid_action_penalty=-1", "env.invalid_action_penalty=-1 must be a finite number >= 0"),
        ("env.max_steps=0", "env.max_steps=0 must be a whole number >= 1 (steps per episode)"),
        ("env.max_steps=2.5", "env.max_steps=2.5 must be a whole number >= 1"),
        ("env.history_length=-1", "env.history_length=-1 must be a whole number >= 0"),
        ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0 must be a whole number >= 1 (episodes per"),
        ("algorithm.use_kl_in_reward=2", "algorithm.use_kl_in_reward=2 must be true or false"),
        (
            "algorithm.use_kl_in_reward=true",
            "algorithm.use_kl_in_reward=True is not supported with algorithm.adv_estimator=gigpo: its rewards are per "
            "environment step, not per token; set algorithm.use_kl_in_reward=false and use the KL loss instead: "
            "actor_rollout_ref.actor.use_kl_loss=true",
        ),
    ],
)
def test_both_engines_reject_a_rule_with_the_same_message(override, head):
    """verl's preflight (before Ray) and the local engine's config check (before a model loads) apply the same rule
    and say the same words, naming the key as the user typed it."""
    local = local_message(override)
    assert local.startswith(head)
    assert config_problems(compose_gigpo([override])) == [local]


def test_a_negative_penalty_is_refused_before_the_agent_loop_would():
    """What the agent loop's reader would say later (EpisodeConfig, same rule) is what preflight says first."""
    cfg = compose_gigpo(["env.invalid_action_penalty=-0.5"])
    assert config_problems(cfg) == [reader_message(episode_config_from, cfg)]


def test_kl_in_reward_is_refused_only_where_it_cannot_apply():
    """verl's own estimators apply a KL penalty per token (verl's apply_kl_penalty): allowed there with grpo; the
    local engine has no KL in the reward for any estimator."""
    override = ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=true"]
    assert config_problems(compose_gigpo(override)) == []
    with pytest.raises(ValueError) as info:
        load_config(override)
    assert str(info.value) == kl_in_reward_problem(True, "grpo", local_engine=True)
    assert str(info.value).startswith("algorithm.use_kl_in_reward=True: the local engine puts no KL penalty into")
    for method in ("gigpo", "hgpo", "graphgpo", "g2po"):
        cfg = compose_gigpo([f"algorithm.adv_estimator={method}", "algorithm.use_kl_in_reward=true"])
        assert config_problems(cfg) == [kl_in_reward_problem(True, method)]


def test_bypass_mode_without_rollout_log_probs_is_refused_before_ray():
    """verl's bypass mode reads rollout_log_probs, which the rollout returns only with calculate_log_probs."""
    assert config_problems(compose_gigpo(["algorithm.rollout_correction.bypass_mode=true"])) == []
    cfg = compose_gigpo(
        ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false"]
    )
    assert config_problems(cfg) == [bypass_mode_problem(True, False)]
    assert "set calculate_log_probs=true, or bypass_mode=false" in bypass_mode_problem(True, False)


def test_an_unknown_estimator_is_named_by_both_engines_with_what_each_runs():
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    local = local_message("algorithm.adv_estimator=gipgo")
    assert local == estimator_problem("gipgo", ESTIMATORS, engine="the local engine")
    [problem] = config_problems(compose_gigpo(["algorithm.adv_estimator=gipgo"]))
    known = sorted(ADV_ESTIMATOR_REGISTRY)
    assert "gigpo" in known and "gae" in known  # verl's own and the plug-in's
    assert problem == estimator_problem("gipgo", known, engine="verl (its registry, this plug-in's included)")
    head = "algorithm.adv_estimator='gipgo' is not an advantage estimator of "
    assert local.startswith(head) and problem.startswith(head)


def test_the_penalty_mode_is_checked_before_ray_with_its_statistics():
    """env.invalid_action_penalty_mode: a bad value, and reference without step-row statistics, are named before Ray
    (the message GiGPOConfig gives on the local engine too); reference with step statistics passes, and a bad env
    value elsewhere does not hide a bad mode."""
    [problem] = config_problems(compose_gigpo(["env.invalid_action_penalty_mode=reference"]))
    assert "invalid_action_penalty_mode=reference needs algorithm.gigpo.episode_stats=step" in problem
    assert (
        config_problems(
            compose_gigpo(["env.invalid_action_penalty_mode=reference", "algorithm.gigpo.episode_stats=step"])
        )
        == []
    )
    problems = config_problems(compose_gigpo(["env.invalid_action_penalty_mode=late", "env.max_steps=0"]))
    assert any("env.invalid_action_penalty_mode='late'" in p for p in problems)
    assert any(p.startswith("env.max_steps=0") for p in problems)


def test_training_rollouts_that_do_not_sample_are_refused_on_both_engines():
    """Greedy training rollouts make a group's episodes identical; verl's agent loop ignores rollout.do_sample, so
    do_sample=false is refused rather than silently dropped; a temperature of 0 is refused by both engines alike."""
    assert config_problems(compose_gigpo(["actor_rollout_ref.rollout.do_sample=false"])) == [
        training_sampling_problem(False, 1.0)
    ]
    assert training_sampling_problem(False, 1.0).startswith("actor_rollout_ref.rollout.do_sample=false")
    zero = "actor_rollout_ref.rollout.temperature=0"
    assert config_problems(compose_gigpo([zero])) == [local_message(zero)]
    assert local_message(zero).startswith("actor_rollout_ref.rollout.temperature=0 makes every episode")
    assert training_sampling_problem(True, 0.5) is None


def test_greedy_validation_outside_gigpo_sync_warns_that_verl_samples():
    """Only the gigpo_sync trainer mode makes val_kwargs.do_sample=false greedy; verl's own mode samples at
    val_kwargs.temperature, which the warning names (no warning when the temperature is already 0)."""
    greedy = [
        "actor_rollout_ref.rollout.n=8",  # groups of 8: no group-size warning
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.4",
    ]
    assert config_warnings(compose_gigpo(greedy)) == []  # the gigpo_sync mode (the default) makes it greedy
    verls = ["algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=sync"]
    [warning] = config_warnings(compose_gigpo([*greedy, *verls]))
    assert "temperature=0.4" in warning and "trainer mode sync" in warning
    assert config_warnings(compose_gigpo([*greedy[:2], *verls])) == []


def test_full_determinism_without_request_seeds_warns_that_members_would_sample_alike():
    """verl's vLLM server gives every request of a replica one seed under full_determinism unless the request
    brings its own: without env.seeded_sampling the members of a group would sample the same tokens."""
    groups = ["actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.full_determinism=true"]
    assert config_warnings(compose_gigpo(groups)) == []
    [warning] = config_warnings(compose_gigpo([*groups, "env.seeded_sampling=false"]))
    assert "full_determinism=true with env.seeded_sampling=false" in warning


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.filter_groups.max_num_gen_batches=0"], r"max_num_gen_batches=0 must be"),
        (["algorithm.filter_groups.filter=step"], r"filter='step' must be"),
        (["algorithm.adv_estimator=grpo", "algorithm.filter_groups.filter=signal"], r"filter=signal needs"),
        (["algorithm.filter_groups.metric=acc"], r"metric='acc'"),
        (["algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=sync"], r"needs trainer.v1.trainer_mode=gigpo_sync"),
        (["trainer.v1.sampler.custom_sampler.path=my.py"], r"custom_sampler"),
        (["+trainer.v1.sync.parameter_sync_step=2"], r"parameter_sync_step=2 must be 1"),
    ],
)
def test_dynamic_sampling_options_are_checked_before_ray(overrides, match):
    cfg = compose_gigpo(["algorithm.filter_groups.enable=true", *overrides])
    [problem] = config_problems(cfg)
    assert re.search(match, problem), problem


def test_dynamic_sampling_passes_with_the_reference_values():
    assert config_problems(compose_gigpo(["algorithm.filter_groups.enable=true"])) == []
    assert (
        config_problems(compose_gigpo(["algorithm.filter_groups.enable=true", "algorithm.filter_groups.filter=signal"]))
        == []
    )
    # off: verl's own default max_num_gen_batches (0, no limit) is not in the way
    assert config_problems(compose_gigpo(["algorithm.filter_groups.max_num_gen_batches=0"])) == []
