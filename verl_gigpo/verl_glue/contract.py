"""verl's contract: every verl symbol verl_gigpo overrides, patches, wraps, reads or registers into, why, and its guard.

:data:`CONTRACT` is the one list; ``python -m verl_gigpo.verl_glue.contract`` prints it (``--check`` runs every
guard). Each guard runs where the symbol is used (:func:`check_contract` at import, or the patch's installer) and
raises :class:`~verl_gigpo.verl_glue.verl_version.VerlMismatchError` naming what changed. How to read it and what to
run on a new verl: docs/upgrading.md.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from verl_gigpo.verl_glue.verl_version import VerlMismatchError

__all__ = [
    "CONTRACT",
    "GUARDS",
    "Entry",
    "check_binding",
    "check_contract",
    "check_entry",
    "check_overrides",
    "check_signature",
    "init_attributes",
    "markdown",
    "parameter_names",
]

#: guard kinds: what each checks of the verl symbol
GUARDS = {
    "signature": "its parameter names, in order, are the override's (or the listed ones)",
    "attribute": "verl's ``__init__`` assigns it on the instance (and the class does not define it)",
    "exists": "it exists and is of the listed type",
    "called": "the listed verl method calls it (so a wrap on the instance sees every call)",
    "fields": "the local engine's stand-in holds only fields of verl's dataclass, and no verl loss reads a missing "
    "one with a default",
    "text": "the listed verl function still holds the literal",
    "binding": "checked by the installer: the original's parameters, and that each module binding it binds verl's",
}


@dataclass(frozen=True)
class Entry:
    """One verl symbol touched by verl_gigpo: the columns of docs/upgrading.md ("How to read the table").

    ``arg``: the guard's argument: parameter names (``signature``; None: the override's), a type (``exists``), the
    calling method (``called``), the literal (``text``), the stand-in class path (``fields``), the installer
    (``binding``).
    """

    symbol: str
    kind: str
    ours: str
    why: str
    guard: str
    arg: Any = None

    @property
    def name(self) -> str:
        """The symbol's last component, e.g. ``_update_actor``."""
        return self.symbol.rsplit(":", 1)[-1].rsplit(".", 1)[-1]

    def owner(self) -> Any:
        """The verl object holding the symbol (its class or module); imports it."""
        module, _, qualname = self.symbol.partition(":")
        head = qualname.rpartition(".")[0]
        return _resolve(f"{module}:{head}" if head else module)


_V1 = "verl.trainer.ppo.v1"
_BUFFER = "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer"
_TRAINER = "verl_gigpo.verl_glue.trainer"
_DYNAMIC = "verl_gigpo.verl_glue.replay_buffer"
_WATCH = "verl_gigpo.verl_glue.dead_actor"
_CPU = "verl_gigpo.verl_glue.cpu"
_SHIMS = "verl_gigpo.verl_glue.cpu.shims"
_AGENT_LOOP = "verl_gigpo.verl_glue.agent_loop"

_TRAINER_OVERRIDES = (
    ("__init__", "reads and checks the GiGPO config first, greedy validation sampling, then verl's"),
    (
        "_build_replay_buffer",
        "poll interval from trainer.v1.sampler; the dynamic-sampling buffer; the dead-actor watch",
    ),
    ("_balance_batch", "knows the row count for the mini-batch plan while verl's runs"),
    ("_get_required_batch_multiple", "the planned mini-batch size (trainer.v1.gigpo_sync.mini_batch_rows)"),
    ("_update_actor", "swaps the worker group's update_actor for the planned mini-batches for one call"),
    ("_compute_old_log_prob", "bypass mode: verl's own actor pass on the checked iterations"),
    ("_compute_advantage", "the step-credit estimators (and grpo/rloo) on step rows"),
    ("_submit_batch_to_rollout", "numbers the training draws the request seeds read"),
    ("_validate", "logs the validation episodes after verl's validation"),
    ("_val_metrics_update", "per-task-type validation metrics"),
    ("_compute_metrics", "this project's metrics beside verl's"),
)

#: every verl symbol verl_gigpo touches (verl 0.9.1)
CONTRACT: tuple[Entry, ...] = (
    *(
        Entry(f"{_V1}:PPOTrainerSync.{name}", "overrides", _TRAINER, why, "signature")
        for name, why in _TRAINER_OVERRIDES
    ),
    Entry(
        f"{_V1}.trainer_base:PPOTrainer.trainer_mode",
        "overrides",
        _TRAINER,
        "a property reading 'sync': verl compares the attribute with the literal to pick its sync code paths",
        "attribute",
    ),
    Entry(
        f"{_V1}:PPOTrainerSync._add_prompts_to_generate",
        "reads",
        _TRAINER,
        "the dynamic-sampling buffer's refill_fn, as verl passes it",
        "signature",
        ("self", "num_prompts"),
    ),
    Entry(
        f"{_V1}:PPOTrainerSync._save_checkpoint",
        "reads",
        _TRAINER,
        "trainer.health.action=stop saves a checkpoint before stopping",
        "signature",
        ("self",),
    ),
    Entry(
        f"{_V1}.trainer_base:PPOTrainer._save_checkpoint",
        "reads",
        _TRAINER,
        "verl's checkpoint pointer file name (config.resume.POINTER), read by launch, export and the local engine",
        "text",
        "latest_checkpointed_iteration.txt",
    ),
    Entry(
        f"{_V1}:register_trainer",
        "registers into",
        _TRAINER,
        "the gigpo_sync trainer mode",
        "signature",
        ("name",),
    ),
    *(
        Entry(f"{_BUFFER}.{name}", "overrides", _DYNAMIC, why, "signature")
        for name, why in (
            ("_dapo_filtered_keys", "evicts the finished groups the keep test drops, within the iteration's budget"),
            ("_select_prompt_uids", "takes kept groups first, in dispatch order"),
            ("sample", "one iteration of dynamic sampling per call, its dynamic/* metrics added"),
        )
    ),
    *(
        Entry(f"{_BUFFER}.{name}", "reads", _DYNAMIC, why, "attribute")
        for name, why in (
            ("_dapo_classification_cache", "the groups already judged, pruned and filled per partition"),
            ("refill_fn", "wrapped with the iteration's budget (the trainer's _add_prompts_to_generate)"),
            ("gen_batch_size", "must be 1 under dynamic sampling"),
            ("train_batch_size", "the iteration's target number of groups"),
            ("pending_keys", "the groups present (with running_keys, finished_keys, failure_keys)"),
            ("running_keys", "the groups present"),
            ("finished_keys", "the groups finished, judged once each"),
            ("failure_keys", "the groups present"),
            ("partitions", "returned by the overridden _select_prompt_uids, as verl's"),
            ("prompt_global_steps", "returned by the overridden _select_prompt_uids, as verl's"),
        )
    ),
    Entry(
        f"{_BUFFER}.poll_interval",
        "reads",
        _TRAINER,
        "set from trainer.v1.sampler.poll_interval (verl has no config key for it)",
        "attribute",
    ),
    Entry(
        f"{_BUFFER}._wait_for_next_poll",
        "wraps",
        _WATCH,
        "checks the watched actors before each poll: verl's sample waits without a deadline",
        "called",
        "sample",
    ),
    Entry(
        "verl.experimental.agent_loop.agent_loop:_agent_loop_registry",
        "reads",
        "verl_gigpo.plugin",
        "ensure_registered checks that the agent loop is registered",
        "exists",
        dict,
    ),
    Entry(
        "verl.trainer.ppo.core_algos:ADV_ESTIMATOR_REGISTRY",
        "registers into",
        "verl_gigpo.plugin",
        "gigpo, hgpo, graphgpo, g2po (through register_adv_est)",
        "exists",
        dict,
    ),
    Entry(
        "verl.workers.engine.base:EngineRegistry._engines",
        "reads",
        _CPU,
        "registers verl's FSDP engines for device cpu once (register_cpu_engines)",
        "exists",
        dict,
    ),
    Entry(
        "verl.workers.rollout.base:_ROLLOUT_REGISTRY",
        "registers into",
        _CPU,
        "the hf in-worker rollout class (no register function; get_rollout_class reads the dict)",
        "exists",
        dict,
    ),
    *(
        Entry(
            f"verl.workers.rollout.replica:RolloutReplica.{name}",
            "reads",
            "verl_gigpo.verl_glue.cpu.hf_rollout",
            why,
            "attribute",
        )
        for name, why in (
            ("_server_handle", "HFReplica sets it; verl's server_handle property returns it"),
            ("_server_address", "HFReplica sets it; verl's server_address property returns it"),
        )
    ),
    *(
        Entry(f"verl.experimental.agent_loop.agent_loop:{name}", kind, _AGENT_LOOP, why, "signature", params)
        for name, kind, why, params in (
            ("register", "registers into", "the gigpo_env_agent agent loop", ("agent_name",)),
            (
                "AgentLoopBase.__init__",
                "overrides",
                "takes verl's arguments through to verl's, then reads the episode settings",
                ("self", "trainer_config", "server_manager", "tokenizer", "processor", "dataset_cls", "data_config")
                + ("hf_model_type", "kwargs"),
            ),
            ("AgentLoopBase.run", "overrides", "one episode, as verl's rows", None),
        )
    ),
    Entry(
        "verl.experimental.agent_loop.agent_loop:AgentLoopBase.processor",
        "reads",
        _AGENT_LOOP,
        "the model's multimodal processor: prompts with images (docs/vision.md)",
        "attribute",
    ),
    Entry(
        "verl.workers.rollout.llm_server:LLMServerClient.generate",
        "reads",
        _AGENT_LOOP,
        "the episode runner sends an observation's images as image_data",
        "signature",
        ("self", "request_id", "prompt_ids", "sampling_params", "image_data", "video_data", "audio_data")
        + ("mm_processor_kwargs", "kwargs"),
    ),
    *(
        Entry(f"verl.workers.rollout.{symbol}", kind, f"{_CPU}.hf_rollout", why, "signature", params)
        for symbol, kind, why, params in (
            ("replica:RolloutReplica.launch_servers", "overrides", "starts the hf generation server", None),
            (
                "base:BaseRollout.__init__",
                "overrides",
                "the in-worker adapter, built by verl's worker",
                ("self", "config", "model_config", "device_mesh", "args", "kwargs"),
            ),
            ("base:BaseRollout.resume", "overrides", "wakes the server", None),
            ("base:BaseRollout.release", "overrides", "puts the server to sleep", None),
            (
                "base:BaseRollout.update_weights",
                "overrides",
                "weight sync into the server (peft_config, base_sync_done: keywords verl passes)",
                ("self", "weights", "wire_format", "kwargs"),
            ),
        )
    ),
    Entry(
        "verl.workers.rollout.replica:RolloutReplicaRegistry.register",
        "registers into",
        _CPU,
        "the hf rollout replica, loaded lazily",
        "signature",
        ("name", "loader"),
    ),
    Entry(
        "verl.workers.engine.base:EngineRegistry.register",
        "registers into",
        _CPU,
        "verl's FSDP engines for device cpu",
        "signature",
        ("model_type", "backend", "device", "vendor"),
    ),
    Entry(
        "verl.plugin.platform:PlatformRegistry.register",
        "registers into",
        f"{_CPU}.platform",
        "the cpu platform (CPUPlatform implements PlatformBase's abstract methods: a new one fails at its creation)",
        "signature",
        ("platform",),
    ),
    Entry(
        "verl.utils.distributed:initialize_global_process_group_ray",
        "patches",
        _SHIMS,
        "gloo instead of nccl on the CPU platform",
        "binding",
        "gloo_process_group",
    ),
    Entry(
        "verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy",
        "patches",
        _SHIMS,
        "unpinned offload of the reference model on CPU",
        "binding",
        "unpinned_ref_offload",
    ),
    Entry(
        "verl.workers.engine.utils:rearrange_micro_batches",
        "patches",
        _SHIMS,
        "length-sorted micro-batches on CPU",
        "binding",
        "length_sorted_micro_batches",
    ),
    Entry(
        "verl.utils.tracking:FileLogger",
        "patches",
        "verl_gigpo.verl_glue.metrics_file",
        "the metrics file appends across launches of one run",
        "binding",
        "append_file_logger",
    ),
    Entry(
        "verl.workers.config:ActorConfig",
        "reads",
        "verl_gigpo.local.update",
        "the local engine hands verl's policy losses a stand-in of the actor config (_LossConfig)",
        "fields",
        "verl_gigpo.local.update:_LossConfig",
    ),
)


# ------------------------------------------------------------------ the guards
def parameter_names(function: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``function``'s parameters, in order (``self`` included for a function read off its class)."""
    return tuple(inspect.signature(function).parameters)


def check_signature(function: Any, params: Sequence[str], *, target: str, use: str) -> None:
    """Refuse (VerlMismatchError) a verl callable whose parameter names, in order, are not ``params``; a class is
    read through its ``__init__`` (``self`` included); ``target`` and ``use`` go into the message."""
    if not callable(function):
        raise VerlMismatchError(target, f"a callable with parameters {tuple(params)}", repr(function), use=use)
    found = parameter_names(function.__init__ if inspect.isclass(function) else function)
    if found != tuple(params):
        raise VerlMismatchError(target, f"parameters {tuple(params)}", f"{found}", use=use)


def check_overrides(cls: type, base: type, names: Sequence[str], *, use: str) -> None:
    """Refuse (VerlMismatchError) a ``base`` whose methods ``names`` are gone or differ in parameters from ``cls``'s."""
    for name in names:
        ours = vars(cls)[name]
        verl_method = getattr(base, name, None)
        target = f"{base.__name__}.{name}"
        if verl_method is None:
            raise VerlMismatchError(target, f"a method overridden by {cls.__name__}.{name}", "no such member", use=use)
        check_signature(verl_method, parameter_names(ours), target=target, use=use)


def check_binding(module_name: str, attr: str, expected: Any, *, use: str) -> None:
    """Refuse (VerlMismatchError) a loaded verl module whose name ``attr`` is not ``expected``, the object a patch
    replaces; a module not imported yet passes."""
    module = sys.modules.get(module_name)
    if module is None:
        return
    found = getattr(module, attr, None)
    if found is not expected:
        raise VerlMismatchError(
            f"{module_name}.{attr}",
            f"{expected!r} (bound at import)",
            "nothing" if found is None else repr(found),
            use=use,
        )


def _tree(function: Any) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def init_attributes(cls: type) -> set[str]:
    """The names ``cls.__init__`` (its own or the nearest base's) assigns as ``self.<name>``."""
    init = next(vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k))
    return {
        node.attr
        for node in ast.walk(_tree(init))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        if isinstance(node.ctx, ast.Store)
    }


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        found = getattr(found, part)
    return found


def _our_override(entry: Entry, base: type) -> Any:
    ours = sys.modules[entry.ours]
    for value in vars(ours).values():
        if inspect.isclass(value) and value is not base and issubclass(value, base) and entry.name in vars(value):
            return vars(value)[entry.name]
    raise LookupError(f"{entry.ours} defines no subclass of {base.__name__} overriding {entry.name}")


def check_entry(entry: Entry) -> None:
    """Run ``entry``'s guard (a ``binding`` guard runs in its installer); VerlMismatchError when it fails."""
    use = f"{entry.ours} ({entry.why})"
    target = entry.symbol.replace(":", ".")
    try:
        owner, name = entry.owner(), entry.name
    except (ImportError, AttributeError) as exc:
        raise VerlMismatchError(target, "an importable verl module and class", repr(exc), use=use) from None
    if entry.guard == "binding":
        return
    if entry.guard == "exists":
        found = getattr(owner, name, None)
        if not isinstance(found, entry.arg):
            raise VerlMismatchError(target, f"a {entry.arg.__name__}", repr(found), use=use)
    elif entry.guard == "attribute":
        if name in dir(owner) or name not in init_attributes(owner):
            where = "a class member" if name in dir(owner) else "not assigned in __init__"
            raise VerlMismatchError(target, "an instance attribute set in __init__", where, use=use)
    elif entry.guard == "signature":
        found = getattr(owner, name, None)
        if found is None:
            raise VerlMismatchError(target, f"a member used by {entry.ours}", "no such member", use=use)
        params = entry.arg if entry.arg is not None else parameter_names(_our_override(entry, owner))
        check_signature(found, params, target=target, use=use)
    elif entry.guard == "called":
        caller = getattr(owner, entry.arg)
        called = {
            node.func.attr
            for node in ast.walk(_tree(caller))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        }
        if not callable(getattr(owner, name, None)) or name not in called:
            raise VerlMismatchError(target, f"a method {entry.arg} calls", "not called there (or gone)", use=use)
    elif entry.guard == "text":
        if entry.arg not in inspect.getsource(getattr(owner, name)):
            raise VerlMismatchError(target, f"a function writing {entry.arg!r}", "no such literal", use=use)
    elif entry.guard == "fields":
        _check_fields(entry, getattr(owner, name), _resolve(entry.arg), target=target, use=use)
    else:
        raise ValueError(f"contract entry {entry.symbol}: guard={entry.guard!r}; use one of {sorted(GUARDS)}")


def _check_fields(entry: Entry, verl_config: type, ours: type, *, target: str, use: str) -> None:
    """Our stand-in's fields are fields of verl's dataclass, and each field a registered verl policy loss reads with
    ``config.get(...)`` (a silent default when missing) is one of them."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    verl_fields = {f.name for f in fields(verl_config)} if is_dataclass(verl_config) else set()
    carried = {f.name for f in fields(ours)}
    if not carried <= verl_fields:
        raise VerlMismatchError(target, f"fields including {sorted(carried)}", f"{sorted(verl_fields)}", use=use)
    for mode, loss in sorted(POLICY_LOSS_REGISTRY.items()):
        read = {
            node.args[0].value
            for node in ast.walk(_tree(loss))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "config"
            if node.args and isinstance(node.args[0], ast.Constant)
        }
        missing = sorted((read & verl_fields) - carried)
        if missing:
            raise VerlMismatchError(
                f"verl policy loss {mode!r}", f"config.get of fields of {entry.arg} only", f"reads {missing}", use=use
            )


def check_contract(ours: str, symbol: str | None = None) -> None:
    """Run the guard of every :data:`CONTRACT` entry of module ``ours`` (only those whose symbol ends with
    ``symbol``, when given); VerlMismatchError when a verl symbol is not what it was written for."""
    for entry in CONTRACT:
        if entry.ours == ours and (symbol is None or entry.symbol.endswith(symbol)):
            check_entry(entry)


def markdown() -> str:
    """:data:`CONTRACT` as a markdown table (symbol, kind, used by, why, guard)."""
    rows = ["| verl symbol | kind | used by | why | guard |", "|---|---|---|---|---|"]
    for e in CONTRACT:
        arg = "" if e.arg is None else f": {e.arg.__name__ if isinstance(e.arg, type) else e.arg}"
        rows.append(f"| `{e.symbol}` | {e.kind} | `{e.ours}` | {e.why} | {e.guard}{arg} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verl_gigpo.verl_glue.contract [--check]``: print the table; with ``--check`` run every guard."""
    args = list(sys.argv[1:] if argv is None else argv)
    print(markdown())
    if "--check" in args:
        for entry in CONTRACT:
            if entry.guard != "binding":
                importlib.import_module(entry.ours)
            check_entry(entry)
        print(f"\n{len(CONTRACT)} entries, every guard passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
