"""GPU and host memory each model needs at the GPU recipes' settings, COMPUTED from parameter counts (not measured).

    python benchmarks/memory_table.py            # print the markdown tables
    python benchmarks/memory_table.py --write    # and replace them in docs/models.md (between the markers)

The recipes' settings are read from what they run: ``DRY_RUN=1 bash recipes/run_<env>.sh`` prints the command, and
the micro-batch size, prompt and response lengths, vLLM's ``gpu_memory_utilization`` and tensor parallelism are
taken from its overrides. Parameter counts come from each model's architecture (:class:`ModelSpec`, the fields of
its Hugging Face ``config.json``); tests/test_memory_table.py checks the formula against the parameter count of the
same model built by transformers, and the LoRA count against PEFT's.

What is counted, per GPU, for N GPUs (verl 0.9.1 as the recipes compose it; P = parameters, L = LoRA parameters):

1. The actor (FSDP, ``strategy=fsdp``, parameters sharded over the N GPUs): ``fsdp_config.model_dtype=fp32``, so
   the sharded parameters are float32 (4 B), with bf16 compute (FSDP ``MixedPrecision(param_dtype=bf16,
   reduce_dtype=fp32)``, verl's ``FSDPEngine._build_fsdp_module``); gradients float32 (4 B); AdamW's two moments
   float32 (8 B). Full fine-tuning: 12 P / N bytes stay on the GPU between updates (``param_offload=false``,
   ``optimizer_offload=false``; gradients are freed when the update ends: verl zeroes them with ``set_to_none``),
   16 P / N during the update. LoRA (rank R on every linear layer of the decoder, PEFT's ``all-linear``): the frozen
   base is float32 too, 4 P / N, plus 12 L / N (16 L / N during the update) for the adapter.
2. vLLM (``rollout.name=vllm``, one engine per GPU at ``tensor_model_parallel_size=1``): it takes
   ``gpu_memory_utilization`` (u) of the card's memory while it generates. That share is a reservation: its bf16
   weights (2 P / TP bytes), its activations and CUDA graphs, and a KV cache filling the rest. During the actor's
   update vLLM sleeps and gives the share back (sleep level 2 for full fine-tuning: weights dropped and reloaded from
   the actor; level 1 with a LoRA adapter: weights kept in host memory).
3. The reference model (full fine-tuning with the KL loss, the recipes' default): float32 (``model_dtype=fp32``)
   and offloaded to the CPU (``ref.fsdp_config.param_offload=true``; verl also forces FSDP ``CPUOffload`` on a
   forward-only model): 4 P bytes of host memory for the node, nothing resident on the GPU. With LoRA the recipes
   turn the KL loss off, and a KL loss would use the actor with its adapter disabled: no second model.

Not counted: activations (they depend on the tokens per micro-batch; :func:`logits_rows` gives the largest term for
each recipe), the per-layer bf16 copies FSDP gathers for one layer's forward and backward, the buffers of a weight
sync, and the host memory of loading a checkpoint.

The smallest card, in GiB, is where both phases fit:

    generation:  12 P / N (+ LoRA terms) + O   <=  (1 - u) * C      the actor's resident state beside vLLM's share
                 2 P / TP + R                   <=  u * C           vLLM's weights and runtime inside its share
    update:      16 P / N (+ LoRA terms) + O   <=  C                vLLM asleep; activations not counted

O = :data:`OVERHEAD_GIB` (CUDA contexts of the trainer and vLLM processes, NCCL buffers, allocator slack) and
R = :data:`VLLM_RUNTIME_GIB` (vLLM's activations, CUDA graphs and a small KV cache) are assumptions, not measurements.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- memory_table.py: begin -->", "<!-- memory_table.py: end -->"

GIB = 2**30
#: GiB per GPU outside vLLM's share that the tables assume: CUDA contexts, NCCL buffers, allocator slack (assumed)
OVERHEAD_GIB = 2.0
#: GiB inside vLLM's share besides its weights: activations, CUDA graphs and a small KV cache (assumed)
VLLM_RUNTIME_GIB = 2.0
#: GPU counts of the tables
GPU_COUNTS = (1, 2, 4, 8)
#: memory sizes of common cards, GB as sold (24: RTX 4090, L4, A10; 40: A100 40GB; 48: L40S, RTX 6000 Ada, A6000;
#: 80: A100 / H100 80GB; 141: H200)
CARDS_GB = (24, 40, 48, 80, 141)
RECIPES = ("alfworld", "webshop", "sokoban", "search", "ezpoints", "numberline", "blackjack")

FP32, BF16 = 4, 2
#: bytes per trained parameter on the GPU between updates (fp32 weight + AdamW's two fp32 moments) and during one
#: (+ the fp32 gradient)
TRAINED_RESIDENT, TRAINED_UPDATE = FP32 + 2 * FP32, FP32 + 2 * FP32 + FP32


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower of a Qwen-VL model, by the fields of its ``config.json``'s ``vision_config``.

    ``family``: ``qwen2_vl`` (LayerNorm, a GELU MLP of ``intermediate`` = mlp_ratio x hidden), ``qwen2_5_vl``
    (RMSNorm, a gated MLP with biases) or ``qwen3_vl`` (LayerNorm, a biased two-layer MLP, learned position
    embeddings, a biased patch embedding and one extra merger per ``deepstack`` layer). ``out``: the merger's output
    width (the decoder's hidden size).
    """

    family: str
    depth: int
    hidden: int
    intermediate: int
    out: int
    patch: int = 14
    positions: int = 0
    deepstack: int = 0

    def _linears(self) -> list[tuple[int, int, int]]:
        """Every linear layer of the tower as (in, out, count)."""
        e, i, m = self.hidden, self.intermediate, 4 * self.hidden  # m: 2x2 merged patches
        mlp = [(e, i, 2), (i, e, 1)] if self.family == "qwen2_5_vl" else [(e, i, 1), (i, e, 1)]
        mergers = 1 + self.deepstack
        return [(e, 3 * e, self.depth), (e, e, self.depth), *((a, b, n * self.depth) for a, b, n in mlp)] + [
            (m, m, mergers),
            (m, self.out, mergers),
        ]

    def params(self) -> int:
        """Parameters: the patch embedding (3 x 2 x p x p x E [+ E bias]), [position embeddings x E], depth blocks
        (qkv, proj, MLP with biases; 2 norms), the merger(s) (a norm over E, or 4E post-shuffle for deepstack ones,
        and two biased linears)."""
        e = self.hidden
        linears = sum(n * (a * b + b) for a, b, n in self._linears())
        norm = e if self.family == "qwen2_5_vl" else 2 * e  # RMSNorm: weight; LayerNorm: weight and bias
        patch = 3 * 2 * self.patch * self.patch * e + (e if self.family == "qwen3_vl" else 0)
        merger_norms = norm + self.deepstack * 2 * 4 * e
        return patch + self.positions * e + linears + 2 * norm * self.depth + merger_norms

    def lora_params(self, rank: int) -> int:
        """Parameters of a rank-``rank`` LoRA adapter on every linear layer of the tower: r (in + out) each."""
        return rank * sum(n * (a + b) for a, b, n in self._linears())


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer of the Qwen2 / Qwen3 families, by the fields of its ``config.json``.

    ``qkv_bias``: q/k/v projections have a bias (Qwen2). ``qk_norm``: per-head RMSNorm of q and k (Qwen3).
    ``tied``: the output layer shares the embedding matrix. ``public``: the rounded parameter count its model card
    states, for comparison.
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    public: str
    vision: VisionSpec | None = None

    def params(self) -> int:
        """Parameters P = V h (embedding) + [V h if untied] + h (final norm) + layers x (attention + MLP + 2 norms):

        attention = h (n_q d) + 2 h (n_kv d) + (n_q d) h [+ n_q d + 2 n_kv d biases] [+ 2 d q/k norms]
        MLP = 3 h I (gate, up, down);  norms = 2 h.
        """
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        layer = attention + 3 * h * self.intermediate + 2 * h
        embeddings = self.vocab * h * (1 if self.tied else 2)
        return embeddings + h + self.layers * layer + (self.vision.params() if self.vision else 0)

    def lora_params(self, rank: int) -> int:
        """Parameters L of a rank-``rank`` LoRA adapter on every linear layer of the decoder (PEFT's
        ``all-linear``: q, k, v, o, gate, up, down; not the output layer): r (in + out) per layer, summed."""
        h, q, kv, inter = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
        return rank * per_layer * self.layers + (self.vision.lora_params(rank) if self.vision else 0)


#: The vision towers of the vision-language models (``vision_config`` of each config.json; sources: docs/models.md)
_V2_2B = VisionSpec("qwen2_vl", depth=32, hidden=1280, intermediate=4 * 1280, out=1536)
_V25_3B = VisionSpec("qwen2_5_vl", depth=32, hidden=1280, intermediate=3420, out=2048)
_V25_7B = VisionSpec("qwen2_5_vl", depth=32, hidden=1280, intermediate=3420, out=3584)
_V3_4B = VisionSpec(
    "qwen3_vl", depth=24, hidden=1024, intermediate=4096, out=2560, patch=16, positions=2304, deepstack=3
)
_V3_8B = VisionSpec(
    "qwen3_vl", depth=27, hidden=1152, intermediate=4304, out=4096, patch=16, positions=2304, deepstack=3
)

#: The families the recipes are composed for (Qwen2.5-Instruct) and Qwen3 (with THINKING=0), from their config.json
MODELS = (
    ModelSpec("Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 64, 4864, 151936, True, True, False, "0.49B"),
    ModelSpec("Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 128, 8960, 151936, True, True, False, "1.54B"),
    ModelSpec("Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 128, 11008, 151936, True, True, False, "3.09B"),
    ModelSpec("Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 128, 18944, 152064, False, True, False, "7.61B"),
    ModelSpec("Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, True, False, True, "0.6B"),
    ModelSpec("Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936, True, False, True, "1.7B"),
    ModelSpec("Qwen3-4B", 2560, 36, 32, 8, 128, 9728, 151936, True, False, True, "4.0B"),
    ModelSpec("Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, False, False, True, "8.2B"),
    # vision-language models (the image recipes): the decoder as above plus the vision tower (VISION_TOWERS)
    ModelSpec("Qwen2-VL-2B-Instruct", 1536, 28, 12, 2, 128, 8960, 151936, True, True, False, "2B (name)", _V2_2B),
    ModelSpec("Qwen2.5-VL-3B-Instruct", 2048, 36, 16, 2, 128, 11008, 151936, True, True, False, "3B (name)", _V25_3B),
    ModelSpec("Qwen2.5-VL-7B-Instruct", 3584, 28, 28, 4, 128, 18944, 152064, False, True, False, "7B (name)", _V25_7B),
    ModelSpec("Qwen3-VL-4B-Instruct", 2560, 36, 32, 8, 128, 9728, 151936, True, False, True, "4B (name)", _V3_4B),
    ModelSpec("Qwen3-VL-8B-Instruct", 4096, 36, 32, 8, 128, 12288, 151936, False, False, True, "8B (name)", _V3_8B),
)


@dataclass(frozen=True)
class RecipeSettings:
    """What a recipe's command sets that the memory depends on."""

    name: str
    model: str
    micro_batch: int
    prompt_length: int
    response_length: int
    gpu_memory_utilization: float
    tensor_parallel: int


def recipe_settings(recipe: str) -> RecipeSettings:
    """The settings of ``DRY_RUN=1 bash recipes/run_<recipe>.sh`` at its defaults (only ``PATH`` and ``HOME`` of the
    caller's environment are passed on, so no variable of the caller's changes them).

    Raises:
        RuntimeError: the dry run failed (its stderr is in the message).
    """
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    proc = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"run_{recipe}.sh")],
        env={**env, "DRY_RUN": "1", "DEVICE": "cuda"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"DRY_RUN=1 bash recipes/run_{recipe}.sh failed: {proc.stderr.strip()}")
    command = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))
    overrides = dict(a.split("=", 1) for a in shlex.split(command.replace("\\\n", " ")) if "=" in a)
    key = "actor_rollout_ref.{}".format
    return RecipeSettings(
        name=recipe,
        model=Path(overrides[key("model.path")]).name,
        micro_batch=int(overrides[key("actor.ppo_micro_batch_size_per_gpu")]),
        prompt_length=int(overrides["data.max_prompt_length"]),
        response_length=int(overrides["data.max_response_length"]),
        gpu_memory_utilization=float(overrides[key("rollout.gpu_memory_utilization")]),
        tensor_parallel=int(overrides[key("rollout.tensor_model_parallel_size")]),
    )


def gib(n_bytes: float) -> float:
    """Bytes in GiB."""
    return n_bytes / GIB


def actor_gib(model: ModelSpec, n_gpus: int, lora_rank: int, *, update: bool) -> float:
    """The actor's memory per GPU (GiB): between updates (``update=False``) or during one (see the module doc)."""
    trained = TRAINED_UPDATE if update else TRAINED_RESIDENT
    if lora_rank == 0:
        return gib(trained * model.params() / n_gpus)
    return gib((FP32 * model.params() + trained * model.lora_params(lora_rank)) / n_gpus)


def smallest_card_gib(model: ModelSpec, n_gpus: int, lora_rank: int, u: float, tp: int) -> float:
    """The smallest card (GiB) on which generation and update fit (the three inequalities of the module doc)."""
    resident = actor_gib(model, n_gpus, lora_rank, update=False) + OVERHEAD_GIB
    vllm = gib(BF16 * model.params() / tp) + VLLM_RUNTIME_GIB
    update = actor_gib(model, n_gpus, lora_rank, update=True) + OVERHEAD_GIB
    return max(resident / (1 - u), vllm / u, update)


def card_name(need_gib: float) -> str:
    """The smallest of :data:`CARDS_GB` that holds ``need_gib`` (a card sold as X GB has about X GiB), or '>141'."""
    for size in CARDS_GB:
        if need_gib <= size:
            return f"{size} GB"
    return f"> {CARDS_GB[-1]} GB"


def logits_rows(settings: RecipeSettings) -> tuple[int, float]:
    """``(tokens, GiB)``: the most tokens one actor micro-batch holds (micro-batch rows x (prompt + response)) and
    their bf16 logits (tokens x vocabulary x 2 B), the largest activation of the update."""
    model = next(m for m in MODELS if m.name == settings.model)
    tokens = settings.micro_batch * (settings.prompt_length + settings.response_length)
    return tokens, gib(tokens * model.vocab * BF16)


def tables(lora_rank: int = 64) -> str:
    """The markdown of docs/models.md's tables, from the recipes' settings (one u and TP for all of them)."""
    settings = [recipe_settings(r) for r in RECIPES]
    shares = {(s.gpu_memory_utilization, s.tensor_parallel) for s in settings}
    if len(shares) != 1:
        raise RuntimeError(f"the recipes differ in vLLM's gpu_memory_utilization or tensor parallel size: {shares}")
    u, tp = shares.pop()
    n_cols = " | ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in GPU_COUNTS)
    rule = "|---" * (1 + len(GPU_COUNTS)) + "|"
    out = [
        f"Computed, not measured (`python benchmarks/memory_table.py`). vLLM's share u = {u} of each card, tensor "
        f"parallel size {tp}; assumed overheads: {OVERHEAD_GIB:g} GiB per GPU outside vLLM's share, "
        f"{VLLM_RUNTIME_GIB:g} GiB inside it besides the weights; activations not counted.",
        "",
        "**Per model** (P: parameters, the vision tower's included; LoRA: rank "
        + f"{lora_rank} on every linear layer of the decoder and, for the -VL models, of the vision tower)",
        "",
        "| model | P (config arithmetic) | P (model card) | vLLM weights per GPU, bf16 | LoRA parameters "
        "| host RAM: reference model (full fine-tuning) | host RAM per GPU: vLLM weights asleep (LoRA) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in MODELS:
        out.append(
            f"| {m.name} | {m.params() / 1e9:.3f}B | {m.public} | {gib(BF16 * m.params() / tp):.1f} GiB "
            f"| {m.lora_params(lora_rank) / 1e6:.0f}M | {gib(FP32 * m.params()):.1f} GiB "
            f"| {gib(BF16 * m.params()):.1f} GiB |"
        )
    for title, rank in (("full fine-tuning (the recipes' default)", 0), (f"LoRA rank {lora_rank}", lora_rank)):
        out += [
            "",
            f"**Actor per GPU, {title}**: GiB between updates / during one (FSDP over N GPUs)",
            "",
            f"| model | {n_cols} |",
            rule,
        ]
        for m in MODELS:
            cells = [
                f"{actor_gib(m, n, rank, update=False):.1f} / {actor_gib(m, n, rank, update=True):.1f}"
                for n in GPU_COUNTS
            ]
            out.append(f"| {m.name} | " + " | ".join(cells) + " |")
        out += [
            "",
            f"**Smallest card, {title}**: GiB needed per GPU (→ the smallest common card that holds it)",
            "",
            f"| model | {n_cols} |",
            rule,
        ]
        for m in MODELS:
            needs = [smallest_card_gib(m, n, rank, u, tp) for n in GPU_COUNTS]
            out.append(f"| {m.name} | " + " | ".join(f"{c:.0f} (→ {card_name(c)})" for c in needs) + " |")
    out += [
        "",
        "**Activations, not in the tables above**: the largest is the logits of one actor micro-batch, at most "
        "(recipe defaults; fewer when replies and prompts are shorter than their limits)",
        "",
        "| recipe | model | micro-batch rows per GPU | tokens at most | bf16 logits at most |",
        "|---|---|---|---|---|",
    ]
    for s in settings:
        tokens, size = logits_rows(s)
        out.append(
            f"| {s.name} | {s.model} | {s.micro_batch} | {s.micro_batch} × ({s.prompt_length} + "
            f"{s.response_length}) = {tokens:,} | {size:.1f} GiB |"
        )
    return "\n".join(out) + "\n"


def write_doc(text: str, path: Path = DOC) -> None:
    """Replace the text between :data:`BEGIN` and :data:`END` in ``path`` by ``text``.

    Raises:
        ValueError: ``path`` lacks either marker.
    """
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{path} has no {BEGIN} ... {END} block to replace")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv: list[str] | None = None) -> None:
    """Print the tables; with ``--write`` also replace them in docs/models.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lora-rank", type=int, default=64, help="rank of the LoRA tables (the reference's: 64)")
    parser.add_argument("--write", action="store_true", help="replace the tables in docs/models.md")
    args = parser.parse_args(argv)
    if args.lora_rank < 1:
        parser.error(f"--lora-rank={args.lora_rank} must be >= 1")
    text = tables(args.lora_rank)
    print(text, end="")
    if args.write:
        write_doc(text)


if __name__ == "__main__":
    main()
