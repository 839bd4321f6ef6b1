"""Validate that an environment follows the contract of :mod:`environments.base`.

    python -m environments.checker sokoban
    python -m environments.checker alfworld --set data_path=/path/to/alfworld_data --seeds 2
    python -m environments.checker my_envs.counter:CounterEnv       # your own environment, by its class

:func:`check_env` runs every check and raises :class:`EnvCheckError` listing all failures:

* types: ``reset``/``step`` return shapes and the types of every ``info`` entry;
* seeded determinism: the same seed and the same random action sequence give the same transcript, even
  after an episode with another seed in between (no state leaks across resets);
* step determinism: each transition (observation, reward, flags, info) replays identically;
* key stability: each pair of paths from ``env.checker_paths()`` reaches the same state digest, and the
  same anchor key in the ``state`` and ``observation`` key modes;
* ``parse_action`` totality under both invalid-action rules: fuzzed inputs (empty, huge, binary-looking, unicode,
  several tags, no tags, tags repeated up to the parse limit) never raise and do not touch the state; under
  ``admissible`` they return ``(str, True)`` or ``(None, False)``, under ``format`` ``(str or None, bool)``; the
  ``example_reply`` of every example action parses to that action, valid, under both rules;
* ``reset`` options: a non-dict ``options`` is a ``ValueError`` that names ``options``, an unknown option one that
  names it;
* the invalid-action step: ``step(None)`` leaves the state unchanged, says so, and counts toward the step limit;
* an unmatched command (what the ``format`` rule sends for a well-formed reply that is no action here):
  ``step(UNMATCHED_PROBE)`` leaves the ``state`` key unchanged, reports ``action_valid`` False, does not end the
  episode and counts toward the step limit. The random walks of the determinism check send it too.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from environments.base import INFO_KEYS, INVALID_ACTION_RULES, INVALID_ACTION_TEXT, TextEnv
from environments.images import IMAGE_INFO_KEY, pixel_key

__all__ = ["UNMATCHED_PROBE", "EnvCheckError", "check_env", "main"]

#: A command no environment knows: what the ``format`` rule sends for ``<action>UNMATCHED_PROBE</action>``.
UNMATCHED_PROBE = "zz not an action zz"


class EnvCheckError(AssertionError):
    """One or more contract checks failed; ``failures`` lists them."""

    def __init__(self, env_name: str, failures: list[str]):
        self.failures = failures
        super().__init__(f"{env_name}: {len(failures)} check(s) failed:\n  - " + "\n  - ".join(failures))


FUZZ_INPUTS: list[Any] = [
    "",
    " ",
    "\n\n\t",
    "<action></action>",
    "<action>   </action>",
    "<action>",
    "</action>",
    "<action>up</action><action>down</action>",
    "<think>x</think>",
    "<think><action>up</action>",
    "<ACTION>up</ACTION>",
    "<action><action>up</action></action>",
    "\x00\x01\x02\xff\xfe",
    b"\xff\xfe<action>up</action>",
    "💥" * 1000,
    "a" * 200_000,
    "<action>" + "x" * 100_000 + "</action>",
    "search[<action>click[buy now]</action>]",
    "click[" * 500,
    "<action>" * 8192,  # unclosed tags repeated up to the parse limit: linear parsing, not a rescan per tag
    "<think>" * 9362,
    "<ACTION>" * 8191 + "</action>",
    "</action>" * 7000,
    None,
    12345,
]


def _random_text(rng: np.random.Generator) -> str:
    pieces = ["<action>", "</action>", "<think>", "</think>", "[", "]", "click", "search", "up", " ", "\n", "é", "\x00"]
    out = []
    for _ in range(int(rng.integers(0, 20))):
        if rng.random() < 0.5:
            out.append(pieces[int(rng.integers(len(pieces)))])
        else:
            out.append("".join(chr(int(c)) for c in rng.integers(1, 0x3000, size=int(rng.integers(1, 8)))))
    return "".join(out)


def _check_info(info: Any, where: str, failures: list[str], env: TextEnv | None = None) -> None:
    if not isinstance(info, dict):
        failures.append(f"{where}: info must be a dict, got {type(info).__name__}")
        return
    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        failures.append(f"{where}: info lacks {missing}")
        return
    expect = {
        "anchor_key": str,
        "won": bool,
        "task": str,
        "task_id": str,
        "action_valid": bool,
        "step": int,
        "env_name": str,
    }
    for key, typ in expect.items():
        if not isinstance(info[key], typ):
            failures.append(f"{where}: info[{key!r}] must be {typ.__name__}, got {type(info[key]).__name__}")
    adm = info["admissible_actions"]
    if adm is not None and not (isinstance(adm, list) and all(isinstance(a, str) for a in adm)):
        failures.append(f"{where}: info['admissible_actions'] must be list[str] or None")
    if info["task_type"] is not None and not isinstance(info["task_type"], str):
        failures.append(f"{where}: info['task_type'] must be str or None")
    if env is not None:
        _check_images(info, where, env, failures)


def _check_images(info: dict[str, Any], where: str, env: TextEnv, failures: list[str]) -> None:
    """The image part: ``images_per_step`` RGB PIL images within ``max_image_pixels`` when declared, none else."""
    from PIL import Image

    count = int(getattr(env, "images_per_step", 0))
    images = info.get(IMAGE_INFO_KEY)
    if not count:
        if images is not None:
            failures.append(f"{where}: info['images'] is set but the environment declares images_per_step=0")
        return
    if not isinstance(images, list) or len(images) != count:
        failures.append(f"{where}: info['images'] must be a list of images_per_step={count} images, got {images!r:.80}")
        return
    for image in images:
        if not isinstance(image, Image.Image) or image.mode != "RGB":
            failures.append(f"{where}: every info['images'] entry must be an RGB PIL image, got {image!r:.80}")
        elif not 0 < image.size[0] * image.size[1] <= env.max_image_pixels:
            failures.append(f"{where}: image of {image.size} outside (0, max_image_pixels={env.max_image_pixels}]")


def _comparable(info: dict[str, Any]) -> str:
    """``info`` as canonical JSON (images as the sha1 of their pixels)."""
    if IMAGE_INFO_KEY in info:
        info = {**info, IMAGE_INFO_KEY: [pixel_key(image) for image in info[IMAGE_INFO_KEY]]}
    return json.dumps(info, sort_keys=True, default=repr)


def _play(env: TextEnv, seed: int, split: str, action_seed: int, n_steps: int) -> list[str]:
    """Reset with ``seed`` and take up to ``n_steps`` random example actions (some invalid steps, some unmatched
    commands); return a transcript."""
    rng = np.random.default_rng(action_seed)
    obs, info = env.reset(seed=seed, options={"split": split})
    transcript = [obs, _comparable(info)]
    for _ in range(n_steps):
        choices = env.example_actions()
        draw = rng.random()
        if not choices or draw < 0.1:
            action = None
        elif draw < 0.2:
            action = UNMATCHED_PROBE
        else:
            action = choices[int(rng.integers(len(choices)))]
        obs, reward, terminated, truncated, info = env.step(action)
        transcript += [repr(action), obs, repr(reward), repr(terminated), repr(truncated), _comparable(info)]
        if terminated or truncated:
            break
    return transcript


def _walk(env: TextEnv, seed: int, split: str, path: list[str | None]) -> dict[str, str]:
    """Reset with ``seed``, take the actions of ``path`` (stopping where the episode ends) and return the
    ``state`` and ``observation`` anchor keys of the state reached."""
    env.reset(seed=seed, options={"split": split})
    for action in path:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return {kind: env.anchor_key(kind) for kind in ("state", "observation")}


def _check_types(env: TextEnv, seed: int, split: str, failures: list[str]) -> None:
    """``reset`` and one ``step`` return the documented shapes, and every ``info`` entry has its type."""
    obs, info = env.reset(seed=seed, options={"split": split})
    if not isinstance(obs, str):
        failures.append(f"reset: observation must be str, got {type(obs).__name__}")
    _check_info(info, "reset", failures, env)
    if info.get("step") != 0 or info.get("action_valid") is not True:
        failures.append("reset: info['step'] must be 0 and info['action_valid'] True")
    choices = env.example_actions()
    if not choices:
        failures.append("example_actions() is empty right after reset: the checker cannot exercise step()")
        return
    out = env.step(choices[0])
    if not (isinstance(out, tuple) and len(out) == 5):
        failures.append("step must return a 5-tuple (obs, reward, terminated, truncated, info)")
        return
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        failures.append("step: observation must be str")
    if not isinstance(reward, float):
        failures.append(f"step: reward must be float, got {type(reward).__name__}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        failures.append("step: terminated and truncated must be bool")
    _check_info(info, "step", failures, env)


def _check_determinism(env: TextEnv, seeds: tuple[int, ...], split: str, n_steps: int, failures: list[str]) -> int:
    """Seeded and step determinism: replaying a seed's random actions gives the same transcript, with another
    seed played in between, and ``reset(seed)`` rebuilds the same task. Returns the transitions checked."""
    n_tasks = env.num_tasks(split)  # fixed task lists (e.g. ALFWorld eval splits): the other seed stays in range
    transitions = 0
    for i, seed in enumerate(seeds):
        other = seed + 7919 if n_tasks is None else (seed + 1) % n_tasks
        first = _play(env, seed, split, action_seed=1000 + i, n_steps=n_steps)
        _play(env, other, split, action_seed=2000 + i, n_steps=n_steps)
        second = _play(env, seed, split, action_seed=1000 + i, n_steps=n_steps)
        transitions += (len(first) - 2) // 6
        if first != second:
            at = next(j for j, (a, b) in enumerate(zip(first, second, strict=False)) if a != b) if first else 0
            failures.append(
                f"seed {seed}: replaying the same actions diverged at transcript item {at}: "
                f"{first[at][:200]!r} != {second[at][:200]!r}"
                if at < min(len(first), len(second))
                else f"seed {seed}: transcripts differ in length ({len(first)} vs {len(second)})"
            )
        # the same seed must give the same task whatever came before
        env.reset(seed=seed, options={"split": split})
        task_a = (env.task_id, env.task_description, env.anchor_key("state"))
        env.reset(seed=other, options={"split": split})
        env.reset(seed=seed, options={"split": split})
        if (env.task_id, env.task_description, env.anchor_key("state")) != task_a:
            failures.append(f"seed {seed}: reset(seed) did not rebuild the same task and initial state")
    return transitions


def _check_key_stability(env: TextEnv, seeds: tuple[int, ...], split: str, failures: list[str]) -> int:
    """Each pair of ``env.checker_paths()`` reaches the same state and the same ``state`` and ``observation``
    keys. Returns the path pairs checked."""
    pairs = 0
    for seed in seeds:
        env.reset(seed=seed, options={"split": split})
        for path_a, path_b in env.checker_paths():
            keys_a = _walk(env, seed, split, list(path_a))
            keys_b = _walk(env, seed, split, list(path_b))
            pairs += 1
            if keys_a["state"] != keys_b["state"]:
                failures.append(f"seed {seed}: paths {path_a} and {path_b} should reach the same state but do not")
            for kind in ("state", "observation"):
                if keys_a[kind] != keys_b[kind]:
                    failures.append(f"seed {seed}: {kind} keys differ for paths {path_a} and {path_b}")
    return pairs


def _check_parse_action(env: TextEnv, seed: int, split: str, failures: list[str]) -> int:
    """``parse_action`` is total and pure on fuzzed inputs under both rules, parses each example action's
    ``example_reply`` to that action (valid) under both, and leaves the state alone. Returns the inputs tried."""
    env.reset(seed=seed, options={"split": split})
    digest = env.anchor_key("state")
    rng = np.random.default_rng(0)
    examples = env.example_actions()[:10]
    inputs = FUZZ_INPUTS + [_random_text(rng) for _ in range(100)]
    inputs += [f"<think>ok</think><action>{a}</action>" for a in examples] + [env.example_reply(a) for a in examples]
    for rule in INVALID_ACTION_RULES:
        for text in inputs:
            try:
                out = env.parse_action(text, rule=rule)
                again = env.parse_action(text, rule=rule)
            except Exception as exc:  # noqa: BLE001 - the check is precisely that nothing escapes
                failures.append(f"parse_action(rule={rule!r}) raised {exc!r} on {repr(text)[:80]}")
                continue
            if out != again:
                failures.append(f"parse_action(rule={rule!r}) is not pure on {repr(text)[:80]}")
            if not (isinstance(out, tuple) and len(out) == 2):
                failures.append(f"parse_action(rule={rule!r}) must return a 2-tuple, got {out!r:.80}")
                continue
            command, valid = out
            if rule == "admissible":
                consistent = valid is (command is not None) and (command is None or isinstance(command, str))
            else:
                consistent = isinstance(valid, bool) and (command is None or isinstance(command, str))
            if not consistent:
                failures.append(f"parse_action(rule={rule!r}) returned inconsistent {out!r:.80} for {repr(text)[:80]}")
        for a in examples:
            try:
                parsed = env.parse_action(env.example_reply(a), rule=rule)
            except Exception as exc:  # noqa: BLE001 - the check is precisely that nothing escapes
                failures.append(f"parse_action(example_reply({a!r}), rule={rule!r}) raised {exc!r}")
                continue
            if parsed != (a, True):
                failures.append(f"parse_action(example_reply({a!r}), rule={rule!r}) gave {parsed!r:.80}")
    if env.anchor_key("state") != digest:
        failures.append("parse_action changed the environment state")
    return len(inputs)


def _check_reset_options(env: TextEnv, seed: int, split: str, failures: list[str]) -> None:
    """Reset options that are not a dict, or that name an option the environment does not accept, are a clear
    ``ValueError`` (naming ``options``, or the unknown option), not a confusing one."""
    for bad in (["x"], "train", 5):
        _expect_refused(env, seed, bad, "options", "options must be a dict", failures)
    unknown = {"split": split, "no_such_option": 1}
    _expect_refused(env, seed, unknown, "no_such_option", "unknown options must be refused", failures)


def _expect_refused(env: TextEnv, seed: int, options: Any, named: str, rule: str, failures: list[str]) -> None:
    """``env.reset(seed, options=options)`` must raise a ``ValueError`` whose message contains ``named``."""
    try:
        env.reset(seed=seed, options=options)
    except ValueError as exc:
        if named not in str(exc):
            failures.append(f"reset(options={options!r}) raised a ValueError that does not name {named}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the check is precisely which exception escapes
        failures.append(f"reset(options={options!r}) must raise ValueError, raised {exc!r}")
    else:
        failures.append(f"reset(options={options!r}) was accepted; {rule}")


def _check_invalid_step(env: TextEnv, seed: int, split: str, failures: list[str]) -> None:
    """``step(None)`` leaves the state and key unchanged, says the action was invalid, and counts toward
    ``max_steps`` (invalid steps alone truncate the episode there)."""
    _, info0 = env.reset(seed=seed, options={"split": split})
    digest = env.anchor_key("state")
    obs, reward, terminated, truncated, info = env.step(None)
    if env.anchor_key("state") != digest:
        failures.append("step(None) changed the state")
    if INVALID_ACTION_TEXT not in obs:
        failures.append("step(None): the observation must say the action was invalid")
    if info.get("action_valid") is not False or info.get("step") != 1 or reward != 0.0 or terminated:
        failures.append("step(None): expected action_valid False, step 1, reward 0.0, not terminated")
    if env.key_kind in ("state", "observation") and info.get("anchor_key") != info0.get("anchor_key"):
        failures.append("step(None) changed the anchor key")
    steps = 1
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(None)
        steps += 1
    if not truncated or steps != env.max_steps:
        failures.append(f"invalid steps must truncate at max_steps={env.max_steps}, ended after {steps}")


def _check_unmatched_command(env: TextEnv, seed: int, split: str, failures: list[str]) -> None:
    """``step`` of a command that is no action here (:data:`UNMATCHED_PROBE`) keeps the ``state`` key, reports
    ``action_valid`` False, does not end the episode, and counts toward ``max_steps``."""
    env.reset(seed=seed, options={"split": split})
    digest = env.anchor_key("state")
    obs, reward, terminated, _, info = env.step(UNMATCHED_PROBE)
    if env.anchor_key("state") != digest:
        failures.append(f"step({UNMATCHED_PROBE!r}), a command that is no action, changed the state")
    if not isinstance(obs, str) or not isinstance(reward, float):
        failures.append(f"step({UNMATCHED_PROBE!r}): observation must be str and reward float")
    if info.get("action_valid") is not False or info.get("step") != 1 or terminated:
        failures.append(f"step({UNMATCHED_PROBE!r}): expected action_valid False, step 1, not terminated")


def check_env(
    env: TextEnv, *, seeds: tuple[int, ...] = (0, 1, 2), n_steps: int = 12, split: str | None = None
) -> dict[str, int]:
    """Run every contract check on ``env`` (an instance; it is reset many times).

    One function per section of the module docstring, in this order: :func:`_check_types`,
    :func:`_check_determinism`, :func:`_check_key_stability`, :func:`_check_parse_action`,
    :func:`_check_reset_options`, :func:`_check_invalid_step`, :func:`_check_unmatched_command`; each appends what
    fails to one list.

    Args:
        env: the environment under test.
        seeds: task seeds to try.
        n_steps: length of each random action sequence.
        split: task split (default: the environment's first split).

    Returns:
        counts of what was checked, e.g. ``{"transitions": 84, "fuzz_inputs": 121, "path_pairs": 6}``.

    Raises:
        ValueError: no seeds, or ``n_steps < 1``.
        EnvCheckError: listing every failed check.
    """
    if not seeds:
        raise ValueError("check_env needs at least one seed, e.g. seeds=(0, 1, 2)")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be an int >= 1 (random actions per episode), got {n_steps!r}")
    failures: list[str] = []
    split = split or env.splits[0]
    _check_types(env, seeds[0], split, failures)
    transitions = _check_determinism(env, tuple(seeds), split, n_steps, failures)
    path_pairs = _check_key_stability(env, tuple(seeds), split, failures)
    fuzz_inputs = _check_parse_action(env, seeds[0], split, failures)
    _check_reset_options(env, seeds[0], split, failures)
    _check_invalid_step(env, seeds[0], split, failures)
    _check_unmatched_command(env, seeds[0], split, failures)
    if failures:
        raise EnvCheckError(env.name, failures)
    return {"transitions": transitions, "fuzz_inputs": fuzz_inputs, "path_pairs": path_pairs}


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m environments.checker NAME [--set key=value ...] [--seeds N] [--steps N]``."""
    from environments import list_envs, make_env, resolve_env

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "name",
        help=f"environment name (one of: {', '.join(list_envs())}) or your own as package.module:Class",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="constructor argument")
    parser.add_argument("--seeds", type=_positive_int, default=3, help="number of task seeds to check (default 3)")
    parser.add_argument("--steps", type=_positive_int, default=12, help="random actions per episode (default 12)")
    parser.add_argument("--split", default=None, help="task split (default: the environment's first)")
    args = parser.parse_args(argv)
    kwargs = {}
    for item in args.set:
        if "=" not in item:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        kwargs[key] = _parse_value(value)
    try:
        args.name = resolve_env(args.name)  # a user's package.module:Class is registered under its name
    except (ValueError, ImportError) as exc:
        parser.error(str(exc))
    try:
        env = make_env(args.name, **kwargs)
    except (ValueError, TypeError) as exc:  # unknown name, or a bad constructor argument
        parser.error(f"cannot build {args.name!r} with {kwargs}: {exc}")
    seeds = args.seeds
    try:
        n_tasks = env.num_tasks(args.split or env.splits[0])
    except ValueError as exc:  # an unknown split
        env.close()
        parser.error(str(exc))
    if n_tasks is not None:  # a fixed task list: check at most the tasks it has
        seeds = min(seeds, n_tasks)
    try:
        counts = check_env(env, seeds=tuple(range(seeds)), n_steps=args.steps, split=args.split)
    except EnvCheckError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    finally:
        env.close()
    print(f"OK {args.name}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
