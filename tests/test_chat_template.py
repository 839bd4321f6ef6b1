"""``data.apply_chat_template_kwargs`` on both engines: the prompt the model sees with a Qwen3-style thinking switch.

The tiny test model gets a chat template written for this test that reads ``enable_thinking`` the way Qwen3's does:
when it is false, the generation prompt is followed by an empty think block (the model is told it has finished
thinking and answers at once); when it is true or not given, nothing follows. The prompts are rendered by the real
code paths:

* verl's agent loop: a recipe's command (``DRY_RUN=1 THINKING=...``) composed with Hydra, and the
  ``gigpo_env_agent`` loop built from it as verl's ``AgentLoopWorker._run_agent_loop`` builds one
  (``hydra.utils.instantiate`` of the registered agent loop with the trainer and data configs); no Ray worker is
  needed to construct it, and the prompt comes from :func:`verl_gigpo.rollout.build_prompt` with the loop's own
  encoder and episode settings, as :func:`verl_gigpo.rollout.run_episode` calls it;
* the local engine: :class:`verl_gigpo.local.rollout.LocalRollout` built from a validated local config.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from recipe_config import compose_recipe
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_gigpo import AGENT_LOOP_NAME
from verl_gigpo.local.config import load_config
from verl_gigpo.local.rollout import LocalRollout
from verl_gigpo.rollout import ChatPromptEncoder, TaskSpec, build_prompt, chat_template_kwargs_from, make_task_env
from verl_gigpo.verl_glue.preflight import config_problems

ROOT = Path(__file__).resolve().parents[1]

#: A chat template in the style of Qwen3's, written for this test: ChatML turns, and with enable_thinking=false an
#: empty think block after the generation prompt.
QWEN3_STYLE_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"


def expected_prompt(text: str, thinking_off: bool) -> str:
    """What the model sees for one user turn ``text`` under :data:`QWEN3_STYLE_TEMPLATE`."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" + (EMPTY_THINK if thinking_off else "")


@pytest.fixture(scope="module")
def qwen3_style_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The session's tiny model, copied, with :data:`QWEN3_STYLE_TEMPLATE` as its tokenizer's chat template."""
    out = tmp_path_factory.mktemp("qwen3-style") / "model"
    shutil.copytree(tiny_model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(qwen3_style_dir):
    loaded = AutoTokenizer.from_pretrained(qwen3_style_dir)
    assert loaded.chat_template == QWEN3_STYLE_TEMPLATE  # the copy's tokenizer carries the switch
    return loaded


def verl_agent_loop(cfg, tokenizer):
    """The ``gigpo_env_agent`` loop, built from a composed trainer config as verl's
    ``AgentLoopWorker._run_agent_loop`` builds it (no LLM server: only its prompt side is used)."""
    return hydra.utils.instantiate(
        config=_agent_loop_registry[AGENT_LOOP_NAME],
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )


def compose_verl(*overrides: str):
    """verl's ppo_trainer + config/gigpo_trainer.yaml with ``overrides`` (what ``python -m verl_gigpo.main`` runs)."""
    with initialize_config_dir(config_dir=str(ROOT / "verl_gigpo" / "config"), version_base=None):
        return compose(config_name="gigpo_trainer", overrides=list(overrides))


@pytest.mark.parametrize("thinking", [None, "0", "1"])
def test_recipe_thinking_switch_reaches_the_prompt_of_verls_agent_loop(
    thinking, qwen3_style_dir, tokenizer, tmp_path, monkeypatch
):
    """``THINKING=0`` in a recipe: verl's agent loop shows the model an empty think block after the generation
    prompt; ``THINKING=1`` and unset: the plain generation prompt (Qwen3's template thinks by default)."""
    monkeypatch.delenv("THINKING", raising=False)
    env = {"THINKING": thinking} if thinking is not None else {}
    cfg, _ = compose_recipe(
        "sokoban", DEVICE="cpu", MODEL_PATH=str(qwen3_style_dir), DATA_DIR=str(tmp_path), OBSERVATION="text", **env
    )  # the text Sokoban: a text model
    switch = {None: {}, "0": {"enable_thinking": False}, "1": {"enable_thinking": True}}[thinking]
    assert OmegaConf.to_container(cfg.data.apply_chat_template_kwargs) == switch
    loop = verl_agent_loop(cfg, tokenizer)
    task_env = make_task_env(TaskSpec(loop.default_env_name, seed=0, env_kwargs=loop.env_kwargs), loop.episode_config)
    obs, info = task_env.reset(seed=0)
    text, ids, history_used, truncated = build_prompt(task_env, obs, info, [], loop.encoder, loop.episode_config)
    task_env.close()
    assert not truncated and history_used == 0
    assert tokenizer.decode(ids) == expected_prompt(text, thinking_off=thinking == "0")


@pytest.mark.parametrize(
    ("overrides", "thinking_off"),
    [
        ((), False),
        (("data.apply_chat_template_kwargs.enable_thinking=false",), True),
        (("data.apply_chat_template_kwargs.enable_thinking=true",), False),
    ],
)
def test_the_local_engine_renders_the_prompt_verls_agent_loop_renders(
    overrides, thinking_off, qwen3_style_dir, tokenizer
):
    """The same key on the local engine (``data.apply_chat_template_kwargs``, in local_trainer.yaml) gives the
    prompt ids verl's agent loop gives with it."""
    text = "walls: north. goal: right 3."
    local = LocalRollout(load_config([f"actor_rollout_ref.model.path={qwen3_style_dir}", *overrides]))
    try:
        local_ids = local.encoder(text)
    finally:
        local.close()
    cfg = compose_verl(
        "env.name=gridnav", f"actor_rollout_ref.model.path={qwen3_style_dir}", *("+" + o for o in overrides)
    )
    verl_ids = verl_agent_loop(cfg, tokenizer).encoder(text)
    assert local_ids == verl_ids
    assert local.tokenizer.decode(local_ids) == expected_prompt(text, thinking_off)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3", r"data\.apply_chat_template_kwargs\b.*mapping"),
        ("{tokenize: true}", r"data\.apply_chat_template_kwargs\.tokenize\b.*episode runner"),
        ("{add_generation_prompt: false}", "data.apply_chat_template_kwargs.add_generation_prompt is set by"),
    ],
)
def test_bad_chat_template_kwargs_are_refused_by_both_engines_naming_the_key(value, message, qwen3_style_dir):
    with pytest.raises(ValueError, match=message):
        load_config([f"actor_rollout_ref.model.path={qwen3_style_dir}", f"data.apply_chat_template_kwargs={value}"])
    cfg = compose_verl("env.name=gridnav", f"actor_rollout_ref.model.path={qwen3_style_dir}")
    OmegaConf.update(cfg, "data.apply_chat_template_kwargs", OmegaConf.from_dotlist([f"v={value}"]).v, merge=False)
    assert [p for p in config_problems(cfg) if re.match(message, p)], config_problems(cfg)


def test_kwargs_become_plain_containers_and_nested_values_survive():
    node = OmegaConf.create({"enable_thinking": False, "tools_hint": {"names": ["a", "b"]}})
    plain = chat_template_kwargs_from(node)
    assert plain == {"enable_thinking": False, "tools_hint": {"names": ["a", "b"]}}
    assert type(plain["tools_hint"]) is dict and type(plain["tools_hint"]["names"]) is list
    assert chat_template_kwargs_from(None) == {}


def test_a_switch_the_template_reads_is_not_reported(tokenizer, caplog):
    """enable_thinking=true renders what the template's default renders, but the template reads it: no warning."""
    caplog.set_level(logging.WARNING, logger="verl_gigpo.rollout.episode")
    for value in (True, False):
        ChatPromptEncoder(tokenizer, chat_template_kwargs={"enable_thinking": value})
    assert "chat-template arguments" not in caplog.text


def test_a_switch_the_template_does_not_read_is_reported(tiny_model_dir, caplog):
    """The tiny model's own template reads no switch, and a tokenizer without a template renders raw text: the
    arguments then change nothing, which is logged instead of passing silently."""
    plain = AutoTokenizer.from_pretrained(tiny_model_dir)
    caplog.set_level(logging.WARNING, logger="verl_gigpo.rollout.episode")
    encoder = ChatPromptEncoder(plain, chat_template_kwargs={"reasoning_effort": "low"})
    assert encoder("x") == ChatPromptEncoder(plain)("x")
    assert "chat-template arguments (reasoning_effort) change nothing" in caplog.text
    plain.chat_template = None
    ChatPromptEncoder(plain, chat_template_kwargs={"reasoning_effort": "low"})
    assert "(reasoning_effort) are ignored: the tokenizer has no chat template" in caplog.text
