"""Two measurements behind rows of docs/fidelity.md, outside the test suite (docs/estimators.md quotes their output).

    python -m verl_gigpo.dev.fidelity_checks first-fit-cost     # difflib_first_fit grouping: seconds per group
    python -m verl_gigpo.dev.fidelity_checks float32-residue    # the reference's float32 step statistics on ties

``first-fit-cost`` times :func:`verl_gigpo.advantage.anchors.first_fit_anchor_ids` (the reference's grouping) beside
the default :func:`~verl_gigpo.advantage.anchors.anchor_group_ids` on the search recipe's groups (5 episodes of at
most 4 turns: real observations of the project's search environment) and on ALFWorld-sized groups (8 episodes of 50
steps = 400 observations of ALFWorld-like text, a few hundred characters each).

``float32-residue`` repeats the reference's step statistics (``gigpo/core_gigpo.py``, ``step_norm_reward``: a float32
``torch.mean`` and ``torch.std`` over one anchor group's returns, then ``(R - mean) / (std + 1e-6)``) on groups whose
returns are all equal, and prints the advantage every row gets (0 in exact arithmetic), with the torch version and
device, since the residue depends on the reduction order.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from verl_gigpo.advantage.anchors import anchor_group_ids, first_fit_anchor_ids

__all__ = ["alfworld_like_group", "float32_step_advantage", "main", "search_groups"]

_RECEPTACLES = ("cabinet", "drawer", "countertop", "shelf", "sinkbasin", "fridge", "microwave", "garbagecan")
_OBJECTS = ("apple", "bowl", "cup", "knife", "mug", "plate", "potato", "spoon", "tomato", "egg", "pan", "lettuce")


def alfworld_like_group(rng: np.random.Generator, n: int = 400, states: int = 120, repeat: int = 3) -> list[str]:
    """``n`` observations (one episode group) drawn from ``states`` distinct ALFWorld-like texts of 1 to ``repeat``
    sentences ("You arrive at drawer 3. On the drawer 3, you see ...", about 100 characters each), so a group repeats
    states as ALFWorld's do."""
    texts = []
    for _ in range(states):
        place = f"{rng.choice(_RECEPTACLES)} {rng.integers(1, 12)}"
        things = [f"a {rng.choice(_OBJECTS)} {rng.integers(1, 4)}" for _ in range(rng.integers(2, 9))]
        seen = ", ".join(things[:-1]) + f", and {things[-1]}"
        head = "You are in the middle of a room. Looking quickly around you, you see " if rng.random() < 0.2 else ""
        texts.append(
            f"{head}You arrive at {place}. On the {place}, you see {seen}. " * int(rng.integers(1, repeat + 1))
        )
    return [texts[i] for i in rng.integers(0, states, size=n)]


def search_groups(tasks: int, group_size: int = 5, turns: int = 4) -> tuple[list[str], list[int]]:
    """Observations and episode-group ids of ``tasks`` search groups: each member plays ``turns`` searches of the
    project's search environment (its first observation, then each search's results)."""
    from environments import make_env

    keys, groups = [], []
    env = make_env("search", max_steps=turns, key_mode="observation")
    for task in range(tasks):
        for member in range(group_size):
            obs, info = env.reset(seed=task, options={"split": "train"})
            keys.append(obs)
            groups.append(task)
            for turn in range(turns - 1):
                actions = [a for a in env.example_actions() if a.startswith("search[")]
                obs, _, terminated, truncated, info = env.step(actions[(member + turn) % len(actions)])
                keys.append(obs)
                groups.append(task)
                if terminated or truncated:
                    break
    env.close()
    return keys, groups


def long_search_groups(rng: np.random.Generator, tasks: int, group_size: int = 5, turns: int = 4, words: int = 300):
    """Observations and group ids shaped like Search-R1's: a question, then 3 retrieved passages of ``words / 3``
    words each (about 2,000 characters) per turn, drawn from a 5,000-word vocabulary; members of a group repeat
    one another's searches half of the time."""
    vocab = [f"w{i:04d}" for i in range(5000)]
    keys, groups = [], []
    for task in range(tasks):
        question = "Question: " + " ".join(rng.choice(vocab, 12))
        pages = [question + "\n" + " ".join(rng.choice(vocab, words)) for _ in range(2 * turns)]
        for _ in range(group_size):
            keys.append(question)
            keys += [pages[int(i)] for i in rng.integers(0, len(pages), size=turns - 1)]
            groups += [task] * turns
    return keys, groups


def _time(fn, *args) -> float:
    """CPU seconds of ``fn(*args)`` (this process's; steadier than wall time on a shared machine)."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def first_fit_cost(alfworld_groups: int = 2) -> list[str]:
    """Lines of the first-fit timing table (CPU seconds per batch of each shape)."""
    lines = ["| batch | rows | mean characters | dice_components | difflib_first_fit |", "|---|---|---|---|---|"]
    keys, groups = search_groups(tasks=256)
    dice = _time(anchor_group_ids, keys, groups, 0.9)
    first = _time(first_fit_anchor_ids, keys, groups, 0.9)
    chars = int(np.mean([len(k) for k in keys]))
    label = "search recipe: 256 tasks x 5 episodes x 4 turns, the project's search environment"
    lines.append(f"| {label} | {len(keys)} | {chars} | {dice:.3f} s | {first:.3f} s |")
    rng = np.random.default_rng(0)
    shapes = [("search recipe's shape, Search-R1-length observations (3 passages)", long_search_groups(rng, 256))]
    for states, repeat in ((120, 3), (400, 3), (400, 12)):
        texts = [t for _ in range(alfworld_groups) for t in alfworld_like_group(rng, states=states, repeat=repeat)]
        ids = [g for g in range(alfworld_groups) for _ in range(400)]
        label = (
            f"ALFWorld-like: {alfworld_groups} groups x 400 observations, {states} states each, 1-{repeat} sentences"
        )
        shapes.append((label, (texts, ids)))
    for label, (texts, ids) in shapes:
        dice = _time(anchor_group_ids, texts, ids, 0.9)
        first = _time(first_fit_anchor_ids, texts, ids, 0.9)
        chars = int(np.mean([len(t) for t in texts]))
        lines.append(f"| {label} | {len(texts)} | {chars} | {dice:.3f} s | {first:.3f} s |")
    return lines


def float32_step_advantage(value: float, n: int, epsilon: float = 1e-6, device: str = "cpu") -> float:
    """The step advantage the reference's float32 statistics give each of ``n`` rows that all return ``value``:
    ``(R - mean) / (std + epsilon)`` with ``mean = torch.mean``, ``std = torch.std`` (unbiased) of a float32 tensor
    built from ``n`` float32 scalars, as ``step_norm_reward`` builds it. Exact arithmetic gives 0."""
    import torch

    scores = [torch.tensor(value, dtype=torch.float32, device=device) for _ in range(n)]  # one per row
    mean = torch.mean(torch.tensor(scores, device=device))
    std = torch.std(torch.tensor([scores], device=device))
    return float((scores[0] - mean) / (std + epsilon))


def float32_residue(device: str = "cpu") -> list[str]:
    """Lines of the residue table: the advantage of every row of an all-equal anchor group, by return and size."""
    import torch

    sizes = (2, 4, 5, 6, 8, 16)
    lines = [f"torch {torch.__version__}, device {device}", ""]
    lines += ["| return \\ rows | " + " | ".join(str(n) for n in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for value in (10.0, 9.5, 9.025, 9.9, 8.57375):
        cells = [f"{float32_step_advantage(value, n, device=device):+.3f}" for n in sizes]
        lines.append(f"| {value:g} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run one of the measurements and print its Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("first-fit-cost", "float32-residue"))
    parser.add_argument("--device", default="cpu", help="float32-residue: torch device (cpu, cuda)")
    args = parser.parse_args(argv)
    lines = first_fit_cost() if args.what == "first-fit-cost" else float32_residue(args.device)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
