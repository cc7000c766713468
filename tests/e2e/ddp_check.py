"""The example under ``torchrun`` as a 2-node gang of plain local processes (no Kubernetes): two
``torchrun examples/finetune.py`` on 127.0.0.1, one process each, DDP over gloo on CPU, each node
with its own checkpoint folder, told its place by ``PET_*`` as the operator does.

    .venv/bin/python -m tests.e2e.ddp_check [--workdir DIR] [--keep]

Shows, and exits 1 unless:

a. two uninterrupted runs end with bitwise-equal final weights (and equal losses);
b. a SIGTERM to one node's trainer mid-run makes both nodes save the same ``checkpoint-<step>``
   (the step after the one the signal followed, between regular saves), mark it complete, and
   stop: both workers exit 143, yet both ``torchrun`` exit 1. Twice: the signal sent to node 1's
   worker itself, then to node 1's ``torchrun`` (what the kubelet signals: the container's main
   process), which passes it on to its worker, waits for it (``--shutdown-timeout``, 30 s by
   default, then SIGKILL) and dies of the signal without reporting the worker's code;
c. each stopped gang, resumed with every node's folder holding the merged files of both nodes'
   ``checkpoint-<step>/`` (as the restore puts them), ends bitwise equal to the uninterrupted run,
   with the same loss at every step after the resume point.

Every run has its own free port and a bounded wait; the folders stay under ``--workdir`` (a new
temporary folder by default, removed on success unless ``--keep``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trainingrun.checkpoint import local
from trainingrun.integrations import hf

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "finetune.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
NODES = 2
MAX_STEPS, SAVE_STEPS = 30, 10
SIGNAL_AFTER = 13  # the signal follows node 0's progress showing this step: between saves
STEP_DELAY = 0.3  # seconds per step: the signal lands in the next step, not two later
RUN_TIMEOUT = 240
EXIT_STOPPED = 143
# torchrun's report of a failed worker: "rank : 1 (local_rank: 0)" ... "exitcode : 143 (pid: ..)"
FAILURE_RE = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)
STOPPED_RE = re.compile(r"stopped early \((.+?)\) at step (\d+) after saving; exit (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    rank: int
    folder: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def worker_pid(self) -> int | None:
        """The trainer process torchrun started (its child running the example)."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            for pid in map(int, children.split()):
                if SCRIPT.name in Path(f"/proc/{pid}/cmdline").read_text():
                    return pid
        except OSError:
            pass  # torchrun or the worker just exited
        return None

    def kill(self) -> None:
        """Ends torchrun and its worker (in a session of its own, out of torchrun's group)."""
        worker = self.worker_pid()
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def worker_exits(self) -> dict[int, int]:
        """Rank -> exit code, as torchrun reported its failed workers."""
        return {int(r): int(c) for r, c in FAILURE_RE.findall(self.log.read_text())}

    def stop(self) -> tuple[str, int, int] | None:
        """(reason, step, exit code) of the worker's last words, trainingrun.integrations.hf's
        warning."""
        found = STOPPED_RE.findall(self.log.read_text())
        return (found[-1][0], int(found[-1][1]), int(found[-1][2])) if found else None


@dataclass
class Gang:
    name: str
    nodes: list[Node]
    started: float

    def wait(self) -> list[int]:
        """torchrun's exit codes; both are killed (their process groups) past the timeout."""
        deadline = self.started + RUN_TIMEOUT
        try:
            codes = [n.proc.wait(timeout=max(0.1, deadline - time.monotonic())) for n in self.nodes]
        except subprocess.TimeoutExpired:
            for n in self.nodes:
                n.kill()
            raise SystemExit(
                f"{self.name}: not done in {RUN_TIMEOUT}s; logs in {self.nodes[0].log}"
            ) from None
        print(f"  {self.name}: torchrun exits {codes}, {time.monotonic() - self.started:.1f}s")
        return codes


def start(
    work: Path,
    name: str,
    delay: float = 0.0,
    resume: dict[int, Path] | None = None,
    steps: tuple[int, int] = (MAX_STEPS, SAVE_STEPS),
) -> Gang:
    """Both nodes of a gang of the example (``steps``: max steps and save steps), in
    ``<work>/<name>/node<rank>``; losses in ``<work>/<name>/loss.jsonl``."""
    port, nodes = free_port(), []
    for rank in range(NODES):
        folder = work / name / f"node{rank}"
        folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            # What the operator sets on each member; torchrun reads them as its node arguments.
            "PET_NNODES": str(NODES),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "TRAININGRUN_CHECKPOINT_DIR": str(folder),
            "TRAININGRUN_RESUME_FROM": str(resume[rank]) if resume else "",
            "HF_HUB_OFFLINE": "1",  # proves the example needs no hub
        }
        args = [f"--max-steps={steps[0]}", f"--save-steps={steps[1]}", f"--step-delay={delay}"]
        log = work / name / f"node{rank}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(TORCHRUN), str(SCRIPT), *args, f"--loss-log={work / name / 'loss.jsonl'}"],
                env=env,
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one on timeout
            )
        nodes.append(Node(rank, folder, log, proc))
    return Gang(name, nodes, time.monotonic())


def losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def weights(node0: Path) -> bytes:
    return (node0 / "final" / "model.safetensors").read_bytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def checkpoints(folder: Path) -> dict[int, bool]:
    """Step -> marked complete, of every checkpoint-<step>/ in a node's folder."""
    return {c.step: c.marked for c in local.scan(folder)}


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def wait_for_step(gang: Gang, step: int) -> int:
    deadline = gang.started + RUN_TIMEOUT
    while time.monotonic() < deadline:
        progress = local.read_progress(gang.nodes[0].folder)  # written by world process zero
        if progress is not None and progress.step >= step:
            return progress.step
        if any(n.proc.poll() is not None for n in gang.nodes):
            for n in gang.nodes:
                n.kill()
            raise SystemExit(f"{gang.name}: a node exited before step {step}")
        time.sleep(0.02)
    raise SystemExit(f"{gang.name}: step {step} not reached in {RUN_TIMEOUT}s")


def merge(work: Path, stopped: Gang, step: int) -> dict[int, Path]:
    """What the restore puts in every node's folder: the union of the nodes' parts."""
    resume = {}
    name = f"checkpoint-{step}"
    for rank in range(NODES):
        target = work / f"{stopped.name}-resumed" / f"node{rank}" / name
        target.mkdir(parents=True)
        for node in stopped.nodes:
            for f in (node.folder / name).iterdir():
                if f.name != local.COMPLETE_MARKER:
                    shutil.copy2(f, target / f.name)
        resume[rank] = target
    return resume


def uninterrupted(work: Path, failures: list[str]) -> tuple[bytes, dict[int, float]]:
    print("a. two uninterrupted 2-node runs")
    runs = []
    for name in ("uninterrupted-1", "uninterrupted-2"):
        gang = start(work, name)
        check(gang.wait() == [0, 0], f"{name}: both torchruns exit 0", failures)
        node0, node1 = (n.folder for n in gang.nodes)
        saves = dict.fromkeys(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS), True)
        check(
            checkpoints(node0) == checkpoints(node1) == saves,
            f"{name}: checkpoints {sorted(saves)} on both nodes, all marked",
            failures,
        )
        check(not (node1 / "final").exists(), f"{name}: final weights from rank 0 only", failures)
        runs.append((weights(node0), losses(work / name / "loss.jsonl")))
    (w1, l1), (w2, l2) = runs
    print(f"  final weights sha256: {digest(w1)} / {digest(w2)}")
    check(w1 == w2, "final weights bitwise equal: gloo DDP on CPU is deterministic", failures)
    check(l1 == l2 and sorted(l1) == list(range(1, MAX_STEPS + 1)), "same loss log", failures)
    return w1, l1


def stop_and_resume(
    work: Path, target: str, reference: tuple[bytes, dict[int, float]], failures: list[str]
) -> None:
    name = f"sigterm-{target}"
    print(f"b. SIGTERM to node 1's {target} mid-run")
    gang = start(work, name, delay=STEP_DELAY)
    seen = wait_for_step(gang, SIGNAL_AFTER)
    node1 = gang.nodes[1]
    worker = node1.worker_pid()
    assert worker is not None, "node 1 has no worker"
    os.kill(worker if target == "worker" else node1.proc.pid, signal.SIGTERM)
    asked = time.monotonic()
    codes = gang.wait()
    print(f"  signalled after step {seen}; the gang ended {time.monotonic() - asked:.1f}s later")
    saved = [checkpoints(n.folder) for n in gang.nodes]
    print(f"  checkpoints (step: marked) node 0 {saved[0]}, node 1 {saved[1]}")
    step = max(saved[0], default=0)
    check(
        saved[0] == saved[1] and step == seen + 1 and all(saved[0].values()),
        f"both nodes saved checkpoint-{step} (signal after step {seen}), marked complete",
        failures,
    )
    stops = [n.stop() for n in gang.nodes]
    print(f"  workers' last words (reason, step, exit): {stops}")
    check(
        stops == [(hf.PEER_STOP, step, EXIT_STOPPED), ("SIGTERM", step, EXIT_STOPPED)],
        "node 1 stopped on SIGTERM, node 0 with it, both exit 143",
        failures,
    )
    exits = {rank: code for n in gang.nodes for rank, code in n.worker_exits().items()}
    print(f"  worker exit codes torchrun reported (rank: code): {exits}")
    # A torchrun signalled itself forwards the signal, waits for its worker, then dies of the
    # signal's exception (exit 1) without reporting the worker's code.
    reported = {0: EXIT_STOPPED} if target == "torchrun" else {0: EXIT_STOPPED, 1: EXIT_STOPPED}
    check(exits == reported, f"torchrun reported {reported}", failures)
    check(codes == [1, 1], "both torchruns exit 1, not 143", failures)
    check(not (gang.nodes[0].folder / "final").exists(), "no final weights", failures)

    print(f"c. resume from checkpoint-{step}, both nodes' parts merged on each node")
    resumed = start(work, f"{name}-resumed", resume=merge(work, gang, step))
    check(resumed.wait() == [0, 0], "both torchruns exit 0", failures)
    final = weights(resumed.nodes[0].folder)
    print(f"  final weights sha256: {digest(final)} (uninterrupted {digest(reference[0])})")
    check(final == reference[0], "final weights bitwise equal to the uninterrupted run", failures)
    before, after = losses(work / name / "loss.jsonl"), losses(work / f"{name}-resumed/loss.jsonl")
    check(
        sorted(after) == list(range(step + 1, MAX_STEPS + 1))
        and all(before[s] == reference[1][s] for s in range(1, step + 1))
        and all(after[s] == reference[1][s] for s in after),
        "same loss as the uninterrupted run at every step, before and after the resume",
        failures,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="default: a new temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the workdir on success")
    opts = parser.parse_args()
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="ddp-check-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{NODES} nodes x 1 process, {MAX_STEPS} steps, saves every {SAVE_STEPS}; in {work}")
    started, failures = time.monotonic(), []
    reference = uninterrupted(work, failures)
    stop_and_resume(work, "worker", reference, failures)
    stop_and_resume(work, "torchrun", reference, failures)
    print(f"{len(failures)} failed, {time.monotonic() - started:.0f}s in all")
    if failures:
        print(f"logs in {work}")
        return 1
    if not opts.keep and not opts.workdir:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
