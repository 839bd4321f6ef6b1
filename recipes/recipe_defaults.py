"""The table of the recipes' defaults: per environment, per estimator, and for DEVICE=cpu (read by recipes/driver.py).

A variable the user sets wins; then DEVICE=cpu's small run; then the estimator's authors' settings; then the
environment's; then :data:`COMMON`. Where each value comes from: recipes/reference_settings.yaml (docs/fidelity.md).
Values are strings as a shell would hold them; "" means unset (e.g. ALFWorld's VAL_SIZE: every game of the split).
"""

from __future__ import annotations

#: the estimators ADV_ESTIMATOR may name: this package's step-credit estimators and verl's outcome baselines that the
#: gigpo_sync trainer mode computes on the same step rows (tests/test_recipes_ux.py holds it to both lists)
ESTIMATORS = ("gigpo", "hgpo", "graphgpo", "g2po", "grpo", "rloo")
#: the estimators with a step term (DYNAMIC=signal needs one)
STEP_CREDIT = ("gigpo", "hgpo", "graphgpo", "g2po")

#: every recipe's defaults where its environment sets no other (the reference's GiGPO runs)
COMMON = {
    "MODEL_PATH": "Qwen/Qwen2.5-1.5B-Instruct",
    "NNODES": "1",
    "ADV_ESTIMATOR": "gigpo",
    "RESPONSE_LENGTH": "512",
    "PROMPT_OVERLONG": "fail_episode",
    "GROUP_SIZE": "8",
    "TOTAL_ITERS": "150",
    "TEST_FREQ": "5",
    "KL_COEF": "0.01",
    "ENTROPY_COEF": "0.001",
    "VAL_TEMPERATURE": "0.4",
    "VAL_DO_SAMPLE": "true",
    "MAX_CKPTS_TO_KEEP": "2",
    "VAL_SPLIT": "test",
    "SEED": "0",
    "LOGGER": "console,file",
    "ATTN_IMPLEMENTATION": "auto",
}

#: per environment: ``defaults`` (over COMMON), ``overrides`` (Hydra overrides after ``env.max_steps``; ``{NAME}`` is
#: the variable's value, ``{NAME:q}`` quoted for Hydra; a ``(NAME, override)`` pair only when NAME is set) and
#: ``prep`` (data-prep arguments: a flag and the variable that gives its value; skipped when the value is empty)
RECIPES = {
    "alfworld": {
        "defaults": {
            "PROMPT_LENGTH": "2048",
            "ADV_NORM": "mean_std",
            "MAX_STEPS": "50",
            # 3,553 = every game of ALFWorld's training split (json_2.1.1/train), which the reference samples from
            "TRAIN_SIZE": "3553",
            "VAL_SIZE": "",
            "VAL_SPLIT": "valid_seen",
            "TRAIN_TASKS_PER_ITER": "16",
            # step rows per optimizer step: the reference's ppo_mini_batch_size (its rollout.n is 1)
            "MINI_BATCH_ROWS": "256",
            "MICRO_BATCH_PER_GPU": "32",
            "LOG_PROB_MICRO_BATCH_PER_GPU": "32",
        },
        "overrides": [
            "algorithm.gigpo.key_mode=observation",
            "algorithm.use_kl_in_reward=false",
            "env.history_length=2",
            "env.invalid_action_penalty=0.1",
            # the reference's rule: only a broken reply format is invalid (docs/environments.md)
            "env.invalid_action=format",
            "env.parse.lowercase=true",
            "env.parse.collapse_whitespace=false",
            "env.prompt.admissible_actions=lines",
            "env.prompt.overlong={PROMPT_OVERLONG}",
            "+env.kwargs.data_path={ALFWORLD_DATA:q}",
        ],
        "prep": [("--val-split", "VAL_SPLIT"), ("--val-size", "VAL_SIZE"), ("--env-kwargs", "ALFWORLD_KWARGS")],
    },
    "webshop": {
        "defaults": {
            "PROMPT_LENGTH": "4096",
            "ADV_NORM": "mean",
            "MAX_STEPS": "15",
            # 5,000 = every training goal of the project's simulator (environments/webshop, num_train_goals)
            "TRAIN_SIZE": "5000",
            "VAL_SIZE": "500",
            # a prompt with history over this many characters is shown without it (the reference's rule); null: never
            "HISTORY_FREE_ABOVE_CHARS": "13000",
            # webshop = the project's simulator; webshop_real = the adapter to a real WebShop installation
            "WEBSHOP_ENV": "webshop",
            "TRAIN_TASKS_PER_ITER": "16",
            "MINI_BATCH_ROWS": "64",
            "MICRO_BATCH_PER_GPU": "8",
            "LOG_PROB_MICRO_BATCH_PER_GPU": "8",
        },
        "overrides": [
            "algorithm.gigpo.key_mode=observation",
            "env.history_length=2",
            "env.invalid_action_penalty=0.1",
            "env.invalid_action=format",
            "env.parse.lowercase=true",
            "env.parse.collapse_whitespace=false",
            "+env.kwargs.strategy_hints=false",
            "env.prompt.admissible_actions=lines",
            "env.prompt.history_free_above_chars={HISTORY_FREE_ABOVE_CHARS}",
            "env.prompt.overlong={PROMPT_OVERLONG}",
            # the reference's reward: 10 for a purchase that scores 1.0, else 0
            "+env.kwargs.success_reward=10",
        ],
        "prep": [("--val-size", "VAL_SIZE"), ("--val-split", "VAL_SPLIT")],
    },
    "sokoban": {
        "defaults": {
            # the reference's run plays Sokoban from images with a vision-language model; OBSERVATION=text: the text
            # grid for text models (OBSERVATION_DEFAULTS below)
            "OBSERVATION": "image",
            "MODEL_PATH": "Qwen/Qwen2.5-VL-3B-Instruct",
            "HISTORY_LENGTH": "0",
            # 16 pixels a cell: a 6x6 room is 96x96, the size of gym-sokoban's rgb_array image
            "TILE_SIZE": "16",
            "PROMPT_LENGTH": "1024",
            "ADV_NORM": "mean",
            "MAX_STEPS": "15",
            "TRAIN_SIZE": "4096",
            "VAL_SIZE": "128",
            "TRAIN_TASKS_PER_ITER": "32",
            "MINI_BATCH_ROWS": "64",
            "MICRO_BATCH_PER_GPU": "8",
            "LOG_PROB_MICRO_BATCH_PER_GPU": "8",
        },
        "overrides": [
            "algorithm.gigpo.key_mode=state",
            "env.history_length={HISTORY_LENGTH}",
            "+env.kwargs.observation={OBSERVATION}",
            "+env.kwargs.tile_size={TILE_SIZE}",
            "env.invalid_action_penalty=0.1",
            "env.invalid_action=format",
            "env.parse.lowercase=true",
            "env.parse.collapse_whitespace=false",
            "env.prompt.admissible_actions=comma",
            "env.prompt.overlong={PROMPT_OVERLONG}",
        ],
        "prep": [("--val-size", "VAL_SIZE"), ("--val-split", "VAL_SPLIT")],
    },
    "search": {
        "defaults": {
            "MODEL_PATH": "Qwen/Qwen2.5-3B-Instruct",
            "PROMPT_LENGTH": "4096",
            "ADV_NORM": "mean_std",
            "MAX_STEPS": "4",
            "TRAIN_SIZE": "4096",
            "VAL_SIZE": "256",
            "GROUP_SIZE": "5",
            "TRAIN_TASKS_PER_ITER": "256",
            "TOTAL_ITERS": "200",
            "TEST_FREQ": "50",
            "MINI_BATCH_ROWS": "512",
            "MICRO_BATCH_PER_GPU": "16",
            "LOG_PROB_MICRO_BATCH_PER_GPU": "32",
            "KL_COEF": "0.001",
            "ENTROPY_COEF": "0",
            # greedy validation: the reference leaves verl's val_kwargs
            "VAL_TEMPERATURE": "0",
            "VAL_DO_SAMPLE": "false",
        },
        "overrides": [
            "algorithm.gigpo.key_mode=similarity",
            "algorithm.gigpo.similarity_threshold=0.9",
            # the reference's grouping: difflib's ratio, greedy first-fit in row order (docs/estimators.md)
            "algorithm.gigpo.similarity_grouping=difflib_first_fit",
            "algorithm.use_kl_in_reward=false",
            "env.history_length=4",
            "env.invalid_action_penalty=0.01",
            "env.invalid_action=format",
            "env.prompt.invalid_reply_tail=0",
            "env.prompt.overlong=cut_left",
            ("RETRIEVER_URL", "+env.kwargs.retriever_url={RETRIEVER_URL:q}"),
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
        ],
        "prep": [("--val-size", "VAL_SIZE"), ("--val-split", "VAL_SPLIT")],
    },
}


def _cards(model: str, tasks: str, steps: str, iters: str, test_freq: str, rows: str, micro: str, log_prob: str):
    """A card game's recipe (the reference's examples/gigpo_trainer/run_<game>.sh): images, no history, the default
    invalid-reply rule (the reference's gym_projection judges the action named, not the format)."""
    return {
        "defaults": {
            "OBSERVATION": "image",
            "MODEL_PATH": model,
            "HISTORY_LENGTH": "0",
            "IMAGE_SIZE": "300",
            "PROMPT_LENGTH": "1024",
            "ADV_NORM": "mean",
            "MAX_STEPS": steps,
            "TRAIN_SIZE": "4096",
            "VAL_SIZE": "128",
            "TRAIN_TASKS_PER_ITER": tasks,
            "TOTAL_ITERS": iters,
            "TEST_FREQ": test_freq,
            "MINI_BATCH_ROWS": rows,
            "MICRO_BATCH_PER_GPU": micro,
            "LOG_PROB_MICRO_BATCH_PER_GPU": log_prob,
        },
        "overrides": [
            "algorithm.gigpo.key_mode=state",
            "algorithm.use_kl_in_reward=false",
            "env.history_length={HISTORY_LENGTH}",
            "+env.kwargs.observation={OBSERVATION}",
            "+env.kwargs.image_size={IMAGE_SIZE}",
            "env.invalid_action_penalty=0.1",
            "env.invalid_action=admissible",
            "env.parse.lowercase=true",
            "env.parse.collapse_whitespace=false",
            "env.prompt.admissible_actions=comma",
            "env.prompt.overlong={PROMPT_OVERLONG}",
        ],
        "prep": [("--val-size", "VAL_SIZE"), ("--val-split", "VAL_SPLIT")],
    }


RECIPES["ezpoints"] = _cards("Qwen/Qwen2.5-VL-3B-Instruct", "16", "8", "100", "5", "128", "8", "16")
RECIPES["numberline"] = _cards("Qwen/Qwen2-VL-2B-Instruct", "16", "10", "20", "5", "16", "4", "8")
RECIPES["blackjack"] = _cards("Qwen/Qwen2.5-VL-3B-Instruct", "32", "15", "200", "10", "32", "8", "16")

#: OBSERVATION=text: the defaults that differ from the image run (a text model, the text prompt's history)
OBSERVATION_DEFAULTS = {
    "sokoban": {"text": {"MODEL_PATH": "Qwen/Qwen2.5-1.5B-Instruct", "HISTORY_LENGTH": "2"}},
}

#: per estimator: its options (Hydra overrides) and, per environment, ``overrides`` and ``defaults`` where its
#: authors ran it differently from the recipe's GiGPO (docs/fidelity.md, the estimators' tables)
ESTIMATOR_SETTINGS = {
    "hgpo": {
        "overrides": ["algorithm.hgpo.weight_base=depth_plus_one", "algorithm.hgpo.std=population"],
        "alfworld": {"defaults": {"TOTAL_ITERS": "160", "PROMPT_LENGTH": "4096", "PROMPT_OVERLONG": "cut_left"}},
        "webshop": {
            "defaults": {
                "TOTAL_ITERS": "160",
                "MAX_STEPS": "30",
                "PROMPT_OVERLONG": "cut_left",
                "HISTORY_FREE_ABOVE_CHARS": "null",
            }
        },
    },
    "graphgpo": {
        "overrides": [],
        "alfworld": {"overrides": ["algorithm.graphgpo.omega=0.1"]},
        "webshop": {
            "overrides": ["algorithm.graphgpo.omega=0.2"],
            "defaults": {"ADV_NORM": "mean_std", "PROMPT_LENGTH": "5120"},
        },
        "sokoban": {"overrides": ["algorithm.graphgpo.omega=0.8"], "defaults": {"ADV_NORM": "mean_std"}},
    },
    "g2po": {
        "overrides": ["algorithm.g2po.invalid_penalty=0.1"],
        "alfworld": {"defaults": {"TOTAL_ITERS": "100"}},
        "webshop": {"defaults": {"TOTAL_ITERS": "100"}},
    },
}

#: DEVICE=cpu: a small run of verl's pipeline on this CPU (docs/cpu-smoke.md); DATA_DIR gets its own folder
CPU = {
    "MODEL_PATH": "artifacts/tiny-model",
    "N_GPUS": "1",
    "GROUP_SIZE": "4",
    "TRAIN_TASKS_PER_ITER": "4",
    "TOTAL_ITERS": "2",
    "TEST_FREQ": "100",
    "TRAIN_SIZE": "64",
    "VAL_SIZE": "8",
    "MAX_STEPS": "4",
    "RESPONSE_LENGTH": "16",
    # a tiny model's tokenizer spends more tokens per character than the budgets were sized for: shorten prompts
    "PROMPT_OVERLONG": "drop_history",
}

#: DEVICE=cpu with images (OBSERVATION=image or both): the tiny vision-language model, built when missing, and small
#: images; its images-only processor class lives in the model folder (trust_remote_code, docs/vision.md)
CPU_IMAGE = {
    "MODEL_PATH": "artifacts/tiny-vl",
    "TILE_SIZE": "8",
    "IMAGE_SIZE": "112",
    "PROMPT_LENGTH": "512",
}

#: the tiny models DEVICE=cpu builds when its default MODEL_PATH is missing: folder -> builder module
TINY_MODELS = {"artifacts/tiny-model": "verl_gigpo.dev.tiny_model", "artifacts/tiny-vl": "verl_gigpo.dev.tiny_vl_model"}

#: the variables the suggested evaluation of a finished run repeats when the user set them; ENV:NAME only in ENV's
EVAL_REPEATS = (
    "DEVICE",
    "PYTHON",
    "MODEL_PATH",
    "EXPERIMENT",
    "ADV_ESTIMATOR",
    "LORA_RANK",
    "LORA_ALPHA",
    "LORA_TARGET_MODULES",
    "THINKING",
    "PROMPT_TEMPLATE",
    "alfworld:ALFWORLD_DATA",
    "webshop:WEBSHOP_ENV",
    "search:RETRIEVER_URL",
)

#: PROMPT_TEMPLATE: the reference's layout of history items and admissible actions, per environment
TEMPLATE_LAYOUT = {
    "alfworld": ("bracketed", "quoted_indent"),
    "webshop": ("bracketed", "quoted_comma"),
    "sokoban": ("bracketed", "comma"),
    "search": ("step_blocks", "comma"),
    "ezpoints": ("bracketed", "comma"),
    "numberline": ("bracketed", "comma"),
    "blackjack": ("bracketed", "comma"),
}
