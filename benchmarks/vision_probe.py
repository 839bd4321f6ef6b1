"""Can the tiny VL model tell the drawings of visual gridnav apart at all? A supervised probe (issue 40, item 6).

    python benchmarks/vision_probe.py                       # tile sizes 16 and 28, lr 3e-3, 100 steps
    python benchmarks/vision_probe.py --tile-sizes 16 --steps 150
    python benchmarks/vision_probe.py --tile-sizes 16 --expert 0.5 --steps 150 --save artifacts/tiny-vl-gridnav-probe05

Every state of 3x3 gridnav without walls (72 agent/goal pairs) is drawn (``render_grid_image``) and encoded as the
engines encode it (the chat template, the processor, Qwen-VL's 4-row positions). The model at ``--model`` (built
by ``verl_gigpo.dev.tiny_vl_model`` when missing) is trained full-batch with Adam on the loss
``-log sum_{a in optimal moves} pi(a | image)`` over the four action tokens; every 25 steps it prints the loss,
the accuracy (its most likely action is an optimal move) and the mean probability of the optimal moves.

With ``--expert P`` the target is soft: an optimal move with probability P (spread over the optimal moves), a
uniformly random action otherwise, i.e. ``-sum_a q(a) log pi(a | image)`` with ``q = P * 1[a optimal] / n_opt +
(1 - P) / 4``; ``--save DIR`` then writes the trained model (one tile size) there, a weak start that reads the
drawing for ``benchmarks/vision_learning.py --model DIR``. Otherwise nothing is kept (docs/vision.md).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def states(tile: int) -> tuple[list, torch.Tensor]:
    """The drawings of the 72 states of 3x3 gridnav without walls (PIL images) and their optimal moves (72, 4) over
    (up, down, left, right)."""
    from PIL import Image

    from environments.gridnav.env import GridTask
    from environments.gridnav.render import render_grid_image

    cells = [(r, c) for r in range(3) for c in range(3)]
    images, optimal = [], []
    for start, goal in itertools.permutations(cells, 2):
        task = GridTask(size=3, walls=frozenset(), start=start, goal=goal, key=None)
        images.append(Image.fromarray(render_grid_image(task, start, False, tile)))
        dr, dc = goal[0] - start[0], goal[1] - start[1]
        optimal.append(torch.tensor([dr < 0, dr > 0, dc < 0, dc > 0]))
    return images, torch.stack(optimal)


def probe(
    model_dir: str, tile: int, lr: float, steps: int, expert: float | None = None, save: str | None = None
) -> list[tuple[int, float, float, float]]:
    """Train a fresh copy of the model on the drawings at ``tile`` pixels a cell (the soft target of ``expert``, see
    the module docstring), saved to ``save`` when given; ``(step, loss, accuracy, p(optimal))`` every 25 steps."""
    from verl_gigpo.rollout.vision import image_inputs, load_pretrained, rope_positions

    torch.manual_seed(0)
    model, processor = load_pretrained(model_dir, trust_remote_code=True)
    tok = processor.tokenizer
    action_ids = [tok.encode(a, add_special_tokens=False)[0] for a in ("up", "down", "left", "right")]
    images, optimal = states(tile)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "(The grid is shown.)"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = processor(text=[text] * len(images), images=images, return_tensors="pt")["input_ids"]  # (72, P)
    attention = torch.ones_like(ids)  # (72, P)
    vision = image_inputs(processor.image_processor, images)
    positions = rope_positions(model, ids, attention, vision["image_grid_thw"])  # (4, 72, P)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    out = []
    for step in range(steps + 1):
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, **vision).logits
        logp = logits[:, -1, action_ids].log_softmax(-1)  # (72, 4)
        if expert is None:
            loss = -logp.masked_fill(~optimal, float("-inf")).logsumexp(-1).mean()
        else:
            target = expert * optimal / optimal.sum(-1, keepdim=True) + (1 - expert) / 4  # (72, 4)
            loss = -(target * logp).sum(-1).mean()
        if step % 25 == 0:
            accuracy = optimal[torch.arange(len(optimal)), logp.argmax(-1)].float().mean()
            p_opt = logp.exp()[optimal].sum() / len(optimal)
            out.append((step, float(loss), float(accuracy), float(p_opt)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if save is not None:
        import shutil

        shutil.copytree(model_dir, save, dirs_exist_ok=True)
        model.save_pretrained(save)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (module docstring)."""
    parser = argparse.ArgumentParser(description="supervised probe: does the tiny VL model read gridnav drawings?")
    parser.add_argument("--model", default="artifacts/tiny-vl-gridnav", help="the tiny VL model (built if missing)")
    parser.add_argument("--tile-sizes", type=int, nargs="+", default=[16, 28], help="pixels per cell to probe")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--expert", type=float, default=None, help="soft target: an optimal move with probability P")
    parser.add_argument("--save", default=None, help="write the trained model here (one --tile-sizes value)")
    args = parser.parse_args(argv)
    if args.expert is not None and not 0 <= args.expert <= 1:
        parser.error(f"--expert takes a probability in [0, 1], got {args.expert}")
    if args.save is not None and len(args.tile_sizes) != 1:
        parser.error(f"--save writes one model: give one --tile-sizes value, got {args.tile_sizes}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not (Path(args.model) / "config.json").is_file():
        cmd = [sys.executable, "-m", "verl_gigpo.dev.tiny_vl_model", "--out", args.model]
        subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    for tile in args.tile_sizes:
        began = time.perf_counter()
        for step, loss, accuracy, p_opt in probe(args.model, tile, args.lr, args.steps, args.expert, args.save):
            print(f"tile {tile}: step {step:4d}  loss {loss:.3f}  accuracy {accuracy:.2f}  p(optimal) {p_opt:.2f}")
        print(f"tile {tile}: {time.perf_counter() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
