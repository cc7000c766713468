"""The DeepSpeed and MindFormers layout rules on files written by the real libraries: no cluster,
plain local processes with the python of the stack's virtualenv (``make lightning-env``, which
has DeepSpeed; ``make mindformers-env``), all started at once by a module fixture
(tests/layout_savers/).

Covers:
- DeepSpeed 0.19 on CPU, three saves each: ZeRO-1, ZeRO-2 with bf16, ZeRO-3 and stage 0 in one
  process, ZeRO-2 and ZeRO-3 in two (torchrun). The files are those tests/trainer_layouts.py
  lays out, and rank 0 writes them in its order; ``survey`` (auto and ``deepspeed``) finds every
  tag with its step, files, ``latest`` to write back and the save folder to resume from, claims
  every file (zero_to_fp32.py, zero_to_torch.py); older tags are proved whole, the newest once
  quiet with ``latest`` naming it, never at the drain after a kill;
- DeepSpeed saves killed at every point: the real files replayed in the order they were written
  (their modification times; ``latest`` at each save's time), each file also cut short: the
  newest tag is never complete when the trainer has just died, older tags always are, and once
  quiet the newest is complete exactly when all its files are there and ``latest`` names it
  (not checked for the first tag of a two-process run, which has no older tag to count the
  shards against, nor for a file cut short: a file written in place looks whole once quiet);
  a two-process run's newest tag without rank 1's optimizer shard is never complete;
- MindFormers 1.9 (MindSpore 2.9, CPU), two ranks, two epochs, a save every 2 steps, keeping 3:
  the library's operations (journal) are those tests/trainer_layouts.py lays out (``<name>.tmp``
  renamed to ``<name>.ckpt``, then ``meta.json`` replaced from a tempfile), the checkpoint files
  are read-only to their owner (0400, folder 0750: a sidecar running as another user can read
  none of them); ``survey`` finds each checkpoint with the step epoch x 10^6 + step, both ranks'
  files and the meta.json each rank's restore writes;
- MindFormers saves killed at every point: the journal replayed (both ranks in step, and rank
  after rank), each file also cut short: a checkpoint is never complete while a rank's file is
  missing, and while the trainer runs it is complete exactly when every rank's meta.json names it
  or a later one.

Each test prints its wall time, the fixture the savers' times.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.frameworks import stack_python
from tests.localenv import free_ports
from tests.trainer_layouts import Op, apply
from tests.trainer_layouts import deepspeed as deepspeed_layout
from tests.trainer_layouts import mindformers as mindformers_layout
from trainingrun.checkpoint import local
from trainingrun.checkpoint.layouts import Proof

SAVERS = Path(__file__).resolve().parents[1] / "layout_savers"
RUN_TIMEOUT_S = 300
QUIET = 10.0
T0 = 1_000_000.0  # replayed files get times from here on, 10 ms apart
TICK = 0.01

DS_STEPS = 3
DS_SAVE_DIR = "ds"


@dataclass(frozen=True)
class DsRun:
    stage: int
    bf16: bool = False
    ranks: int = 1


DS_RUNS = {
    "zero1": DsRun(stage=1),
    "zero2-bf16": DsRun(stage=2, bf16=True),
    "zero3": DsRun(stage=3),
    "stage0": DsRun(stage=0),
    "zero2-2ranks": DsRun(stage=2, ranks=2),
    "zero3-2ranks": DsRun(stage=3, ranks=2),
}

MF_RANKS = 2
MF_ARGS = ("--epochs", "2", "--steps-per-epoch", "4", "--every", "2", "--keep", "3")
MF_SAVES = [(1, 2), (1, 4), (2, 2), (2, 4)]  # (epoch, step in epoch) of every save
MF_KEPT = MF_SAVES[-3:]
MF_ROOT = "output/checkpoint"  # relative to the checkpoint folder (the saver's OUT is output/)


@dataclass
class Saver:
    """One saver process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float


@dataclass(frozen=True)
class Saved:
    deepspeed: dict[str, Path]  # run name -> its checkpoint folder (the save folder is ds/)
    mindformers: Path  # the checkpoint folder of both ranks


def _start(name: str, argv: list[str], folder: Path, cwd: Path, **env: str) -> Saver:
    log = folder.parent / f"{name}.log"
    cwd.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Saver(name, proc, log, time.monotonic())


def _wait(savers: list[Saver]) -> None:
    """Until every saver exited 0 (printing when each did), each within RUN_TIMEOUT_S."""
    running = list(savers)
    while running:
        for s in list(running):
            code = s.proc.poll()
            if code is None:
                if time.monotonic() - s.started > RUN_TIMEOUT_S:
                    pytest.fail(f"{s.name} saver took over {RUN_TIMEOUT_S}s: {s.log}")
                continue
            running.remove(s)
            tail = s.log.read_text(errors="replace")[-3000:]
            assert code == 0, f"{s.name} saver exited {code}:\n{tail}"
            print(f"\n  {s.name}: saved in {time.monotonic() - s.started:.1f}s", end="")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saved]:
    """Every saver started at once, waited for (each within RUN_TIMEOUT_S)."""
    started = time.monotonic()
    lightning, mindformers = stack_python("lightning"), stack_python("mindformers")
    root = tmp_path_factory.mktemp("real-layouts")
    ports = iter(free_ports(sum(run.ranks == 1 for run in DS_RUNS.values())))
    savers = []
    for name, run in DS_RUNS.items():
        folder = root / name / "ck"
        args = [str(SAVERS / "deepspeed_save.py"), str(folder / DS_SAVE_DIR)]
        args += ["--stage", str(run.stage), "--steps", str(DS_STEPS)]
        args += ["--journal", str(root / name / "journal.jsonl")] + (["--bf16"] if run.bf16 else [])
        if run.ranks == 1:
            argv = [str(lightning), *args]
            env = {"MASTER_PORT": str(next(ports))}
        else:
            launch = ["-m", "torch.distributed.run", "--standalone"]
            argv = [str(lightning), *launch, "--nproc_per_node", str(run.ranks), *args]
            env = {}
        savers.append(_start(name, argv, folder, root / name, DS_ACCELERATOR="cpu", **env))
    mf_folder = root / "mindformers" / "ck"
    for rank in range(MF_RANKS):
        journal = root / "mindformers" / f"journal-{rank}.jsonl"
        args = [str(SAVERS / "mindformers_save.py"), str(mf_folder / "output"), *MF_ARGS]
        argv = [str(mindformers), *args, "--journal", str(journal)]
        # MindFormers logs into ./output/log: a working folder apart from the checkpoints.
        cwd = root / "mindformers" / f"work-{rank}"
        savers.append(_start(f"mindformers-rank{rank}", argv, mf_folder, cwd, RANK_ID=str(rank)))
    try:
        _wait(savers)
    finally:
        for s in savers:
            if s.proc.poll() is None:  # torchrun's workers too: each saver leads its group
                os.killpg(s.proc.pid, signal.SIGKILL)
                s.proc.wait(timeout=30)
    print(f"\n  every saver done in {time.monotonic() - started:.1f}s")
    yield Saved({name: root / name / "ck" for name in DS_RUNS}, mf_folder)


@pytest.fixture(autouse=True)
def _timed(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"\n{request.node.name}: {time.monotonic() - started:.2f}s")


def _files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


# -- DeepSpeed ----------------------------------------------------------------------------------


def _ds_layout(run: DsRun, step: int) -> dict[str, bytes]:
    """What tests/trainer_layouts.py writes for a save of this run, by path."""
    save = deepspeed_layout(step, run.stage, run.bf16, run.ranks, DS_SAVE_DIR)
    return {path: arg for op, path, arg in save.ops if op == "write" and isinstance(arg, bytes)}


def _ds_rank0(path: str) -> bool:
    """A file global rank 0 writes: its model states and shard, the scripts, ``latest``."""
    name = path.rsplit("/", 1)[-1]
    return "/global_step" not in path or name.startswith("mp_rank_") or "zero_pp_rank_0_" in name


@dataclass(frozen=True)
class Write:
    ns: int
    path: str
    data: bytes
    save: int  # the step of the save that wrote it


def _ds_writes(folder: Path, journal: Path) -> list[Write]:
    """Every write of the run, oldest first: the tag files by their own times (never rewritten),
    and at each save, the top-level files the journal recorded (``latest`` naming the tag; the
    recovery scripts, the same bytes each time)."""
    writes = []
    for path, p in _files(folder).items():
        if m := re.search(r"/global_step(\d+)/", path):
            writes.append(Write(p.stat().st_mtime_ns, path, p.read_bytes(), int(m.group(1))))
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        step = int(entry.pop("tag").removeprefix("global_step"))
        for name, ns in entry.items():
            path = f"{DS_SAVE_DIR}/{name}"
            blob = (
                f"global_step{step}".encode() if name == "latest" else (folder / path).read_bytes()
            )
            writes.append(Write(ns, path, blob, step))
    return sorted(writes, key=lambda w: (w.ns, _ds_order(w.path)))


def _ds_order(path: str) -> int:
    """Rank 0's order within a save (model states, shard, scripts, ``latest``), then the other
    ranks' files: on equal times, the worst case for the rule, ``latest`` before them."""
    if not _ds_rank0(path):
        return 4
    if path.endswith("/latest"):
        return 3
    if path.endswith(".py"):
        return 2
    return 1 if path.endswith("_optim_states.pt") else 0


@pytest.mark.parametrize("name", list(DS_RUNS))
def test_deepspeed_saves_are_found(saved: Saved, name: str) -> None:
    run, folder = DS_RUNS[name], saved.deepspeed[name]
    real = _files(folder)
    expected: dict[str, bytes] = {}
    for step in range(1, DS_STEPS + 1):
        expected |= _ds_layout(run, step)
    assert set(real) == set(expected)
    assert real[f"{DS_SAVE_DIR}/latest"].read_text() == f"global_step{DS_STEPS}"  # no newline
    # Rank 0 writes its files of each save in the fixture's order.
    writes = _ds_writes(folder, folder.parent / "journal.jsonl")
    for step in range(1, DS_STEPS + 1):
        order = [w.path for w in writes if w.save == step and _ds_rank0(w.path)]
        assert order == [p for p in _ds_layout(run, step) if _ds_rank0(p)]

    newest_mtime = max(p.stat().st_mtime for p in real.values())
    for fmt in ("auto", "deepspeed"):
        found = local.survey(folder, fmt)
        assert found.formats == ("deepspeed",)
        assert found.unrecognised == ()
        assert [c.step for c in found.checkpoints] == list(range(1, DS_STEPS + 1))
        for c in found.checkpoints:
            tag = f"global_step{c.step}"
            assert c.found.format == "deepspeed"
            assert (c.found.base, c.found.resume) == (DS_SAVE_DIR, DS_SAVE_DIR)
            assert c.found.extras == (("latest", tag),)
            assert {f"{DS_SAVE_DIR}/{rel}" for rel, _ in c.files} == {
                p for p in real if p.startswith(f"{DS_SAVE_DIR}/{tag}/")
            }
        *older, newest = found.checkpoints
        assert all(c.marked for c in older)
        assert newest.found.proof is Proof.SETTLED
        assert not newest.complete(newest_mtime + 1, QUIET, trainer_gone=True)
        assert newest.complete(newest_mtime + QUIET + 1, QUIET, trainer_gone=False)


@pytest.mark.parametrize("name", list(DS_RUNS))
def test_deepspeed_save_killed_at_any_point(saved: Saved, name: str, tmp_path: Path) -> None:
    run, real = DS_RUNS[name], saved.deepspeed[name]
    writes = _ds_writes(real, real.parent / "journal.jsonl")
    final = {p: f.read_bytes() for p, f in _files(real).items()}
    replay = tmp_path / "ck"
    checked = {"newest": 0, "quiet-whole": 0, "quiet-not-whole": 0}
    for i, w in enumerate(writes):
        at = T0 + i * TICK
        for cut in (True, False):
            blob = w.data[: len(w.data) // 2] if cut else w.data
            apply(replay, [("write", w.path, blob)], mtime=at)
            found = local.survey(replay)
            assert found.formats == ("deepspeed",)
            assert found.unrecognised == ()
            *older, newest = found.checkpoints
            state = f"after write {i} ({w.path}{', cut short' if cut else ''})"
            assert all(c.marked for c in older), state
            assert not newest.complete(at + 0.001, QUIET, trainer_gone=True), state
            checked["newest"] += 1
            if cut or (run.ranks > 1 and not older):
                continue
            prefix = f"{DS_SAVE_DIR}/global_step{newest.step}/"
            tag_files = {p: b for p, b in final.items() if p.startswith(prefix)}
            on_disk = _files(replay)
            whole = all(p in on_disk and on_disk[p].read_bytes() == b for p, b in tag_files.items())
            latest = on_disk.get(f"{DS_SAVE_DIR}/latest")
            named = latest is not None and latest.read_text() == f"global_step{newest.step}"
            quiet = newest.complete(at + QUIET + 1, QUIET, trainer_gone=True)
            assert quiet == (whole and named), state
            checked["quiet-whole" if whole and named else "quiet-not-whole"] += 1
    assert _files(replay).keys() == final.keys()
    assert min(checked.values()) > 0, checked
    print(f"\n  {len(writes)} writes replayed, states checked: {checked}", end="")


@pytest.mark.parametrize("name", [n for n, r in DS_RUNS.items() if r.ranks > 1])
def test_deepspeed_tag_without_a_rank_shard_is_never_complete(
    saved: Saved, name: str, tmp_path: Path
) -> None:
    tag = f"{DS_SAVE_DIR}/global_step{DS_STEPS}"
    shard = f"{tag}/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    for damage in ("removed", "cut short"):
        folder = shutil.copytree(saved.deepspeed[name], tmp_path / damage.replace(" ", "-"))
        if damage == "removed":
            (folder / shard).unlink()
        else:
            blob = (folder / shard).read_bytes()
            (folder / shard).write_bytes(blob[: len(blob) // 2])
        newest_mtime = max(p.stat().st_mtime for p in _files(folder).values())

        *older, newest = local.scan(folder, "deepspeed")

        assert newest.step == DS_STEPS
        assert all(c.marked for c in older)
        assert not newest.complete(newest_mtime + 1, QUIET, trainer_gone=True), damage
        if damage == "removed":  # fewer shards than the older tags: not even once quiet
            assert newest.found.proof is Proof.INCOMPLETE
            assert not newest.complete(newest_mtime + QUIET + 1, QUIET, trainer_gone=True)


# -- MindFormers --------------------------------------------------------------------------------


def _journal(folder: Path, rank: int) -> list[dict[str, Any]]:
    path = folder.parent / f"journal-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _shape(op: str, path: str, to: str | None = None) -> tuple[str, ...]:
    """An operation with the tempfile's random name made neutral."""
    names = [re.sub(r"/tmp[a-z0-9_]{6,}$", "/tmpXXXXXXXX", p) for p in (path, to) if p]
    return (op, *names)


def test_mindformers_saves_are_found(saved: Saved) -> None:
    folder = saved.mindformers
    for rank in range(MF_RANKS):
        # The library's own operations, less chmod and the rotation of the oldest file, are
        # those tests/trainer_layouts.py lays out for each save of the rank.
        real = [
            _shape("write" if e["op"] == "create" else e["op"], e["path"], e.get("to"))
            for e in _journal(folder, rank)
            if e["op"] in ("create", "rename")
        ]
        laid_out = [
            _shape(op, path.removeprefix("output/"), arg.removeprefix("output/"))
            if isinstance(arg, str)
            else _shape(op, path.removeprefix("output/"))
            for epoch, step in MF_SAVES
            for op, path, arg in mindformers_layout(step, epoch, MF_RANKS).ops
            if f"/rank_{rank}/" in path
        ]
        assert real == laid_out
        removed = [e["path"] for e in _journal(folder, rank) if e["op"] == "remove"]
        assert removed == [f"checkpoint/rank_{rank}/llama_rank_{rank}-1_2.ckpt"]
        rank_dir = folder / MF_ROOT / f"rank_{rank}"
        assert rank_dir.stat().st_mode & 0o777 == 0o750
        assert (rank_dir / "meta.json").stat().st_mode & 0o777 == 0o640
        assert {p.stat().st_mode & 0o777 for p in rank_dir.glob("*.ckpt")} == {0o400}

    for fmt in ("auto", "mindformers"):
        found = local.survey(folder, fmt)
        assert found.formats == ("mindformers",)
        assert found.unrecognised == ()
        assert [c.step for c in found.checkpoints] == [e * 1_000_000 + s for e, s in MF_KEPT]
        for c, (epoch, step) in zip(found.checkpoints, MF_KEPT, strict=True):
            assert c.marked  # every rank's meta.json names (2, 4), the newest
            assert (c.found.base, c.found.resume) == (MF_ROOT, MF_ROOT)
            names = [f"rank_{r}/llama_rank_{r}-{epoch}_{step}.ckpt" for r in range(MF_RANKS)]
            assert [rel for rel, _ in c.files] == names
        newest = found.checkpoints[-1]
        # The meta.json the restore writes is byte for byte the one MindFormers wrote.
        for rel, text in newest.found.extras:
            assert (folder / MF_ROOT / rel).read_text() == text


def _mf_ops(folder: Path, rank: int) -> list[list[Op]]:
    """The rank's journal as replayable operations, one list per save: each file written whole
    with the bytes it was renamed with, then the renames, chmods and removals."""
    entries = _journal(folder, rank)
    renamed = {e["path"]: base64.b64decode(e["data"]) for e in entries if e["op"] == "rename"}
    saves: list[list[Op]] = [[]]
    for e in entries:
        path = f"output/{e['path']}"
        if e["op"] == "mkdir":
            saves[-1].append(("mkdir", path, None))
        elif e["op"] == "create":
            saves[-1].append(("write", path, renamed[e["path"]]))
        elif e["op"] == "rename":
            saves[-1].append(("rename", path, f"output/{e['to']}"))
        elif e["op"] == "remove":
            saves[-1].append(("remove", path, None))
        elif e["op"] == "chmod":
            saves[-1].append(("chmod", path, e["mode"]))
            if e["path"].endswith("/meta.json"):  # a save's last operation
                saves.append([])
    return [s for s in saves if s]


def _in_step(a: list[Op], b: list[Op]) -> list[Op]:
    """The two ranks' operations alternating (one may have a folder to create the other has)."""
    return [op for pair in zip_longest(a, b) for op in pair if op is not None]


def _split_dirs(ops: list[Op]) -> tuple[list[Op], list[Op]]:
    """The operations before the first file is written (folders made and chmodded), and the
    rest."""
    first = next(i for i, (op, _, _) in enumerate(ops) if op == "write")
    return ops[:first], ops[first:]


def _mf_truth(folder: Path, epoch: int, step: int) -> tuple[bool, bool]:
    """(every rank's file is there, and every rank's meta.json names it or a later one)."""
    whole, named = True, True
    for r in range(MF_RANKS):
        rank_dir = folder / MF_ROOT / f"rank_{r}"
        whole = whole and (rank_dir / f"llama_rank_{r}-{epoch}_{step}.ckpt").is_file()
        meta = rank_dir / "meta.json"
        last = json.loads(meta.read_text()) if meta.is_file() else None
        named = (
            named and last is not None and (last["last_epoch"], last["last_step"]) >= (epoch, step)
        )
    return whole, whole and named


@pytest.mark.parametrize("order", ["ranks-in-step", "rank-after-rank"])
def test_mindformers_save_killed_at_any_point(saved: Saved, order: str, tmp_path: Path) -> None:
    r0, r1 = (_mf_ops(saved.mindformers, r) for r in range(MF_RANKS))
    assert len(r0) == len(r1) == len(MF_SAVES)
    # The first save with both ranks' folders made first, then in step: until a rank has a
    # file in its folder, nothing says it will write one (the rule's limit). After it, rank 1
    # may be a whole save behind rank 0.
    (dirs0, first0), (dirs1, first1) = _split_dirs(r0[0]), _split_dirs(r1[0])
    ops = [*dirs0, *dirs1, *_in_step(first0, first1)]
    for a, b in zip(r0[1:], r1[1:], strict=True):
        ops += _in_step(a, b) if order == "ranks-in-step" else [*a, *b]
    replay = tmp_path / "ck"
    checked = {"named": 0, "whole-not-named": 0, "not-whole": 0}
    for i, (op, path, arg) in enumerate(ops):
        at = T0 + i * TICK
        cuts: tuple[bool, ...] = (True, False) if op == "write" else (False,)
        for cut in cuts:
            done = arg[: len(arg) // 2] if cut and isinstance(arg, bytes) else arg
            apply(replay, [(op, path, done)], mtime=at)
            found = local.survey(replay)
            assert found.unrecognised == ()
            for c in found.checkpoints:
                epoch, step = divmod(c.step, 1_000_000)
                whole, named = _mf_truth(replay, epoch, step)
                state = f"after op {i} {op} {path}{' cut short' if cut else ''}: {c.step}"
                assert c.complete(at + 0.001, QUIET, trainer_gone=False) == named, state
                assert whole or not c.complete(at + 0.001, QUIET, trainer_gone=True), state
                checked["named" if named else "whole-not-named" if whole else "not-whole"] += 1
    assert _files(replay).keys() == _files(saved.mindformers).keys()
    assert min(checked.values()) > 0, checked
    print(f"\n  {len(ops)} operations replayed, checkpoints checked: {checked}", end="")
