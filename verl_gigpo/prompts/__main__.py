"""``python -m verl_gigpo.prompts from-reference CHECKOUT [--out DIR]`` and ``python -m verl_gigpo.prompts show --env
ENV --step N [--template F] [--model M]`` (see the package doc)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from environments import kwargs_from_json
from verl_gigpo.prompts.reference import PROMPT_FILES, REFERENCE_TEMPLATES, write_templates
from verl_gigpo.rollout.prompts import IMAGE_MARK

DEFAULT_OUT = "~/gigpo-prompts"


def _from_reference(args: argparse.Namespace) -> int:
    checkout = Path(args.checkout).expanduser()
    if not checkout.is_dir():
        print(f"error: {checkout} is not a folder: give the root of your verl-agent checkout", file=sys.stderr)
        return 2
    envs = [e for e in args.envs.split(",") if e] if args.envs else None
    unknown = sorted(set(envs or ()) - set(PROMPT_FILES))
    if unknown:
        print(f"error: --envs {','.join(unknown)}: known templates are {', '.join(PROMPT_FILES)}", file=sys.stderr)
        return 2
    written, skipped = write_templates(checkout, Path(args.out).expanduser(), envs)
    for item in written:
        print(f"{item.name}: wrote {item.path}; use it with: {' '.join(item.overrides)}")
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}", file=sys.stderr)
    if not written:
        print(f"error: no template written from {checkout}", file=sys.stderr)
        return 1
    return 0


def _show(args: argparse.Namespace) -> int:
    from verl_gigpo.prompts.show import RECIPE_PROMPT_LENGTH, default_model, overlong_note, sample_prompt

    prompt = {}
    for item in args.prompt:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"error: --prompt {item}: write KEY=VALUE, e.g. --prompt first_step_number=1", file=sys.stderr)
            return 2
        prompt[key.removeprefix("env.prompt.")] = yaml.safe_load(value)
    if args.template:
        prompt["template"] = args.template
    model = args.model or default_model()
    tokenizer = None
    if model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    limit = args.max_prompt_length or RECIPE_PROMPT_LENGTH.get(args.env, 2048)
    try:
        kwargs = kwargs_from_json(args.env_kwargs) if args.env_kwargs else {}
        sample = sample_prompt(
            args.env,
            args.step,
            prompt,
            seed=args.seed,
            history_length=args.history_length,
            env_kwargs=kwargs,
            tokenizer=tokenizer,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = sample.text
    print(
        f"# {args.env}, task {args.seed}, step {args.step} ({sample.taken} steps taken, {sample.history_used} shown): "
        f"{len(text)} characters, starts with a newline: {'yes' if text.startswith(chr(10)) else 'no'}, ends with "
        f"one: {'yes' if text.endswith(chr(10)) else 'no'}; the prompt follows to the end marker"
    )
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    print("# end of prompt")
    if sample.ids is None:
        print("# tokens: no tokenizer (pass --model; artifacts/tiny-model is missing: make demo builds it)")
    else:
        rule = prompt.get("overlong", "drop_history")
        print(
            f"# {len(sample.ids)} tokens under {model}'s chat template: {overlong_note(len(sample.ids), limit, rule)}"
        )
        if not args.model:
            print("# (the tiny model's tokenizer, not your model's: pass --model for the count your run sees)")
    if sample.images:
        print(
            f"# {sample.images} image(s) at the observation, placed where the text holds {IMAGE_MARK} (else before "
            "the text); their tokens are not counted"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 on success, 1 when nothing was written, 2 on a usage error."""
    parser = argparse.ArgumentParser(prog="python -m verl_gigpo.prompts", description=__doc__.split("(see")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser(
        "from-reference",
        help="write template files from your own checkout of the reference (verl-agent)",
        description="Write one template file per template from your own checkout of the reference implementation "
        "(verl-agent), read now: "
        + "; ".join(
            f"{name}: {ref.file} {ref.step}{f' and {ref.first_step}' if ref.first_step else ''}"
            for name, ref in REFERENCE_TEMPLATES.items()
        )
        + " (module-level strings, read without running the file). Nothing of the reference is stored in this "
        "project. Prints the overrides that use each file.",
    )
    ref.add_argument("checkout", help="the root of your verl-agent checkout")
    ref.add_argument("--out", default=DEFAULT_OUT, help=f"the folder to write <name>.txt into (default {DEFAULT_OUT})")
    ref.add_argument("--envs", default="", help="comma-separated templates (default all: alfworld,webshop,...)")
    ref.set_defaults(run=_from_reference)
    show = sub.add_parser(
        "show",
        help="print the exact prompt of a sample state and its token count",
        description="Play task SEED's first STEP-1 steps (the first example or admissible action each time), then "
        "print step STEP's prompt as both engines build it, its token count under the model's chat template, and "
        "whether it is over data.max_prompt_length.",
    )
    show.add_argument("--env", required=True, help="alfworld | webshop | sokoban | search | gridnav | ezpoints | ...")
    show.add_argument("--step", type=int, default=1, help="the step whose prompt to show, from 1 (default 1)")
    show.add_argument("--seed", type=int, default=0, help="the task (default 0)")
    show.add_argument("--template", default=None, help="a template file (env.prompt.template)")
    show.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an env.prompt key, e.g. history_item=bracketed",
    )
    show.add_argument("--history-length", type=int, default=2, help="env.history_length (default 2)")
    show.add_argument("--env-kwargs", default="", help='environment arguments as JSON, e.g. \'{"data_path": "..."}\'')
    show.add_argument("--model", default=None, help="a model folder or name for the tokenizer (default the tiny model)")
    show.add_argument(
        "--max-prompt-length", type=int, default=None, help="data.max_prompt_length (default the paper recipe's)"
    )
    show.set_defaults(run=_show)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
