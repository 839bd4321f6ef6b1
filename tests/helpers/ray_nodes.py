"""Ray nodes on one machine, and the launch settings of the two-node test: shared by tests/test_multinode.py and the
multi-node benchmarks (benchmarks/multinode_compare.py, node_leaving.py, node_leaving_runner_lives.py).

Each node is a ``ray start --block`` process in its own process group, stopped by signalling that group (never
``ray stop``, which stops every Ray on the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
#: the environment the launches play: gridnav in environment worker processes that record their pids
ENV_NAME = "gridnav_pid"
#: logical CPUs per node: verl's rank bundle takes 3, TransferQueue, the task runner and the workers one each
NODE_CPUS = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class RayNode:
    """One ``ray start --block`` process (a Ray node) in its own process group, with its output in ``log``."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]):
        ray = Path(sys.executable).with_name("ray")
        self.name, self.log = name, log
        cmd = [str(ray if ray.exists() else shutil.which("ray")), "start", "--block", *args]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_started(self, timeout: float = 420) -> None:
        """Return once the node says "Ray runtime started."; fail naming the log when it exits or takes too long."""
        deadline = time.monotonic() + timeout
        while "Ray runtime started." not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node {self.name} did not start; its log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to the node's process group (``ray start --block`` stops the processes it started), after 5 s
        SIGKILL to whatever of the group is left."""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:  # the leader is gone; its children may not be
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return


@contextlib.contextmanager
def two_ray_nodes() -> Iterator[tuple[str, list[RayNode]]]:
    """A Ray head and one more node on this machine, 1 logical GPU and :data:`NODE_CPUS` CPUs each (:func:`ray_nodes`);
    yields the head's address (``IP:PORT``) and the nodes ``[head, second]``, and stops both nodes on exit."""
    with ray_nodes((1, 1)) as started:
        yield started


@contextlib.contextmanager
def ray_nodes(gpus: Sequence[int]) -> Iterator[tuple[str, list[RayNode]]]:
    """Ray nodes on this machine, one per entry of ``gpus`` (its logical GPUs; :data:`NODE_CPUS` CPUs each), the
    first the head; yields the head's address (``IP:PORT``) and the nodes ``[head, second, third, ...]``, and stops
    them all on exit.

    Every node gets the project and these helpers on ``PYTHONPATH``: Ray's workers start from their node's
    environment, so what a launch imports must be installed (or on the path) on every node. No dashboard (the tests
    read the GCS tables directly): ~10 processes fewer to start. The nodes' temp folders are short paths under /tmp:
    Ray puts its sockets there, a Unix socket path holds at most 107 bytes, and pytest's own temp paths
    (``/tmp/pytest-of-USER/pytest-N/popen-gwK/...``) leave too little room.

    Raises:
        ValueError: no node asked for, or a negative GPU count.
        RuntimeError: a node did not start (with the end of its log).
    """
    import ray

    if not gpus or any(n < 0 for n in gpus):
        raise ValueError(f"gpus must list each node's logical GPUs (>= 0), head first; got {list(gpus)}")
    root = Path(tempfile.mkdtemp(prefix="gigpo-ray-"))
    pythonpath = os.pathsep.join(p for p in (str(ROOT), str(HELPERS), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERL_PLATFORM")},
        "PYTHONPATH": pythonpath,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray 2.60's `ray start --head` turns token authentication on unless this is set, and a node or driver
        # given an explicit address then needs the token (docs/multi-node.md); a cluster on one machine needs none
        "RAY_AUTH_MODE": "disabled",
    }
    # the machine's address, as Ray picks it for the nodes and the launch's driver alike (a driver attaches to the
    # node of its own address)
    ip = ray.util.get_node_ip_address()
    port = _free_port()
    address = f"{ip}:{port}"
    common = [f"--num-cpus={NODE_CPUS}", "--object-store-memory=300000000", "--disable-usage-stats"]
    head_args = [
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--ray-client-server-port={_free_port()}",
    ]
    names = ["head", "second", "third", "fourth"] + [f"node{i}" for i in range(4, len(gpus))]
    nodes = []
    try:
        for i, (name, count) in enumerate(zip(names, gpus, strict=False)):
            first = head_args if i == 0 else [f"--address={address}"]
            args = [*first, f"--temp-dir={root / name}", f"--dashboard-agent-listen-port={_free_port()}"]
            node = RayNode(name, [*args, f"--num-gpus={count}", *common], root / f"{name}.log", env)
            nodes.append(node)
            node.wait_started()
        yield address, nodes
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


def prepare_launch(out: Path) -> tuple[Path, list[str]]:
    """Register :data:`ENV_NAME` on this driver, write its task files under ``out/data`` (16 train, 4 validation
    tasks) and return ``(records, extra)``: the folder the environment worker processes record their pids in, and
    the launch's extra Hydra overrides (the environment registered in every worker, one environment worker process
    per agent-loop worker, two agent-loop workers, no validation)."""
    from environments import register_env
    from verl_gigpo.data.prepare import write_task_files

    records = out / "env_pids"
    records.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HELPERS))
    try:
        register_env(ENV_NAME, "gigpo_pid_env:PidGridNav")
        write_task_files(ENV_NAME, out / "data", train_size=16, val_size=4)
    finally:
        sys.path.remove(str(HELPERS))
    extra = [
        f"+env.registry.{ENV_NAME}=gigpo_pid_env:PidGridNav",
        f"+env.kwargs.record_dir={records}",
        "env.num_workers=1",  # one environment worker process per agent-loop worker
        "actor_rollout_ref.rollout.agent.num_workers=2",  # verl places them round-robin over the nodes
        "trainer.test_freq=-1",
    ]
    return records, extra


def launch_overrides(
    out: Path, run_dir: Path, extra: list[str], *, ranks: int, nnodes: int, total_steps: int, save_freq: int
) -> list[str]:
    """The Hydra overrides of a GiGPO launch of these settings (``extra`` from :func:`prepare_launch`, task files
    under ``out/data``, the gridnav action model, no validation before training) with ``ranks`` per node on
    ``nnodes`` nodes, experiment folder ``run_dir/ckpt``."""
    from verl_gigpo.dev.smoke import DEFAULT_MODEL, ensure_model, pipeline_overrides

    return pipeline_overrides(
        model_dir=ensure_model(ROOT / DEFAULT_MODEL),
        data_dir=out / "data",
        run_dir=run_dir,
        estimator="gigpo",
        total_steps=total_steps,
        ranks=ranks,
        save_freq=save_freq,
        val_before_train=False,
        extra=[*extra, f"trainer.nnodes={nnodes}"],
    )


def benchmark_folder(doc: str, default_out: str, argv: list[str] | None) -> tuple[Path, list[str]]:
    """The start of the multi-node benchmark scripts: their command line (``--out``, default ``default_out``; the
    description is ``doc``'s first paragraph), the folder made absolute and refused (SystemExit with one line) when
    it holds anything, ``RAY_ADDRESS`` dropped (their launches start or join the nodes they make), and
    :func:`prepare_launch` under it. Returns ``(out, extra)``: the folder and the launches' extra overrides."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(default_out), help="where the runs go")
    out = parser.parse_args(argv).out.resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: --out {out} is not empty; choose another folder or delete it")
    os.environ.pop("RAY_ADDRESS", None)
    _, extra = prepare_launch(out)
    return out, extra
