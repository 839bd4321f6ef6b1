"""The local engine on images (CPU only, seconds): a tiny random Qwen2.5-VL plays Sokoban from its drawing through
the local engine's server and trains on it; the update scores each step with its pixels and Qwen-VL's 4-row
positions, so the rollout-vs-update log-prob gap stays at float rounding (docs/vision.md, the local engine). Credit
records and transcripts store the images as PNG files; the credit report shows them beside each step."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from environments.images import pixel_key
from verl_gigpo.credit.records import read_credit_records
from verl_gigpo.credit.report import STEP_IMAGE_STYLE, make_report
from verl_gigpo.evaluate import evaluate_local
from verl_gigpo.local.train import LocalTrainer, load_config
from verl_gigpo.rollout import TaskSpec
from verl_gigpo.rollout.step_rows import StepBatch
from verl_gigpo.rollout.transcripts import episode_records, read_transcripts


def _cfg(model_dir, out_dir, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.trust_remote_code=true",  # the tiny model's images-only processor class
            f"trainer.default_local_dir={out_dir}",
            "env.name=sokoban",
            "env.kwargs.observation=image",
            "env.max_steps=3",
            "env.history_length=0",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.response_length=3",
            "local.constrain_to_actions=false",  # free replies: vision placeholder ids must never be drawn
            "data.train_batch_size=2",
            "data.val_size=2",
            "data.max_prompt_length=1024",
            "local.progress=false",
            "local.plot=false",
            *extra,
        ]
    )


def test_two_local_iterations_on_sokoban_images(tiny_vl_model_dir, tmp_path):
    credit = ["trainer.credit_log_freq=1", "trainer.credit_log_groups=1"]
    trainer = LocalTrainer(_cfg(tiny_vl_model_dir, tmp_path, *credit))
    try:
        assert trainer.rollouts.processor is not None
        assert type(trainer.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        metrics = [trainer.train_step() for _ in range(2)]
        after = trainer.model.state_dict()
        trainer.save_checkpoint()  # evaluated below
    finally:
        trainer.close()
    for m in metrics:
        assert m["rollout/rows"] >= 8
        assert m["rollout/logprob_diff_max"] <= 1e-4  # the update scores what the server generated
        assert np.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], after[k]) for k in before if "visual" in k)  # the vision tower trains

    # the credit records name each step's drawing, stored once as a PNG in credit/images/; the report shows them
    records = read_credit_records(tmp_path / "credit" / "iter_2.jsonl")
    assert records and all(len(r["images"]) == 1 for r in records)
    for r in records:
        png = tmp_path / "credit" / r["images"][0]
        assert png.name == f"{pixel_key(Image.open(png))}.png"  # the file holds the pixels its name hashes
    report = make_report(tmp_path, iteration=2)
    page = report.html.read_text(encoding="utf-8")
    assert page.count(STEP_IMAGE_STYLE) == len(records)  # one image beside each step of the drawn group

    # the evaluation command plays the checkpoint with its processor (trust_remote_code from the run's config)
    # and its transcripts name each step's drawing
    evaluate_local(tmp_path, out=tmp_path / "eval", progress=False)
    transcripts = read_transcripts(tmp_path / "eval" / "transcripts")
    assert transcripts and all((tmp_path / "eval" / "transcripts" / t["images"][0]).is_file() for t in transcripts)
    # and its credit records name copies of those drawings, beside them in eval/credit/
    rebuilt = read_credit_records(tmp_path / "eval" / "credit" / "iter_0.jsonl")
    assert rebuilt and all((tmp_path / "eval" / "credit" / r["images"][0]).is_file() for r in rebuilt)


def test_update_rows_keep_the_pixels_apart_and_the_images_change_the_logprobs(tiny_vl_model_dir, tmp_path):
    # one-token actions: a row's forward input is its prompt, which only its image tells apart from another's
    constrained = ["local.constrain_to_actions=true", "actor_rollout_ref.rollout.response_length=1"]
    trainer = LocalTrainer(_cfg(tiny_vl_model_dir, tmp_path, *constrained))
    try:
        tasks = [TaskSpec("sokoban", s, "train", trainer.env_kwargs) for s in range(2)]
        episodes = trainer.rollout(tasks, 4, validation=False, iteration=1)
        batch = StepBatch.from_episodes(episodes)
        pad = trainer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        assert all(len(pics) == 1 and pad in ids for pics, ids in zip(batch.images, batch.prompts, strict=True))
        with_pixels = {
            (tuple(p), pixel_key(i[0])) for p, i in zip(batch.prompts, batch.images, strict=True)
        }  # one-token replies: each distinct prompt and image is forwarded once
        assert len(trainer.actor._rows(batch).inputs) == len(with_pixels) < len(batch)
        row = next(i for i in range(len(batch)) if pixel_key(batch.images[i][0]) != pixel_key(batch.images[0][0]))
        twice = batch.select(np.array([0, 0]))
        assert len(trainer.actor._rows(twice).inputs) == 1
        twice.images[1] = batch.images[row]  # the same ids with another room's drawing: two forwards
        assert len(trainer.actor._rows(twice).inputs) == 2

        # the update's forward reads the image: another room's drawing moves the log-probs by far more than 1e-4
        inputs, lens = [batch.prompts[0] + batch.responses[0][:-1]], [len(batch.responses[0])]
        with torch.no_grad():
            own, _ = trainer.actor.forward_logprobs(trainer.model, inputs, lens, [batch.images[0]])
            other, _ = trainer.actor.forward_logprobs(trainer.model, inputs, lens, [batch.images[row]])
        assert float((own - other).abs().max()) > 1e-3
        served = torch.tensor(batch.rollout_logprobs[0])
        column = trainer.allowed_ids.index(batch.responses[0][0])  # log-probs over the allowed ids, in their order
        token_lp = own[0, :1, column]
        assert float((token_lp - served).abs().max()) <= 1e-4

        # transcripts store each step's image by reference: a PNG in the transcript folder, equal to the drawing
        records = episode_records(episodes[0], group="task0", image_folder=tmp_path / "transcripts")
        assert len(records) == episodes[0].length
        for record, step in zip(records, episodes[0].steps, strict=True):
            png = tmp_path / "transcripts" / record["images"][0]
            assert np.array_equal(np.asarray(Image.open(png).convert("RGB")), np.asarray(step.images[0]))
        assert "images" not in episode_records(episodes[0], group="task0")[0]  # no folder: no images
    finally:
        trainer.close()


def test_image_requests_share_a_state_s_forward_until_the_weights_change(tiny_vl_model_dir, tmp_path):
    import asyncio

    trainer = LocalTrainer(_cfg(tiny_vl_model_dir, tmp_path, "local.constrain_to_actions=false"))
    server = trainer.server
    try:
        env_images = [Image.fromarray(np.full((56, 56, 3), c, dtype=np.uint8)) for c in (30, 220)]
        prompt = trainer.rollouts.encoder.encode_with_images("push", env_images[:1])

        def play(seed, image):
            params = {"temperature": 1.0, "max_tokens": 3, "seed": seed}
            return asyncio.run(server.generate("r", prompt_ids=prompt, sampling_params=params, image_data=[image]))

        first = play(0, env_images[0])
        forwards = server.stats["forward_passes"]
        again = play(0, env_images[0])  # the same state: every forward comes from the kept logits
        assert server.stats["forward_passes"] == forwards and server.stats["image_cache_hits"] >= len(again.token_ids)
        assert again.token_ids == first.token_ids and again.log_probs == first.log_probs
        play(0, env_images[1])  # another drawing with the same ids is forwarded afresh
        assert server.stats["forward_passes"] > forwards

        with torch.no_grad():  # new weights: the kept logits are stale until forgotten
            for p in trainer.model.parameters():
                p.mul_(1.5)
        assert play(0, env_images[0]).log_probs == first.log_probs
        server.forget_image_logits()
        assert play(0, env_images[0]).log_probs[0] != first.log_probs[0]
    finally:
        trainer.close()
