"""The scale-out model, on paper: one ALFWorld iteration of the recipe on 1, 2, 4 and 8 nodes.

    python benchmarks/scale_out.py                      # the table of docs/multi-node.md
    python benchmarks/scale_out.py --write              # and replace it there (between the markers)
    python benchmarks/scale_out.py --response-tokens 300 --decode-tok-s 120 --nodes 1 2 4 8 16

An iteration of ``recipes/run_alfworld.sh``: 16 tasks x 8 episodes, each at most 50 steps (one generation and one
environment step per step, one training row per step). Per node count N (``NNODES``, ``N_GPUS`` GPUs each) it
prints what each node does: environment steps and their CPU and wall seconds, rollout tokens (prompt and reply),
update rows and their GPU seconds, optimizer steps, and the iteration's wall time with where it goes.

Where each figure comes from (the ``--help`` of each option says it again):

* measured: the CPU per ALFWorld step (65 ms, the middle of 55-80 ms, ``benchmarks/bench_alfworld.py
  --throughput``, benchmarks/RESULTS.md "ALFWorld throughput"), the reset CPU per iteration (35 s: 16 game loads
  of ~0.6 s and 128 resets of ~0.2 s, same section), and the mean prompt of an ALFWorld step (853 tokens,
  ``benchmarks/bench_rollout.py``, history 2, with the project's locally trained tokenizer: a Qwen tokenizer
  gives other counts);
* the recipe's settings: 16 tasks, group 8, 50 steps, ``MINI_BATCH_ROWS=256``, ``MICRO_BATCH_PER_GPU=32``,
  a 1.5B model, the reference policy (KL loss) and the rollout's log-probs as PPO's old ones recomputed by the actor;
* assumed (no GPU measurement in this repository): every episode runs its 50 steps (an untrained policy rarely
  finishes early), a reply of 120 tokens on average, 8 GPUs and 16 free cores per node, one vLLM replica per GPU
  decoding 200 tokens/s per sequence at these small batches (decode is latency-bound: 128 episodes give each of 8
  GPUs 16 sequences at N = 1), prefill 50,000 tokens/s per GPU, and training at 4e14 FLOP/s per GPU (~40 % of an
  H100's dense bf16 peak) with 2 x parameters FLOPs per token forward, 4 x backward.

The model's rules: episodes and their rows spread evenly over nodes (verl splits a batch evenly over its agent-loop
workers, placed round-robin on the nodes, and the update rows evenly over ranks); one step of an episode waits for
its generation and then its environment step, so an episode's 50 steps are a chain no node count shortens; the
environment's CPU per node is spread over the node's cores; the update is compute-bound. Not modelled:
communication (FSDP all-gathers grow with ranks, which makes the update figures at 4-8 nodes optimistic), weight
sync, validation, Ray start-up, stragglers.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from verl_gigpo.verl_glue.trainer import plan_mini_batches

__all__ = ["BEGIN", "DOC", "END", "NODES", "Assumptions", "NodeRow", "format_table", "main", "scale_out", "write_doc"]

#: the page that shows the table, between these markers
DOC = Path(__file__).resolve().parents[1] / "docs" / "multi-node.md"
BEGIN, END = "<!-- scale_out.py: begin -->", "<!-- scale_out.py: end -->"
#: the node counts of the table
NODES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Assumptions:
    """The inputs of :func:`scale_out` (module docstring: which are measured, set by the recipe, or assumed)."""

    tasks: int = 16  # recipe
    group: int = 8  # recipe
    steps: int = 50  # recipe's limit; assumed: every episode uses it
    cpu_ms_per_step: float = 65.0  # measured (55-80 ms)
    reset_cpu_s: float = 35.0  # measured (per iteration)
    prompt_tokens: float = 853.0  # measured (project tokenizer)
    response_tokens: float = 120.0  # assumed
    gpus_per_node: int = 8  # assumed
    cores_per_node: int = 16  # assumed free for environments
    decode_tok_s_per_seq: float = 200.0  # assumed
    prefill_tok_s_per_gpu: float = 50_000.0  # assumed
    params: float = 1.5e9  # recipe (Qwen2.5-1.5B-Instruct)
    train_flops_per_gpu: float = 4e14  # assumed
    mini_batch_rows: int = 256  # recipe
    micro_batch_per_gpu: int = 32  # recipe


@dataclass(frozen=True)
class NodeRow:
    """One node count: per node ``env_steps``, ``env_cpu_s``, ``prompt_tokens``, ``reply_tokens``, ``update_rows``;
    the iteration's ``ranks``, ``rows_per_optimizer_step``, ``optimizer_steps``, the wall seconds of its parts, and
    ``micro_batch_for_rows``: the largest ``MICRO_BATCH_PER_GPU`` (= the log-prob one) that keeps the recipe's
    ``mini_batch_rows`` per optimizer step (0: none does, there are more ranks than rows)."""

    nodes: int
    ranks: int
    env_steps: float
    env_cpu_s: float
    prompt_tokens: float
    reply_tokens: float
    update_rows: float
    rows_per_optimizer_step: int
    optimizer_steps: int
    rollout_s: float
    env_wall_s: float
    generate_s: float
    update_s: float
    micro_batch_for_rows: int

    @property
    def iteration_s(self) -> float:
        """Rollout phase (generation and environment chained per step, no overlap: an upper bound) then the update."""
        return self.rollout_s + self.update_s


def scale_out(nodes: int, a: Assumptions) -> NodeRow:
    """The per-node load and the iteration's wall-time parts on ``nodes`` nodes (module docstring for the rules).

    With E = tasks x group episodes of T steps, S = E x T steps, P / R prompt / reply tokens per step, N nodes of G
    GPUs and C cores:

    * environment CPU per node = (S x cpu_per_step + resets) / N, its wall = max(CPU / C, T x cpu_per_step): the
      cores share the steps, but an episode's own steps run one after another;
    * generation per step = R / decode_per_sequence + (E / (N G)) x P / prefill_per_GPU; the rollout phase is
      T x (generation per step + environment per step), environment per step = env wall / T;
    * update: S x (P + R) tokens x 10 x params FLOPs (forward and backward 6, the reference's and the old log-prob
      passes 2 each) over N G GPUs;
    * optimizer steps: the ``gigpo_sync`` trainer mode's plan (:func:`verl_gigpo.verl_glue.trainer.plan_mini_batches`):
      each mini-batch rounded up to a multiple of ranks x micro-batch, so a mini-batch holds at least that many rows.
    """
    e = a.tasks * a.group
    s = e * a.steps
    ranks = nodes * a.gpus_per_node
    env_cpu = (s * a.cpu_ms_per_step / 1000 + a.reset_cpu_s) / nodes
    env_wall = max(env_cpu / a.cores_per_node, a.steps * a.cpu_ms_per_step / 1000)
    seqs_per_gpu = e / ranks
    generate_per_step = a.response_tokens / a.decode_tok_s_per_seq + seqs_per_gpu * a.prompt_tokens / (
        a.prefill_tok_s_per_gpu
    )
    rollout = a.steps * (generate_per_step + env_wall / a.steps)
    flops = s * (a.prompt_tokens + a.response_tokens) * 10 * a.params
    update = flops / (ranks * a.train_flops_per_gpu)
    plan = plan_mini_batches(s, a.mini_batch_rows, ranks * a.micro_batch_per_gpu)  # the trainer mode's own plan
    return NodeRow(
        nodes=nodes,
        ranks=ranks,
        env_steps=s / nodes,
        env_cpu_s=env_cpu,
        prompt_tokens=s * a.prompt_tokens / nodes,
        reply_tokens=s * a.response_tokens / nodes,
        update_rows=s / nodes,
        rows_per_optimizer_step=plan.mini_batch_rows,
        optimizer_steps=plan.num_mini_batches,
        rollout_s=rollout,
        env_wall_s=env_wall,
        generate_s=a.steps * generate_per_step,
        update_s=update,
        micro_batch_for_rows=a.mini_batch_rows // ranks,
    )


def format_table(rows: list[NodeRow]) -> str:
    """The markdown table of docs/multi-node.md (per node where it says so)."""
    head = (
        "| nodes (GPUs) | env steps / node | env CPU s / node | env wall s | prompt tokens / node "
        "| reply tokens / node | update rows / node | rows per optimizer step (steps) | MICRO_BATCH_PER_GPU for "
        "256 | generation s | update s | iteration s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r.nodes} ({r.ranks}) | {r.env_steps:,.0f} | {r.env_cpu_s:,.0f} | {r.env_wall_s:,.1f} | "
        f"{r.prompt_tokens / 1e6:.2f} M | {r.reply_tokens / 1e3:,.0f} k | {r.update_rows:,.0f} | "
        f"{r.rows_per_optimizer_step:,} ({r.optimizer_steps}) | {r.micro_batch_for_rows or '-'} | "
        f"{r.generate_s:,.0f} | {r.update_s:,.1f} | {r.iteration_s:,.0f} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def write_doc(text: str, path: Path = DOC) -> None:
    """Replace the text between :data:`BEGIN` and :data:`END` in ``path`` by ``text`` (ValueError: no markers)."""
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{path} has no {BEGIN} ... {END} block to replace")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """CLI: print the table for ``--nodes`` with the assumptions given (module docstring)."""
    d = Assumptions()
    p = argparse.ArgumentParser(description="ALFWorld iteration per node at 1, 2, 4, 8 nodes (on paper)")
    p.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    p.add_argument("--write", action="store_true", help=f"replace the table in {DOC.name} (default settings only)")
    p.add_argument("--cpu-ms-per-step", type=float, default=d.cpu_ms_per_step, help="measured: 55-80 ms")
    p.add_argument("--prompt-tokens", type=float, default=d.prompt_tokens, help="measured: bench_rollout.py")
    p.add_argument("--response-tokens", type=float, default=d.response_tokens, help="assumed mean reply")
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node, help="assumed (N_GPUS)")
    p.add_argument("--cores-per-node", type=int, default=d.cores_per_node, help="assumed free for environments")
    p.add_argument("--decode-tok-s", type=float, default=d.decode_tok_s_per_seq, help="assumed, per sequence")
    p.add_argument("--prefill-tok-s", type=float, default=d.prefill_tok_s_per_gpu, help="assumed, per GPU")
    p.add_argument("--train-flops", type=float, default=d.train_flops_per_gpu, help="assumed FLOP/s per GPU")
    p.add_argument("--params", type=float, default=d.params, help="model parameters (recipe: 1.5e9)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.nodes):
        p.error(f"--nodes must be >= 1, got {args.nodes}")
    a = Assumptions(
        cpu_ms_per_step=args.cpu_ms_per_step,
        prompt_tokens=args.prompt_tokens,
        response_tokens=args.response_tokens,
        gpus_per_node=args.gpus_per_node,
        cores_per_node=args.cores_per_node,
        decode_tok_s_per_seq=args.decode_tok_s,
        prefill_tok_s_per_gpu=args.prefill_tok_s,
        train_flops_per_gpu=args.train_flops,
        params=args.params,
    )
    table = format_table([scale_out(n, a) for n in args.nodes])
    print(table)
    if args.write:
        if a != Assumptions() or tuple(args.nodes) != NODES:
            p.error("--write writes the table of the default settings only")
        write_doc(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
