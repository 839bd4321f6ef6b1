"""CPU tests of prompt templates (``env.prompt.template``, :mod:`verl_gigpo.rollout.prompts`) and of the
``python -m verl_gigpo.prompts`` commands, on real environments and the tiny model's real tokenizer.

A template written here with every field is rendered exactly by the episode runner both engines share; both engines'
configs (and the paper recipes' PROMPT_TEMPLATE) select it; bad templates and moot keys are named; ``from-reference``
reads a synthetic mini-checkout written here with this project's own text at the reference's paths and names; ``show``
prints a sample state's prompt through the same builder with its token count.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import pytest
from recipe_config import compose_recipe
from transformers import AutoTokenizer

from environments import make_env
from verl_gigpo.local.config import load_config
from verl_gigpo.prompts.__main__ import main
from verl_gigpo.rollout import (
    ChatPromptEncoder,
    EpisodeConfig,
    GenerationOutput,
    PromptOptions,
    TaskSpec,
    build_prompt,
    run_episode,
)
from verl_gigpo.rollout.prompts import FIELD_ALIASES, FIELDS, load_template
from verl_gigpo.verl_glue.agent_loop import episode_config_from
from verl_gigpo.verl_glue.preflight import config_problems

ROOT = Path(__file__).resolve().parents[1]

#: a template with every field (and every other spelling of one), its first-step section, and newlines around both
EVERY_FIELD = """A comment: text before the first marker line is not part of the prompt.
--- gigpo prompt: step ---

Task: {task}
Step {step_number} ({step} taken, limit {max_steps}); {history_count} shown:
{history}
Now: {observation}
Choose from [{admissible_actions}].
Spellings: {task_description}|{current_observation}|{available_actions}|{step_count}|{current_step}|{history_length}
{action_history}={memory_context}
--- gigpo prompt: first_step ---
First look at {task}: {observation}
Choose from [{admissible_actions}].
"""

SCRIPT = ["up", "up", "left"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def every_field(tmp_path):
    path = tmp_path / "every_field.txt"
    path.write_text(EVERY_FIELD)
    return path


#: the fields of image tasks (tests/test_prompt_templates_images.py): the images' place and EZPoints' formula
IMAGE_TASK_FIELDS = ("image", "formula", "text_formula")


def test_the_test_template_writes_every_field():
    assert all(f"{{{name}}}" in EVERY_FIELD for name in [*FIELDS, *FIELD_ALIASES] if name not in IMAGE_TASK_FIELDS)


def _expected(task, observations, actions):
    """The prompt of step ``len(actions)`` of the test template, written out from a real Sokoban's text (history 2,
    first_step_number 1, history_item bracketed, admissible_actions quoted_indent)."""
    choose = "Choose from ['up'\n 'down'\n 'left'\n 'right'].\n"
    taken = len(actions)
    if taken == 0:
        return f"First look at {task}: {observations[0]}\n{choose}"
    shown = list(range(max(0, taken - 2), taken))
    history = "\n".join(f"[Observation {i + 1}: '{observations[i]}', Action {i + 1}: '{actions[i]}']" for i in shown)
    actions_text = "'up'\n 'down'\n 'left'\n 'right'"
    return (
        f"\nTask: {task}\nStep {taken + 1} ({taken} taken, limit 3); {len(shown)} shown:\n{history}\n"
        f"Now: {observations[taken]}\n{choose}"
        f"Spellings: {task}|{observations[taken]}|{actions_text}|{taken}|{taken + 1}|{len(shown)}\n"
        f"{history}={history}\n"
    )


def test_every_field_renders_exactly_through_the_episode_runner(tokenizer, every_field):
    """The episode runner (verl's agent loop and the local engine both play episodes with it) fills the template:
    the first step with its first-step section, later steps with the step section and the reference's layouts."""
    options = PromptOptions.from_config(
        {
            "template": str(every_field),
            "history_item": "bracketed",
            "admissible_actions": "quoted_indent",
            "first_step_number": 1,
        }
    )
    config = EpisodeConfig(
        max_steps=3, history_length=2, max_prompt_length=8192, max_response_length=64, prompt=options
    )
    replies = [f"<think>try</think><action>{action}</action>" for action in SCRIPT]

    class Scripted:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return GenerationOutput(token_ids=tokenizer.encode(replies.pop(0), add_special_tokens=False))

    episode = asyncio.run(
        run_episode(
            TaskSpec("sokoban", seed=0),
            generator=Scripted(),
            encoder=ChatPromptEncoder(tokenizer),
            tokenizer=tokenizer,
            config=config,
            traj_id="t",
            sampling_params={},
        )
    )
    assert episode.env_error is None and [s.action for s in episode.steps] == SCRIPT
    env = make_env("sokoban", max_steps=3)  # the same task played by hand: the text the prompts must show
    observation, info = env.reset(seed=0)
    observations = [observation]
    for action in SCRIPT[:2]:
        observations.append(env.step(action)[0])
    for taken, step in enumerate(episode.steps):
        assert step.prompt_text == _expected(info["task"], observations, SCRIPT[:taken])
        assert step.prompt_ids == ChatPromptEncoder(tokenizer)(step.prompt_text)


def test_both_engines_and_the_recipes_select_a_template(every_field, caplog):
    """The local engine's config, verl's config and a paper recipe's PROMPT_TEMPLATE give the same options; the
    recipe also sets the reference's layouts of its environment and leaves no moot key behind (no warning)."""
    local = load_config([f"env.prompt.template={every_field}", "env.prompt.history_item=bracketed"])
    assert local.env.prompt.template == str(every_field) and local.env.prompt.history_item == "bracketed"
    with caplog.at_level(logging.WARNING, logger="verl_gigpo.rollout.prompts"):
        cfg, _ = compose_recipe("alfworld", PROMPT_TEMPLATE=str(every_field))
        options = episode_config_from(cfg).prompt
    assert options.template == str(every_field.resolve())
    assert (options.history_item, options.style.admissible_actions) == ("bracketed", "quoted_indent")
    assert options.style.show_step_limit and options.style.first_step_number == 1
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]
    cfg, _ = compose_recipe("search", PROMPT_TEMPLATE=str(every_field))
    assert episode_config_from(cfg).prompt.history_item == "step_blocks"
    assert compose_recipe("sokoban")[0].env.prompt.template is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("Task: {task} {colour}", r"unknown field \{colour\} in its step section; known fields: task, observation"),
        ("--- gigpo prompt: intro ---\nx\n", "unknown section 'intro'"),
        ("--- gigpo prompt: first_step ---\n{task}\n", "no 'step' section"),
        ("a {task", "not a format string"),
        ("{}", r"unknown field \{\}"),
    ],
)
def test_a_bad_template_is_one_line_naming_the_key_and_the_field(tmp_path, text, match):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as err:
        PromptOptions.from_config({"template": str(path)})
    assert str(err.value).startswith(f"env.prompt.template={path}: ") and "\n" not in str(err.value)


def test_a_missing_file_and_a_bad_layout_name_the_key(tmp_path):
    """Both engines refuse a missing template before starting: the local config, and verl's preflight."""
    with pytest.raises(ValueError, match=r"env.prompt.template=.*nope.txt: cannot read it \(FileNotFoundError\)"):
        load_config([f"env.prompt.template={tmp_path / 'nope.txt'}"])
    cfg, _ = compose_recipe("sokoban", f"env.prompt.template={tmp_path / 'nope.txt'}")
    problems = [p for p in config_problems(cfg) if "env.prompt.template" in p]
    assert len(problems) == 1 and problems[0].startswith(f"env.prompt.template={tmp_path / 'nope.txt'}: cannot read")
    with pytest.raises(ValueError, match="env.prompt.history_item='json' must be one of"):
        PromptOptions.from_config({"history_item": "json"})


def test_a_key_the_template_makes_moot_is_warned_about(every_field, caplog):
    with caplog.at_level(logging.WARNING, logger="verl_gigpo.rollout.prompts"):
        PromptOptions.from_config({"template": str(every_field), "show_step_limit": False})
        PromptOptions.from_config({"history_item": "step_blocks"})
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("env.prompt.show_step_limit=false has no effect with env.prompt.template") for m in messages
    )
    assert any(m.startswith("env.prompt.history_item=step_blocks has no effect without") for m in messages)


def test_history_dropped_for_the_budget_gives_the_first_step_section(tmp_path, tokenizer):
    """``overlong=drop_history`` drops history items from a template's prompt; with none left the first-step section
    is the prompt (as the reference's WebShop falls back to its no-history template)."""
    path = tmp_path / "t.txt"
    path.write_text(
        "--- gigpo prompt: step ---\n{history}|{observation}\n--- gigpo prompt: first_step ---\nalone: {observation}\n"
    )
    env = make_env("gridnav", max_steps=5)
    obs, info = env.reset(seed=0)
    history = []
    for action in ["left", "left"]:
        history.append((obs, action))
        obs, _, terminated, _, info = env.step(action)
        assert not terminated
    encoder = ChatPromptEncoder(tokenizer)
    options = PromptOptions.from_config({"template": str(path), "history_item": "bracketed"})

    def build(budget):
        config = EpisodeConfig(history_length=2, max_prompt_length=budget, prompt=options)
        return build_prompt(env, obs, info, history, encoder, config)

    full, ids, used, cut = build(4096)
    items = [f"[Observation {i}: '{o}', Action {i}: '{a}']" for i, (o, a) in enumerate(history)]
    assert (full, used, cut) == ("\n".join(items) + f"|{obs}\n", 2, False) and ids == encoder(full)
    one = f"{items[1]}|{obs}\n"  # the oldest item dropped
    assert build(len(encoder(one)))[:3] == (one, encoder(one), 1)
    alone = f"alone: {obs}\n"
    assert build(len(encoder(alone))) == (alone, encoder(alone), 0, False)


# ------------------------------------------------------------------------------------------------ from-reference
#: the mini-checkout: the reference's paths and variable names and field spellings, with this project's own text
MINI_CHECKOUT = {
    "alfworld": (
        "import not_installed_anywhere  # never imported: the file is read, not run\n"
        'ALFWORLD_TEMPLATE_NO_HIS = """\nHouse robot. Seen: {current_observation}\n'
        'Pick one: [{admissible_actions}].\n"""\n'
        'ALFWORLD_TEMPLATE = """\nHouse robot, goal {task_description}. {step_count} moves so far, last '
        "{history_length}: {action_history}\nMove {current_step}, seen: {current_observation}\n"
        'Pick one: [{admissible_actions}].\n"""\n'
    ),
    "sokoban": 'SOKOBAN_TEMPLATE = """Boxes.\n{action_history}\nGrid {current_step}:\n{current_observation}\n"""\n',
    "search": 'SEARCH_TEMPLATE = """\nQ: {task_description} {tone_of_voice}\n"""\n',
}


def _checkout(root: Path) -> Path:
    for env, text in MINI_CHECKOUT.items():
        path = root / "agent_system" / "environments" / "prompts" / f"{env}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_from_reference_writes_templates_from_a_checkout(tmp_path, capsys):
    checkout, out = _checkout(tmp_path / "verl-agent"), tmp_path / "out"
    assert main(["from-reference", str(checkout), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["alfworld.txt", "sokoban.txt"]
    alfworld = load_template(out / "alfworld.txt")
    assert alfworld.first_step == "\nHouse robot. Seen: {current_observation}\nPick one: [{admissible_actions}].\n"
    assert alfworld.step.startswith("\nHouse robot, goal {task_description}.") and alfworld.step.endswith("].\n")
    assert load_template(out / "sokoban.txt").first_step is None
    assert f"alfworld: wrote {out / 'alfworld.txt'}; use it with: env.prompt.template={out / 'alfworld.txt'} " in (
        printed.out
    )
    assert "env.prompt.admissible_actions=quoted_indent" in printed.out
    assert "webshop: skipped: no " in printed.err and "unknown field {tone_of_voice}" in printed.err
    assert main(["from-reference", str(tmp_path / "nowhere")]) == 2


def test_no_generated_template_is_tracked_by_git():
    """Template files hold the user's copy of the reference's text: ``prompts/`` is ignored and none is tracked."""
    try:
        tracked = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert not [name for name in tracked if name.startswith("prompts/")]
    for name in tracked:
        if name.endswith(".txt"):
            assert not (ROOT / name).read_text(errors="replace").startswith("Written by python -m verl_gigpo.prompts")
    ignored = subprocess.run(["git", "check-ignore", "-q", "prompts/alfworld.txt"], cwd=ROOT, timeout=60)
    assert ignored.returncode == 0


# ---------------------------------------------------------------------------------------------------------- show
def _shown(out: str) -> tuple[str, list[str]]:
    """(the prompt between show's marker lines, show's comment lines after it)."""
    body = out.split("the prompt follows to the end marker\n", 1)[1]
    prompt, tail = body.split("# end of prompt\n")
    return prompt, tail.splitlines()


def test_show_prints_the_prompt_the_engines_build_and_its_tokens(tmp_path, tokenizer, tiny_model_dir, capsys):
    template = tmp_path / "t.txt"
    template.write_text("Step {step_number}: {observation}\n[{admissible_actions}]\n{history}\n")
    args = ["show", "--env", "sokoban", "--step", "3", "--model", str(tiny_model_dir)]
    assert main([*args, "--template", str(template), "--prompt", "history_item=bracketed"]) == 0
    prompt, tail = _shown(capsys.readouterr().out)
    env = make_env("sokoban", max_steps=50)
    observations = [env.reset(seed=0)[0]]
    observations += [env.step("up")[0] for _ in range(2)]  # show plays the first admissible action
    history = (
        f"[Observation 0: '{observations[0]}', Action 0: 'up']\n[Observation 1: '{observations[1]}', Action 1: 'up']"
    )
    assert prompt == f"Step 2: {observations[2]}\n[up, down, left, right]\n{history}\n"
    tokens = len(ChatPromptEncoder(tokenizer)(prompt))
    assert tail == [f"# {tokens} tokens under {tiny_model_dir}'s chat template: fits data.max_prompt_length=1024"]
    assert main([*args, "--max-prompt-length", "20"]) == 0  # the environment's own prompt, over a small budget
    prompt, tail = _shown(capsys.readouterr().out)
    assert prompt.startswith("You are an expert Sokoban player.\n") and "Recent history:\nObservation 0:" in prompt
    assert "OVER data.max_prompt_length=20 by" in tail[0] and "env.prompt.overlong=drop_history" in tail[0]
    assert main(["show", "--env", "sokoban", "--step", "0"]) == 2
