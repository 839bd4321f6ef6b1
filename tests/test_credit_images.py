"""Images in every credit record (CPU only, seconds), on real Sokoban drawings: verl's driver writes records whose
``images`` name the PNGs the agent loop stored in ``<run>/credit/images/`` (verl's batch keeps no raw image), and the
evaluation's rebuilt ``credit/iter_0.jsonl`` names copies of its transcripts' PNGs beside it (docs/vision.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from environments import make_env
from verl_gigpo.config import GiGPOConfig
from verl_gigpo.credit.records import CreditLogger, CreditLogOptions, copy_images, read_credit_records
from verl_gigpo.credit.recredit import recredit
from verl_gigpo.dev.vision_smoke import credit_image_problems
from verl_gigpo.evaluate import report_from_transcripts
from verl_gigpo.rollout import Episode, StepRecord, TaskSpec
from verl_gigpo.rollout.seeding import DRAW_FIELD
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.transcripts import TranscriptWriter, episode_records
from verl_gigpo.verl_glue.agent_loop import credit_images_due, episode_to_outputs, step_image_refs

# two groups of two members; each member's moves (Sokoban seeds 1 and 2, drawn 8 px a cell)
PLAYS = {("g0", 1): [["up", "left", "down"], ["right", "up", "up"]], ("g1", 2): [["down", "down"], ["left", "up"]]}


def _episode(group: str, seed: int, member: int, moves: list[str]) -> Episode:
    """One real Sokoban image episode played with ``moves``; each step keeps the drawing its prompt showed."""
    env = make_env("sokoban", observation="image", tile_size=8, max_steps=len(moves))
    obs, info = env.reset(seed=seed, options={"split": "train"})
    steps, total = [], 0.0
    for t, move in enumerate(moves):
        shown, key = info["images"], info["anchor_key"]
        nxt, reward, terminated, truncated, info = env.step(move)
        total += reward
        steps.append(
            StepRecord(
                step_id=t,
                observation=obs,
                anchor_key=key,
                prompt_text="",
                prompt_ids=[1, 2, t],
                response_ids=[3],
                response_logprobs=[-0.5],
                response_text=move,
                action=move,
                action_valid=True,
                env_reward=reward,
                step_reward=reward,
                terminated=terminated,
                truncated=truncated,
                won=bool(info["won"]),
                images=list(shown),
            )
        )
        obs = nxt
        if terminated or truncated:
            break
    task = TaskSpec("sokoban", seed, split="train", env_kwargs={"observation": "image", "tile_size": 8})
    return Episode(f"{group}_{member}", task, task_id=f"s{seed}", steps=steps, episode_return=total, group_id=group)


@pytest.fixture(scope="module")
def episodes() -> list[Episode]:
    return [_episode(g, seed, m, moves) for (g, seed), plays in PLAYS.items() for m, moves in enumerate(plays)]


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_the_drivers_records_name_the_images_the_agent_loop_stored(episodes, tmp_path):
    """The verl path without Ray: the agent loop stores each step's drawing in <run>/credit/images/ and names it in the
    row's extra_fields; verl's TransferQueue form of the rows (``list_of_dict_to_tensordict``, raw images dropped as
    verl drops them) -> StepBatch.from_rows -> the estimator's terms -> the driver's CreditLogger."""
    credit = tmp_path / "credit"
    uids, extra, drawn = [], [], []
    for ep in episodes:
        outputs = episode_to_outputs(
            ep, placeholder_prompt_ids=[], eos_id=0, text_chars=50, image_refs=step_image_refs(ep, credit)
        )
        fields = [out.as_dict() for out in outputs]  # an episode's rows, put into TransferQueue together
        for field in fields:
            field.pop("multi_modal_data", None)  # verl's TQ postprocess stores no raw image
        extra.extend(list_of_dict_to_tensordict(fields)["extra_fields"])
        uids.extend([ep.group_id] * len(outputs))
        drawn.extend(step.images for step in ep.steps)
    failed = Episode("g1_9", TaskSpec("sokoban", 2), env_error="boom", group_id="g1")  # a placeholder row, masked
    extra.append(episode_to_outputs(failed, placeholder_prompt_ids=[1], eos_id=0, text_chars=50)[0].extra_fields)
    uids.append("g1")
    uids.append("pad0")  # verl's padding: a copy of the first row, images included
    extra.append(dict(extra[0]))
    steps = StepBatch.from_rows(uids, extra, [False] * (len(uids) - 1) + [True])
    assert steps.image_refs is not None and steps.image_refs[-2] == []  # the failed episode's row names none

    terms = steps.advantage_terms(GiGPOConfig(key_mode="state"), torch.ones(len(uids), 1))
    records = read_credit_records(CreditLogger(CreditLogOptions(freq=1, groups=-1), tmp_path).write(1, terms, steps))
    assert len(records) == len(drawn)  # the placeholder and padding rows are not written
    for record, images in zip(records, drawn, strict=True):
        (ref,) = record["images"]
        assert ref.startswith("images/") and np.array_equal(_pixels(credit / ref), np.asarray(images[0]))
    assert len({r["images"][0] for r in records}) < len(records)  # equal drawings are one file (the start states)
    assert len(list((credit / "images").iterdir())) == len({r["images"][0] for r in records})

    # without stored images (records not due, or a text environment) the rows name none
    rows = [r.extra_fields for r in episode_to_outputs(episodes[0], placeholder_prompt_ids=[], eos_id=0)]
    assert all("images" not in r for r in rows)
    assert StepBatch.from_rows(["g0"] * len(rows), rows, [False] * len(rows)).image_refs is None


def test_the_agent_loop_stores_images_for_training_rows_of_logged_iterations_only():
    every_2nd = CreditLogOptions(freq=2)
    assert credit_images_due(every_2nd, {"global_steps": 4, DRAW_FIELD: 0})
    assert not credit_images_due(every_2nd, {"global_steps": 3, DRAW_FIELD: 0})  # not logged
    assert not credit_images_due(every_2nd, {"global_steps": 4})  # a validation row
    assert not credit_images_due(CreditLogOptions(freq=0), {"global_steps": 4, DRAW_FIELD: 0})  # records off


def test_the_evaluations_records_name_copies_of_the_transcripts_images(episodes, tmp_path):
    """report_from_transcripts (both engines' evaluation): credit/iter_0.jsonl's images are files in credit/ with
    the transcripts' pixels; the smoke's check agrees, and recredited records keep them."""
    writer = TranscriptWriter(tmp_path / "transcripts")
    for ep in episodes:
        writer.write(episode_records(ep, group=ep.group_id, image_folder=writer.folder))
    result = report_from_transcripts(tmp_path, settings={"env": "sokoban", "split": "train", "model": "scripted"})
    assert result.credit == tmp_path / "credit" / "iter_0.jsonl"
    records = read_credit_records(result.credit)
    drawn = {(ep.traj_id, s.step_id): s.images[0] for ep in episodes for s in ep.steps}
    assert len(records) == len(drawn)
    for r in records:
        (ref,) = r["images"]
        copied, original = tmp_path / "credit" / ref, tmp_path / "transcripts" / ref
        assert copied.is_file() and np.array_equal(_pixels(copied), _pixels(original))
        assert np.array_equal(_pixels(copied), np.asarray(drawn[(r["traj"], r["step"])]))
    assert credit_image_problems(tmp_path / "credit", tmp_path / "transcripts", [0]) == []
    assert [r["images"] for r in recredit(records, "hgpo")] == [r["images"] for r in records]

    first = records[0]["images"][0]
    (tmp_path / "credit" / first).unlink()  # the smoke's check names a record whose file is gone
    problems = credit_image_problems(tmp_path / "credit", tmp_path / "transcripts", [0])
    assert problems and all(first in p and "missing" in p for p in problems)


def test_copy_images_refuses_paths_outside_the_folder_and_names_a_missing_file(tmp_path):
    (tmp_path / "src" / "images").mkdir(parents=True)
    Image.new("RGB", (4, 4), (1, 2, 3)).save(tmp_path / "src" / "images" / "a.png")
    assert copy_images(["images/a.png"], tmp_path / "src", tmp_path / "dst") == ["images/a.png"]
    assert _pixels(tmp_path / "dst" / "images" / "a.png")[0, 0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"'\.\./x\.png'"):
        copy_images(["../x.png"], tmp_path / "src", tmp_path / "dst")
    with pytest.raises(FileNotFoundError, match="b.png"):
        copy_images(["images/b.png"], tmp_path / "src", tmp_path / "dst")


def test_threads_storing_the_same_drawing_at_once_all_get_its_file(tmp_path):
    """The agent loop stores images in threads, and a group's members often show the same drawing at once: each
    writer renames its own aside file (a shared one made the later renames fail with FileNotFoundError)."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from verl_gigpo.rollout.vision import save_images

    for trial in range(10):
        drawing = np.random.default_rng(trial).integers(0, 255, (96, 96, 3), dtype=np.uint8)
        folder, start = tmp_path / str(trial), Barrier(8)

        def store(_, drawing=drawing, folder=folder, start=start):
            start.wait()
            return save_images([drawing], folder)

        with ThreadPoolExecutor(8) as pool:
            refs = list(pool.map(store, range(8)))
        assert len({tuple(r) for r in refs}) == 1
        assert np.array_equal(_pixels(folder / refs[0][0]), drawing)
        assert [p.name for p in folder.rglob(".*.tmp")] == []
