"""Evaluate a model on an environment's evaluation split: success per task type with 95 % intervals, pass@k,
episode transcripts and their credit report.

    python -m verl_gigpo.evaluate MODEL [--env NAME] [--split SPLIT] [--tasks N|all] [--episodes K] [key=value ...]
    python -m verl_gigpo.evaluate MODEL --engine verl [options] -- [verl overrides ...]   # verl's val_only launch

MODEL is a Hugging Face folder, a local-engine run or checkpoint, or a verl checkpoint (:mod:`.models`), played
with the settings of the run that made it, on the split's fixed tasks and a run's validation seeds. The two
engines, the settings and the files written: docs/evaluate.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl_gigpo.evaluate.models import (
    ModelSource,
    RunSettings,
    exported_run_settings,
    load_local_weights,
    local_run_layer,
    no_launch_record,
    resolve_model,
    run_settings,
    verl_run_settings,
)
from verl_gigpo.evaluate.report import SuccessRow, markdown_table, plot_success, success_rows
from verl_gigpo.rollout.transcripts import (
    TranscriptWriter,
    episode_outcomes,
    episode_records,
    read_transcripts,
    step_rows,
)

__all__ = [
    "EvalOptions",
    "EvalResult",
    "ModelSource",
    "evaluate_local",
    "decoding_text",
    "default_out",
    "evaluate_verl",
    "greedy_repeats_warning",
    "recorded_launch",
    "local_eval_config",
    "model_settings",
    "report_from_transcripts",
    "resolve_model",
    "verl_eval_overrides",
]

logger = logging.getLogger(__name__)

TRANSCRIPTS = "transcripts"


@dataclass(frozen=True)
class EvalOptions:
    """What to evaluate on, each None to keep the run's (or the defaults') value; the options of docs/evaluate.md.

    ``tasks``: seeds ``0 .. tasks-1``, or ``"all"`` (the split's whole fixed list); ``episodes``: K (pass@K); ``seed``:
    ``trainer.seed`` and ``rollout.seed``; ``overrides``: local-engine ``key=value`` items, applied last.
    """

    env: str | None = None
    split: str | None = None
    tasks: int | str | None = None
    episodes: int | None = None
    greedy: bool | None = None
    temperature: float | None = None
    seed: int | None = None
    device: str | None = None
    overrides: Sequence[str] = field(default_factory=tuple)


@dataclass(frozen=True)
class EvalResult:
    """What an evaluation wrote: the table rows, K, and the paths of ``summary.json``, ``table.md``, the plot, the
    transcripts folder and the credit records."""

    rows: list[SuccessRow]
    k: int
    out: Path
    summary: Path
    table: Path
    plot: Path
    transcripts: Path
    credit: Path | None

    @property
    def overall(self) -> SuccessRow:
        """The ``"all"`` row."""
        return self.rows[-1]


def local_eval_config(
    source: ModelSource, options: EvalOptions, settings: str | Path | RunSettings | None = None
) -> Any:
    """The local engine's config of an evaluation: its defaults, then the run's settings (``settings``, else the
    model's own: :func:`model_settings`), then ``options``; validated.

    Raises:
        ValueError: a bad option or override (naming the key), a ``settings`` path that is no run, a verl checkpoint
            with unknown settings and no ``options.env``, a split of fewer tasks than asked.
    """
    from verl_gigpo.local.config import load_config

    if settings is None or isinstance(settings, (str, Path)):
        settings = run_settings(settings) if settings is not None else model_settings(source, options)
    layers: list[dict[str, Any]] = [settings.layer] if settings is not None else []
    chosen: dict[str, Any] = {
        "actor_rollout_ref.model.path": str(source.hf_dir),
        "env.name": options.env,
        "env.val_split": options.split,
        "actor_rollout_ref.rollout.val_kwargs.n": options.episodes,
        "trainer.seed": options.seed,
        "actor_rollout_ref.rollout.seed": options.seed,  # the request seeds' (verl's launch sets the same key)
        "trainer.device": options.device,
        "local.progress": False,
        "local.plot": False,
    }
    if options.greedy:  # the values greedy decoding uses, so that nothing is reported as ignored
        for key, value in (("do_sample", False), ("temperature", 0), ("top_p", 1), ("top_k", -1)):
            chosen[f"actor_rollout_ref.rollout.val_kwargs.{key}"] = value
    if options.temperature is not None:
        chosen["actor_rollout_ref.rollout.val_kwargs.do_sample"] = True
        chosen["actor_rollout_ref.rollout.val_kwargs.temperature"] = options.temperature
    if isinstance(options.tasks, int):
        chosen["data.val_size"] = options.tasks
    layers.append(_nested({k: v for k, v in chosen.items() if v is not None}))
    cfg = load_config(options.overrides, layers=layers)
    run_split = settings.layer.get("env", {}).get("val_split") if settings is not None else None
    other_split = options.split is not None and options.split != run_split  # the run's task count is another split's
    if options.tasks is not None or options.split is not None or options.env is not None:
        _fit_task_count(cfg, options.tasks, whole_list=other_split and options.tasks is None)
    return cfg


def model_settings(source: ModelSource, options: EvalOptions = EvalOptions()) -> RunSettings | None:
    """The settings a model carries (a local checkpoint's config, a verl checkpoint's launch record, an exported
    folder's run settings); None for another Hugging Face folder. ValueError: a verl checkpoint without a launch record
    and no ``options.env``."""
    if source.kind == "local":
        return RunSettings(layer=local_run_layer(source.run_config), origin=f"local run {source.checkpoint}")
    if source.kind == "verl":
        found = verl_run_settings(source.checkpoint, source.step)
        if found is None and options.env is None:
            raise ValueError(no_launch_record(source.checkpoint))
        return found
    return exported_run_settings(source.hf_dir)


def _fit_task_count(cfg: Any, tasks: int | str | None, *, whole_list: bool = False) -> None:
    """``data.val_size`` for ``tasks="all"`` (or ``whole_list``), checked against the split's size."""
    from environments import make_env

    env = make_env(cfg.env.name, **OmegaConf.to_container(cfg.env.kwargs, resolve=True))
    try:
        fixed = env.num_tasks(cfg.env.val_split)
    finally:
        env.close()
    if tasks == "all":
        if fixed is None:
            raise ValueError(
                f"--tasks all: {cfg.env.name} split {cfg.env.val_split!r} has no fixed task list (its tasks are "
                "generated from seeds); give a number, e.g. --tasks 100"
            )
        cfg.data.val_size = int(fixed)
    elif whole_list and fixed is not None:
        cfg.data.val_size = int(fixed)
    elif fixed is not None and cfg.data.val_size > fixed:
        raise ValueError(
            f"{cfg.env.name} split {cfg.env.val_split!r} has {fixed} tasks, fewer than the {cfg.data.val_size} asked "
            f"(--tasks, else the run's data.val_size): pass --tasks N with N <= {fixed}, or --tasks all"
        )


def evaluate_local(
    model: str | Path,
    *,
    out: str | Path | None = None,
    options: EvalOptions = EvalOptions(),
    settings: str | Path | None = None,
    progress: bool = True,
) -> EvalResult:
    """Evaluate ``model`` on the local engine; returns what was written (``out`` None: :func:`default_out`).

    A verl checkpoint is played through its float32 export in ``out/model``, with its launch record's settings.

    Raises:
        ValueError: no model at the path, an ``out`` holding an evaluation, unknown settings, a bad option; all
            checked before anything is exported or played.
        FileNotFoundError: no such model, or no such ``settings`` folder.
    """
    from verl_gigpo import STEP_CREDIT_ESTIMATORS
    from verl_gigpo.local.config import gigpo_config
    from verl_gigpo.local.rollout import LocalRollout
    from verl_gigpo.local.setup import load_model

    source = resolve_model(model)
    found = run_settings(settings) if settings is not None else model_settings(source, options)
    cfg = local_eval_config(source, options, found)
    device = _device(cfg)
    if found is None:
        logger.warning(_defaults_warning(source, cfg))
    out = Path(out if out is not None else default_out(source, cfg.env.val_split)).resolve()  # absolute, as verl's
    _fresh_output(out)
    with _cleanup_on_failure(out):
        val_kwargs = cfg.actor_rollout_ref.rollout.val_kwargs
        repeats = greedy_repeats_warning(bool(val_kwargs.do_sample), int(val_kwargs.n))
        if repeats:
            logger.warning(repeats)
        description = source.describe()
        if found is not None:
            logger.info("settings of %s", found.origin)
            if found.dropped:
                logger.info("not applied (the local engine has no such key): %s", ", ".join(found.dropped))
        if source.kind == "verl":  # the local engine plays its float32 export (verl's engine loads it itself)
            from verl_gigpo.export import export_checkpoint

            print(f"exporting {description} to {out / 'model'} (float32) ...", flush=True)
            export_checkpoint(source.checkpoint, out / "model", dtype="float32")
            exported = resolve_model(out / "model")
            cfg.actor_rollout_ref.model.path = str(exported.hf_dir)
            description += f", played through its float32 export {exported.hf_dir}"
            source = exported
        gigpo = gigpo_config(cfg) if cfg.algorithm.adv_estimator in STEP_CREDIT_ESTIMATORS else None
        trust = bool(cfg.actor_rollout_ref.model.get("trust_remote_code", False))  # a VL model's processor code
        tokenizer, loaded = load_model(str(source.hf_dir), device, seed=cfg.trainer.seed, trust_remote_code=trust)
        if source.kind == "local":
            loaded.load_state_dict(load_local_weights(source))
        start = time.perf_counter()
        rollout = LocalRollout(cfg, gigpo, model=loaded, tokenizer=tokenizer)
        try:
            episodes = rollout.validation_episodes(progress=progress)
        finally:
            rollout.close()
        seconds = time.perf_counter() - start
        writer = TranscriptWriter(out / TRANSCRIPTS)
        for episode in episodes:
            writer.write(episode_records(episode, group=episode.group_id, image_folder=writer.folder))
        settings_used = {
            "engine": "local",
            "model": description,
            "settings_from": found.origin if found is not None else "the local engine's defaults",
            "env": cfg.env.name,
            "split": cfg.env.val_split,
            "tasks": int(cfg.data.val_size),
            "episodes_per_task": int(val_kwargs.n),
            "do_sample": bool(val_kwargs.do_sample),
            "temperature": float(val_kwargs.temperature),
            "top_p": float(val_kwargs.top_p),
            "top_k": int(val_kwargs.top_k),
            "constrain_to_actions": bool(cfg.local.constrain_to_actions),
            "seed": int(cfg.actor_rollout_ref.rollout.get("seed", cfg.trainer.seed)),
            "seconds": round(seconds, 2),
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        return report_from_transcripts(out, settings=settings_used, gigpo=gigpo)


def _defaults_warning(source: ModelSource, cfg: Any) -> str:
    """The warning for a model that carries no run settings: what the local engine's defaults play."""
    return (
        f"{source.given} carries no run settings (a folder python -m verl_gigpo.export wrote holds them): playing "
        f"{cfg.env.name} with the local engine's defaults and the options, e.g. {cfg.env.max_steps} steps, "
        f"{cfg.actor_rollout_ref.rollout.response_length}-token replies, prompts of {cfg.data.max_prompt_length} "
        f"tokens, decoding {'restricted to the action words' if cfg.local.constrain_to_actions else 'unrestricted'}. "
        "For a run's settings pass --settings RUN (a local run, a verl experiment or checkpoint), or key=value "
        "overrides"
    )


def default_out(source: ModelSource, split: str | None) -> Path:
    """``runs/eval/<model>-<split>``, numbered ``-2``, ``-3`` ... when it already holds an evaluation."""
    base = Path("runs") / "eval" / f"{source.short_name()}-{split or 'eval'}"
    candidate, number = base, 1
    while (candidate / "summary.json").exists() or (candidate / TRANSCRIPTS).exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def verl_eval_overrides(source: ModelSource, out: Path, options: EvalOptions) -> list[str]:
    """The overrides that make a ``python -m verl_gigpo.main`` launch an evaluation of ``source``: ``trainer.val_only``,
    the checkpoint (``trainer.resume_from_path``) or folder as the model, transcripts to ``out/transcripts``, verl's run
    folder ``out/verl``, and the options.

    Raises:
        ValueError: a local-engine checkpoint, or an option verl's validation cannot take (``--split``, ``--tasks all``,
            ``--device``).
    """
    if source.kind == "local":
        raise ValueError(
            f"{source.checkpoint} is a local-engine checkpoint: evaluate it with the local engine (no --engine), or "
            "export it with `python -m verl_gigpo.export` and pass the folder"
        )
    unsupported = {"--split": options.split, "--tasks": options.tasks, "--device": options.device, "--env": options.env}
    given = [name for name, value in unsupported.items() if value is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)}: with --engine verl the tasks, environment and platform are the launch's own "
            "(data.val_files, env.name, platform=cpu): set them in the overrides, or use a recipe's EVAL_SPLIT and "
            "EVAL_TASKS (EVAL_ONLY=1 bash recipes/run_<env>.sh), which prepare the task file"
        )
    items = [
        "trainer.val_only=true",
        "trainer.val_before_train=true",
        f"env.transcript_dir={out / TRANSCRIPTS}",
        f"trainer.default_local_dir={out / 'verl'}",
    ]
    if source.kind == "verl":
        items += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={source.checkpoint}"]
    else:
        items += ["trainer.resume_mode=disable", f"actor_rollout_ref.model.path={source.hf_dir}"]
    rollout = "actor_rollout_ref.rollout.val_kwargs"
    if options.episodes is not None:
        items.append(f"{rollout}.n={options.episodes}")
    if options.greedy:
        items += [f"{rollout}.do_sample=false", f"{rollout}.temperature=0", f"{rollout}.top_p=1", f"{rollout}.top_k=-1"]
    if options.temperature is not None:
        items += [f"{rollout}.do_sample=true", f"{rollout}.temperature={options.temperature}"]
    if options.seed is not None:
        items.append(f"actor_rollout_ref.rollout.seed={options.seed}")
    return [*items, *options.overrides]


def evaluate_verl(
    model: str | Path, *, out: str | Path | None = None, options: EvalOptions = EvalOptions(), launch: Sequence[str]
) -> EvalResult:
    """Evaluate ``model`` through verl's pipeline: ``python -m verl_gigpo.main`` with ``launch`` (default: the
    checkpoint's recorded launch) and :func:`verl_eval_overrides` in a subprocess, then the transcripts' report.

    Raises:
        ValueError: as :func:`verl_eval_overrides`; a folder that already holds an evaluation.
        RuntimeError: the launch failed (the message gives the exit status).
    """
    import subprocess
    import sys

    source = resolve_model(model)
    out = Path(out if out is not None else default_out(source, None)).resolve()
    overrides = verl_eval_overrides(source, out, options)
    if not launch:
        launch = recorded_launch(source)
    _fresh_output(out)
    with _cleanup_on_failure(out):
        command = [sys.executable, "-m", "verl_gigpo.main", *launch, *overrides]
        print(f"evaluating {source.describe()} through verl's pipeline (trainer.val_only) ...", flush=True)
        start = time.perf_counter()
        status = subprocess.run(command).returncode
        if status != 0:
            raise RuntimeError(f"the verl launch exited with status {status} (its output is above); nothing was scored")
        records = read_transcripts(out / TRANSCRIPTS)
        counts = _members(episode_outcomes(records)).values()
        settings = {
            "engine": "verl",
            "model": source.describe(),
            "env": records[0]["env_name"],
            "split": records[0]["split"],
            "tasks": len(counts),
            "episodes_per_task": max(counts),
            **_launch_sampling(out / "verl"),
            "seconds": round(time.perf_counter() - start, 2),
            "command": command,
        }
        repeats = greedy_repeats_warning(bool(settings.get("do_sample", True)), int(settings["episodes_per_task"]))
        if repeats:
            logger.warning(repeats)
        return report_from_transcripts(out, settings=settings)


def recorded_launch(source: ModelSource) -> list[str]:
    """The overrides of the ``python -m verl_gigpo.main`` launch that wrote a verl checkpoint (its launch record).

    Raises:
        ValueError: ``source`` is not a verl checkpoint, or its experiment holds no launch record.
    """
    from verl_gigpo.verl_glue.launch import LAUNCHES_DIR, saved_launch_config

    if source.kind == "verl":
        folder = source.checkpoint.parent
        found = saved_launch_config(folder, source.step)
        records = sorted((folder / LAUNCHES_DIR).glob("launch_*.json"))
        if found is None and records:
            found = records[-1], json.loads(records[-1].read_text())
        if found is not None:
            path, record = found
            print(f"the launch's overrides: those of {path}", flush=True)
            return list(record["command"][2:])
    raise ValueError(
        f"--engine verl needs the launch's overrides after -- (python -m verl_gigpo.main's: the environment, data "
        f"files, lengths), or a verl checkpoint whose experiment holds a launch record; {source.given} has neither. A "
        "recipe passes its own: EVAL_ONLY=1 CKPT=... bash recipes/run_<env>.sh"
    )


def _launch_sampling(folder: Path) -> dict[str, Any]:
    """The validation sampling of the launch record in ``folder`` (empty when there is none)."""
    from verl_gigpo.verl_glue.launch import LAUNCHES_DIR

    records = sorted((folder / LAUNCHES_DIR).glob("launch_*.json"))
    if not records:
        return {}
    config = json.loads(records[-1].read_text())["config"]
    val_kwargs = config["actor_rollout_ref"]["rollout"]["val_kwargs"]
    return {key: val_kwargs[key] for key in ("do_sample", "temperature", "top_p", "top_k") if key in val_kwargs}


def decoding_text(settings: dict[str, Any]) -> str:
    """The line under the table's title: ``greedy`` or ``sampled (temperature T, top_p P)``, then ``k`` and the seed."""
    if "do_sample" not in settings:
        decoding = "decoding as the launch's val_kwargs"
    elif not settings["do_sample"]:
        decoding = "greedy decoding"
    else:
        parts = [f"temperature {settings.get('temperature')}"]
        if settings.get("top_p", 1.0) != 1.0:
            parts.append(f"top_p {settings['top_p']}")
        if settings.get("top_k", -1) not in (-1, 0, None):
            parts.append(f"top_k {settings['top_k']}")
        decoding = f"sampled ({', '.join(parts)})"
    if settings.get("constrain_to_actions"):
        decoding += ", restricted to the action words"
    k = settings.get("episodes_per_task")
    tail = f"; {k} episode(s) per task" if k else ""
    seed = f"; seed {settings['seed']}" if settings.get("seed") is not None else ""
    return f"{settings.get('engine', '')} engine, {decoding}{tail}{seed}".strip()


def greedy_repeats_warning(do_sample: bool, k: int) -> str | None:
    """The warning for greedy decoding with ``k`` > 1 (None otherwise): a task's k episodes are then copies."""
    if do_sample or k <= 1:
        return None
    return (
        f"greedy decoding with {k} episodes per task: on a deterministic environment they are the same episode "
        f"{k} times (pass@{k} = the success rate, and the episode rate's interval is too narrow). Sample "
        "(--temperature T, or EVAL_GREEDY=0) for pass@k, or use -k 1"
    )


def report_from_transcripts(out: str | Path, *, settings: dict[str, Any], gigpo: Any = None) -> EvalResult:
    """Read ``<out>/transcripts/``; write and return the table, plot, ``summary.json`` and credit records (their
    images copied to ``<out>/credit/images/``).

    Raises:
        FileNotFoundError: no transcripts in ``<out>/transcripts``, or an image a transcript names is missing.
    """
    from verl_gigpo.config import GiGPOConfig
    from verl_gigpo.credit.records import CREDIT_DIR, CreditLogger, CreditLogOptions, copy_images

    out = Path(out)
    records = read_transcripts(out / TRANSCRIPTS)
    outcomes = episode_outcomes(records)
    k = int(settings.get("episodes_per_task") or max(_members(outcomes).values()))
    rows = success_rows(outcomes)
    title = f"{settings.get('env', '')} {settings.get('split', '')}: {settings.get('model', '')}".strip()
    decoding = decoding_text({**settings, "episodes_per_task": k})
    table = markdown_table(rows, k)
    (out / "table.md").write_text(f"{title}\n\n{decoding}\n\n{table}")
    plot = plot_success(
        rows,
        out / "success_by_type.png",
        title=f"{settings.get('env', '')} {settings.get('split', '')}\n{decoding}",
    )
    steps = step_rows(records)
    credit = None
    if steps.row_mask.any():  # every episode group, texts of up to 400 characters
        if any(r.get("images") for r in records):  # the transcripts' PNGs, copied beside the records
            refs = [copy_images(r.get("images") or [], out / TRANSCRIPTS, out / CREDIT_DIR) for r in records]
            steps = replace(steps, image_refs=refs)
        terms = steps.advantage_terms(gigpo if gigpo is not None else GiGPOConfig(key_mode="state"))
        writer = CreditLogger(CreditLogOptions(freq=1, groups=-1, max_chars=400), out)
        credit = writer.write(0, terms, steps)
    summary = out / "summary.json"
    payload = {**settings, "k": k, "rows": [r.as_dict() for r in rows]}
    summary.write_text(json.dumps(payload, indent=2, default=str, allow_nan=True) + "\n")
    result = EvalResult(
        rows=rows,
        k=k,
        out=out,
        summary=summary,
        table=out / "table.md",
        plot=plot,
        transcripts=out / TRANSCRIPTS,
        credit=credit,
    )
    _print_result(result, f"{title}\n{decoding}", table, settings.get("settings_from"))
    return result


def _members(outcomes: Sequence[Any]) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for o in outcomes:
        counts[o.group] = counts.get(o.group, 0) + 1
    return counts


def _print_result(result: EvalResult, title: str, table: str, settings_from: str | None) -> None:
    overall = result.overall
    print(f"\n{title}\n\n{table}")
    if settings_from:
        print(f"settings:    {settings_from}")
    print(
        f"success {overall.wins}/{overall.episodes} = {overall.rate:.3f} (95% CI {overall.low:.3f}-{overall.high:.3f})"
        + (f", pass@{result.k} {overall.pass_k:.3f}" if result.k > 1 else "")
    )
    print(f"table:       {result.table}")
    print(f"summary:     {result.summary}")
    print(f"plot:        {result.plot}")
    print(f"transcripts: {result.transcripts}")
    if result.credit is not None:
        print(f"credit:      {result.credit}  (python -m verl_gigpo.inspect {result.out})")


def _fresh_output(out: Path) -> None:
    """Refuse a folder that already holds an evaluation; ValueError also when ``out`` cannot be made."""
    if (out / TRANSCRIPTS).exists() or (out / "summary.json").exists():
        raise ValueError(f"{out} already holds an evaluation; choose another --out, or remove it first")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot make the output folder {out}: {exc.strerror or exc}; choose another --out") from None


@contextlib.contextmanager
def _cleanup_on_failure(out: Path) -> Iterator[None]:
    """On an exception inside the block: remove ``out`` when nothing was written into it, then re-raise."""
    try:
        yield
    except BaseException:
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _device(cfg: Any):
    from verl_gigpo.local.rollout import local_device

    return local_device(cfg)


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out
