"""CPU tests of the image tasks' prompt templates: ``from-reference`` on a synthetic mini-checkout (this project's own
wording at the reference's paths and string names) writes visual Sokoban's and the card games' templates; the one
prompt builder fills them for real environments, EZPoints' formula included, and puts the images where ``{image}``
stands, in the text and in the tiny vision model's prompt ids; ``show`` prints such a prompt.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
from recipe_config import compose_recipe
from verl.utils.tokenizer import hf_processor

from environments import make_env
from verl_gigpo.prompts.__main__ import main
from verl_gigpo.prompts.reference import REFERENCE_TEMPLATES, read_reference_template
from verl_gigpo.rollout import ChatPromptEncoder, EpisodeConfig, PromptOptions, build_prompt
from verl_gigpo.rollout.prompts import FIELD_ALIASES, FIELDS, IMAGE_MARK, image_parts, load_template
from verl_gigpo.verl_glue.agent_loop import episode_config_from

ROOT = Path(__file__).resolve().parents[1]

#: the strings of a mini-checkout, in this project's own words, laid out as the reference's files hold them. The
#: reference formats EZPoints' string only: the others' braces reach the model as written.
SOKOBAN_VISUAL = '\nCrates game. The room now: <image>\nReply {"move": "up"}.\n'
NUMBERLINE = '\n<image>Walk the marker onto the goal. Reply {"step": "+"}.\n'
BLACKJACK = "\n<image>A hand of cards: hit or stand.\n"
EZPOINTS = '\n<image>Make twelve. So far: \'{text_formula}\'. Reply {{"symbol": "+"}}.\n'
MINI_CHECKOUT = {
    "sokoban": (
        'SOKOBAN_TEMPLATE = """Push.\\n{current_observation}\\n"""\n'
        f'SOKOBAN_VISUAL_TEMPLATE = """{SOKOBAN_VISUAL}"""\n'
    ),
    "gym_cards": (
        f'GYM_CARDS_NUMBERLINE_TEMPLATE = """{NUMBERLINE}"""\n'
        f'GYM_CARDS_BLACKJACK_TEMPLATE = """{BLACKJACK}"""\n'
        f'GYM_CARDS_EZPOINTS_TEMPLATE = """{EZPOINTS}"""\n'
    ),
}


#: the fields only the image tasks fill (tests/test_prompt_templates.py's every-field template leaves them out)
IMAGE_TASK_FIELDS = ("image", "formula", "text_formula")


def _shown(out: str) -> tuple[str, list[str]]:
    """(the prompt between show's marker lines, show's comment lines after it)."""
    prompt, tail = out.split("the prompt follows to the end marker\n", 1)[1].split("# end of prompt\n")
    return prompt, tail.splitlines()


def _checkout(root: Path, files: dict[str, str] = MINI_CHECKOUT) -> Path:
    for name, text in files.items():
        path = root / "agent_system" / "environments" / "prompts" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def written(tmp_path, capsys) -> tuple[Path, str]:
    """The folder from-reference wrote the mini-checkout's templates into, and what it printed."""
    out = tmp_path / "out"
    assert main(["from-reference", str(_checkout(tmp_path / "verl-agent")), "--out", str(out)]) == 0
    return out, capsys.readouterr().out


def _config(template: Path | None) -> EpisodeConfig:
    prompt = PromptOptions.from_config({"template": str(template)} if template else None)
    return EpisodeConfig(max_steps=15, history_length=0, max_prompt_length=4096, prompt=prompt)


def test_the_image_task_fields_are_the_builders():
    assert set(IMAGE_TASK_FIELDS) <= {*FIELDS, *FIELD_ALIASES} and FIELD_ALIASES["text_formula"] == "formula"


def test_from_reference_writes_the_image_templates(written):
    out, printed = written
    names = ["blackjack.txt", "ezpoints.txt", "numberline.txt", "sokoban.txt", "sokoban_image.txt"]
    assert sorted(p.name for p in out.iterdir()) == names
    for name in ("sokoban_image", "ezpoints", "numberline", "blackjack"):
        overrides = f"env.prompt.template={out / name}.txt env.history_length=0 +env.kwargs.observation=image\n"
        assert f"{name}: wrote {out / name}.txt; use it with: {overrides}" in printed
        assert load_template(out / f"{name}.txt").first_step is None
    assert load_template(out / "sokoban_image.txt").step == SOKOBAN_VISUAL.replace("{", "{{").replace(
        "}", "}}"
    ).replace("<image>", "{image}")
    assert load_template(out / "ezpoints.txt").step == EZPOINTS.replace("<image>", "{image}")


@pytest.mark.parametrize(
    ("env_name", "reference", "moves"),
    [("sokoban", SOKOBAN_VISUAL, ["up"]), ("numberline", NUMBERLINE, ["+"]), ("blackjack", BLACKJACK, [])],
)
def test_an_unformatted_reference_string_is_the_prompt_as_written(written, env_name, reference, moves):
    name = "sokoban_image" if env_name == "sokoban" else env_name
    env = make_env(env_name, observation="image")
    observation, info = env.reset(seed=3)
    for move in moves:
        observation, *_, info = env.step(move)
    text, _, used, _ = build_prompt(env, observation, info, [], lambda t: [], _config(written[0] / f"{name}.txt"), [])
    assert (text, used) == (reference, 0)  # IMAGE_MARK is the reference's own mark: every character as it has it
    assert IMAGE_MARK == "<image>"


def test_ezpoints_fills_the_formula_and_the_image_goes_where_the_template_says(written, tiny_vl_model_dir):
    env = make_env("ezpoints", observation="image")
    observation, info = env.reset(seed=5)
    for move in (str(env.values[0]), "+"):
        observation, *_, info = env.step(move)
    formula = f"{env.values[0]}+"
    assert env.formula == [str(env.values[0]), "+"]
    config = _config(written[0] / "ezpoints.txt")
    processor = hf_processor(str(tiny_vl_model_dir), trust_remote_code=True)
    encoder = ChatPromptEncoder(processor.tokenizer, processor=processor)
    text, ids, _, _ = build_prompt(env, observation, info, [], encoder, config)
    assert text == EZPOINTS.format(text_formula=formula)
    assert image_parts(text, 1) == [
        {"type": "text", "text": "\n"},
        {"type": "image"},
        {"type": "text", "text": text.split(IMAGE_MARK)[1]},
    ]
    tokenizer, start = processor.tokenizer, processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    before = tokenizer.decode(ids[: ids.index(start)])
    after = tokenizer.decode(ids[ids.index(start) :], skip_special_tokens=True)
    assert before.endswith("user\n\n") and after.startswith("Make twelve.") and f"'{formula}'" in after
    # the environment's own prompt (no template) keeps the images before the whole text
    own_text, own_ids, _, _ = build_prompt(env, observation, info, [], encoder, _config(None))
    assert IMAGE_MARK not in own_text and tokenizer.decode(own_ids[: own_ids.index(start)]).endswith("user\n")
    assert ids.count(start) == own_ids.count(start) == 1


def test_a_field_the_environment_does_not_fill_is_named(tmp_path, monkeypatch):
    template = tmp_path / "t.txt"
    template.write_text("{image}Formula {text_formula}\n")
    env = make_env("blackjack", observation="image")
    observation, info = env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\{formula\} or \{text_formula\}, which blackjack does not fill"):
        build_prompt(env, observation, info, [], lambda t: [], _config(template), [])
    # from-reference checks each image template on its own environment before writing it
    blackjack = REFERENCE_TEMPLATES["blackjack"]
    monkeypatch.setitem(REFERENCE_TEMPLATES, "blackjack", dataclasses.replace(blackjack, formatted=True))
    checkout = _checkout(tmp_path / "a", {"gym_cards": 'GYM_CARDS_BLACKJACK_TEMPLATE = "<image>{text_formula}"\n'})
    with pytest.raises(ValueError, match=r"GYM_CARDS_BLACKJACK_TEMPLATE: .*\{text_formula\}, which blackjack"):
        read_reference_template(checkout, "blackjack")


def test_from_reference_skips_a_card_template_without_one_image_mark(tmp_path, capsys):
    files = {
        "gym_cards": 'GYM_CARDS_BLACKJACK_TEMPLATE = "<image>Hit? <image>"\nGYM_CARDS_EZPOINTS_TEMPLATE = "Twelve."\n'
    }
    out = tmp_path / "out"
    assert main(["from-reference", str(_checkout(tmp_path / "b", files)), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "blackjack: skipped: " in err and "holds <image> 2 times" in err
    assert "ezpoints: skipped: " in err and "holds <image> 0 times" in err
    assert "numberline: skipped: " in err and "no module-level string GYM_CARDS_NUMBERLINE_TEMPLATE" in err


def test_image_parts_place_the_images_at_the_mark_or_first():
    assert image_parts("look", 2) == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "look"}]
    assert image_parts(f"a {IMAGE_MARK}", 1) == [{"type": "text", "text": "a "}, {"type": "image"}]
    with pytest.raises(ValueError, match="holds <image> 2 times"):
        image_parts(f"{IMAGE_MARK}{IMAGE_MARK}", 1)


def test_show_prints_a_card_prompt_with_its_image_mark(written, capsys):
    template = written[0] / "blackjack.txt"
    args = ["show", "--env", "blackjack", "--step", "1", "--template", str(template)]
    assert main([*args, "--env-kwargs", '{"observation": "image"}']) == 0
    prompt, tail = _shown(capsys.readouterr().out)
    assert prompt == BLACKJACK
    assert tail[-1].startswith("# 1 image(s) at the observation, placed where the text holds <image>")


def test_the_image_recipes_take_the_written_templates(written):
    """PROMPT_TEMPLATE of a card recipe and of the image Sokoban recipe selects the file, with the settings the
    reference's image prompts need (images, no history) already the recipes' defaults."""
    for recipe, name in (("ezpoints", "ezpoints"), ("sokoban", "sokoban_image")):
        cfg, _ = compose_recipe(recipe, PROMPT_TEMPLATE=str(written[0] / f"{name}.txt"))
        assert episode_config_from(cfg).prompt.template == str(written[0] / f"{name}.txt")
        assert (cfg.env.history_length, cfg.env.kwargs.observation) == (0, "image")
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / "run_sokoban.sh")],
        env={**os.environ, "DRY_RUN": "1", "PROMPT_TEMPLATE": "/nowhere/t.txt"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "e.g. ~/gigpo-prompts/sokoban_image.txt" in proc.stderr.splitlines()[-1]
