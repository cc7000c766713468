"""The local checkpoint folder: the conventions the trainer integration, the sync sidecar and the
restore share, and the survey that finds its checkpoints (``survey``/``scan``: a snapshot of the
folder read by the layout rules of ``trainingrun.checkpoint.layouts``, each checkpoint with its
files and
whether it is complete, ``LocalCheckpoint``). Names and file helpers only, no storage client.

Layout of ``TRAININGRUN_CHECKPOINT_DIR`` (an ``emptyDir`` shared by the three containers)::

    <the trainer's checkpoints>        as its framework writes them, e.g. checkpoint-<step>/
                                       (HF Trainer), epoch=0-step=50.ckpt (Lightning),
                                       global_step50/ and latest (DeepSpeed)
    <folder>/.trainingrun-complete     written last by a trainer integration: the folder is
    <file>.trainingrun-complete        (or the file) complete; never uploaded
    .trainingrun/save-now              written by the sidecar on a preemption notice or SIGTERM;
                                       the callback saves at the next step end and stops
    .trainingrun/progress.json         written by the callback: {"step": .., "max_steps": ..,
                                       "samples_per_second": .., "tokens_per_second": ..}
    .trainingrun/restored              written last by the restore: its exit code and message,
                                       which a trainer started beside it waits for

A trainer without an integration still gets sync: each layout says when a checkpoint is whole
(the framework's own marker, or no change for a quiet period).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from trainingrun.checkpoint import layouts

log = logging.getLogger("trainingrun")

COMPLETE_MARKER = layouts.COMPLETE_MARKER
CONTROL_DIR = layouts.CONTROL_DIR
SAVE_NOW = "save-now"
PROGRESS = "progress.json"
RESTORED = "restored"
# Written last by the HuggingFace Trainer's save; its presence plus quiet means complete.
TRAINER_STATE = layouts.TRAINER_STATE


def is_control(relative_path: str) -> bool:
    """Paths (relative to the checkpoint folder) of the control files the trainer and the sidecar
    exchange (progress, save-now): written every step, never part of a checkpoint."""
    return layouts.is_control(Path(relative_path).as_posix())


def mark_complete(path: Path) -> None:
    """Marks a checkpoint complete (a folder, or a single-file checkpoint); called after every
    file of it is written."""
    if path.is_dir():
        (path / COMPLETE_MARKER).write_text("")
    else:
        path.with_name(path.name + COMPLETE_MARKER).write_text("")


def control_path(checkpoint_dir: Path, name: str) -> Path:
    return checkpoint_dir / CONTROL_DIR / name


# The pod's containers may run as different users (the agent image as 65532, a trainer image
# often as root): what one writes into the shared checkpoint volume, the others must be able to
# write next to, replace and delete. The volume is the pod's own emptyDir.
SHARED_DIR_MODE = 0o777
SHARED_FILE_MODE = 0o666


def prepare_control_dir(checkpoint_dir: Path) -> Path:
    """Creates the control folder writable by every container of the pod; the sidecar does this
    at its start, before the trainer runs."""
    path = checkpoint_dir / CONTROL_DIR
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != SHARED_DIR_MODE:
        path.chmod(SHARED_DIR_MODE)
    return path


def share(folder: Path) -> None:
    """Makes a folder tree written by one container writable by the others (the trainer rotates
    a restored checkpoint away like its own)."""
    for root, dirs, files in os.walk(folder):
        Path(root).chmod(SHARED_DIR_MODE)
        for name in dirs:
            (Path(root) / name).chmod(SHARED_DIR_MODE)
        for name in files:
            (Path(root) / name).chmod(SHARED_FILE_MODE)


def request_save(checkpoint_dir: Path, reason: str) -> None:
    """Asks the trainer integration to save at the next step end and stop."""
    path = control_path(checkpoint_dir, SAVE_NOW)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason + "\n")


def save_requested(checkpoint_dir: Path) -> str | None:
    """The reason a save was requested, or None."""
    try:
        return control_path(checkpoint_dir, SAVE_NOW).read_text().strip() or "requested"
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Progress:
    """The trainer's step, its total when its framework knows it, its throughput when it
    measures one (samples or tokens per second), and the seconds it spent blocked in saves
    since its process began, when its integration times them."""

    step: int
    max_steps: int | None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    save_seconds: float | None = None
    # When the file was written (its mtime), as read back: when the trainer reached the step.
    # Not part of the value: two reads of the same progress are equal.
    written_at: float | None = field(default=None, compare=False)


# The callback writes ~100 bytes; the sidecar reads no more than this of the file.
PROGRESS_MAX_BYTES = 4096


def write_progress(checkpoint_dir: Path, progress: Progress) -> None:
    """Atomically replaces the progress file (a reader never sees half of it)."""
    fields = {
        "step": progress.step,
        "max_steps": progress.max_steps,
        "samples_per_second": progress.samples_per_second,
        "tokens_per_second": progress.tokens_per_second,
        "save_seconds": progress.save_seconds,
    }
    text = json.dumps({k: v for k, v in fields.items() if v is not None or k == "max_steps"})
    _replace_control_file(checkpoint_dir, PROGRESS, text)


def _replace_control_file(
    checkpoint_dir: Path, name: str, text: str, mode: int | None = None
) -> None:
    """Writes control file ``name`` beside it (with ``mode`` when given) and renames it into
    place: a reader sees the old file or the new one, never half of one."""
    path = control_path(checkpoint_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def read_progress(checkpoint_dir: Path) -> Progress | None:
    """The trainer's progress file; None when it is missing, over PROGRESS_MAX_BYTES (not read
    further) or not one. Its figures are checked where they are published
    (``trainingrun.checkpoint.progress``)."""
    try:
        with control_path(checkpoint_dir, PROGRESS).open("rb") as f:
            data = f.read(PROGRESS_MAX_BYTES + 1)
            written_at = os.fstat(f.fileno()).st_mtime
        if len(data) > PROGRESS_MAX_BYTES:
            return None
        raw = json.loads(data)
        total = raw.get("max_steps")
        return Progress(
            int(raw["step"]),
            None if total is None else int(total),
            _number(raw.get("samples_per_second")),
            _number(raw.get("tokens_per_second")),
            _number(raw.get("save_seconds")),
            written_at,
        )
    # Written by the trainer's side, so anything may be there: a missing file, a half-written
    # one, Infinity (OverflowError), deep nesting (RecursionError), a list (AttributeError).
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        OverflowError,
        RecursionError,
        AttributeError,
    ):
        return None


def _number(value: object) -> float | None:
    """A rate the trainer wrote, if it is a number at all."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class Restored:
    """How the restore ended: its exit code (0: the checkpoint is verified in place) and what it
    said."""

    exit_code: int
    message: str


def write_restored(checkpoint_dir: Path, outcome: Restored) -> None:
    """Atomically writes the restore's outcome, readable and replaceable by every container."""
    text = json.dumps({"exit_code": outcome.exit_code, "message": outcome.message})
    _replace_control_file(checkpoint_dir, RESTORED, text, SHARED_FILE_MODE)


def read_restored(checkpoint_dir: Path) -> Restored | None:
    """The restore's outcome, or None while it runs."""
    try:
        raw = json.loads(control_path(checkpoint_dir, RESTORED).read_text())
        return Restored(int(raw["exit_code"]), str(raw["message"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
        return Restored(-1, f"unreadable outcome file {RESTORED}: {e}")


# ---------------------------------------------------------------------------------------------
# Finding checkpoints


@dataclass(frozen=True)
class LocalCheckpoint:
    """A checkpoint found in the folder: what the layout rule said (``found``), with the files
    to upload as (path relative to ``path``, size)."""

    found: layouts.Found
    path: Path  # the folder the files are relative to (checkpoint_dir / found.base)
    files: tuple[tuple[str, int], ...]

    @property
    def step(self) -> int:
        return self.found.step

    @property
    def marked(self) -> bool:
        """Proved whole by a marker (the trainer integration's, or the framework's own)."""
        return self.found.proof is layouts.Proof.COMPLETE

    def complete(self, now: float, quiet_seconds: float, trainer_gone: bool) -> bool:
        return self.found.complete(now, quiet_seconds, trainer_gone)


def snapshot(
    checkpoint_dir: Path, unreadable: list[str] | None = None
) -> tuple[list[layouts.FileInfo], dict[str, str]]:
    """Every file and symlink under the folder (relative paths, sizes, times, link targets), and
    the text of the small pointer files the layout rules read. Files vanishing mid-walk (the
    trainer rotating its own checkpoints) just drop out; folders that cannot be listed
    (permissions: a trainer running as another user that makes its folders private) are added
    to ``unreadable``, relative to the folder."""
    infos: list[layouts.FileInfo] = []
    contents: dict[str, str] = {}

    def refused(error: OSError) -> None:
        if isinstance(error, PermissionError) and unreadable is not None and error.filename:
            unreadable.append(Path(error.filename).relative_to(checkpoint_dir).as_posix())

    for dirpath, dirs, names in os.walk(checkpoint_dir, onerror=refused):
        root = Path(dirpath)
        rel_root = root.relative_to(checkpoint_dir).as_posix()
        if rel_root == CONTROL_DIR:
            dirs.clear()
            continue
        # ``dirs`` also lists symlinks to folders: taken as files (never followed); the real
        # folders among them are walked by os.walk itself.
        for name in [*names, *dirs]:
            full = root / name
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            try:
                st = full.lstat()
                is_link = stat.S_ISLNK(st.st_mode)
                link = os.readlink(full) if is_link else None
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not is_link and not stat.S_ISREG(st.st_mode):
                continue  # folders (walked), sockets, fifos: never checkpoint data
            infos.append(layouts.FileInfo(rel, st.st_size, st.st_mtime, link))
            small = st.st_size <= layouts.POINTER_MAX_BYTES
            if link is None and name in layouts.POINTER_FILES and small:
                try:
                    contents[rel] = full.read_text(errors="replace")
                except OSError:
                    continue
    return infos, contents


@dataclass(frozen=True)
class Survey:
    checkpoints: list[LocalCheckpoint]  # oldest step first
    formats: tuple[str, ...]
    unrecognised: tuple[str, ...]
    unreadable: tuple[str, ...] = ()  # folders the sidecar may not list


def survey(
    checkpoint_dir: Path, fmt: str = layouts.AUTO, pattern: layouts.Pattern | None = None
) -> Survey:
    """The checkpoints in the folder by the layout ``fmt`` (``auto``: any known one), which
    formats were recognised, and the files no layout claims."""
    if not checkpoint_dir.is_dir():
        return Survey([], (), ())
    unreadable: list[str] = []
    infos, contents = snapshot(checkpoint_dir, unreadable)
    sizes = {i.path: i.size for i in infos}
    result = layouts.find(infos, contents, fmt, pattern)
    found = []
    for c in result.checkpoints:
        prefix = f"{c.base}/" if c.base else ""
        files = tuple((rel, sizes[prefix + rel]) for rel in c.files)
        found.append(LocalCheckpoint(c, checkpoint_dir / c.base, files))
    return Survey(found, result.formats, result.unrecognised, tuple(sorted(unreadable)))


def scan(
    checkpoint_dir: Path, fmt: str = layouts.AUTO, pattern: layouts.Pattern | None = None
) -> list[LocalCheckpoint]:
    """The checkpoints in the folder, oldest step first."""
    return survey(checkpoint_dir, fmt, pattern).checkpoints


def write_termination_message(path: Path | None, message: str) -> None:
    """The container's termination message (its ``terminationMessagePath``), which the kubelet
    puts in the container's status for the operator to read; the restore's and the sidecar's."""
    if path is None:
        return
    try:
        path.write_text(message[:4000])  # the kubelet keeps at most 4096 bytes
    except OSError as e:
        log.warning("could not write the termination message to %s: %s", path, e)


# A file's creation takes its folder's lock in the kernel, and ext4's search for a free inode
# runs under it. Threads creating files in one folder at once wait for that lock spinning, a CPU
# each: restoring 1,000 small files, 28% of the samples were that spin (perf). Taken here first,
# one lock per folder as the kernel's, the same wait sleeps: 37% less system time for 3% less
# throughput (0.1 GiB in 1,000 files, 16 rounds side by side, docs/benchmarks.md).
_FOLDER_LOCKS: dict[str, threading.Lock] = {}
_FOLDER_LOCKS_LOCK = threading.Lock()


def create_for_writing(path: str) -> int:
    """Opens ``path`` for writing, created or emptied, one creation at a time in its folder."""
    folder = os.path.dirname(path)
    with _FOLDER_LOCKS_LOCK:
        lock = _FOLDER_LOCKS.setdefault(folder, threading.Lock())
    with lock:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


# Blocks are written to the file at most 128 KiB at a time. On the test machine, writes of 1 MiB
# and more cost 0.8-2.5 s of system time per GiB against 0.2 s for writes of 32-768 KiB (the
# kernel's page cache takes larger pages for them, and pages not yet backed by the host's memory
# cost a fault there; tests/bench_writes.py); in the transfer benchmark's rounds 512 KiB writes
# still fell to 611-858 MiB/s in some rounds where 128 KiB held 898-1066, level with s5cmd (which
# writes 32 KiB at a time) (docs/benchmarks.md).
WRITE_BLOCK = 128 << 10


def write_at(fd: int, block: bytes | memoryview, offset: int) -> None:
    """Writes all of ``block`` at ``offset``, ``WRITE_BLOCK`` at a time."""
    view = memoryview(block)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + WRITE_BLOCK], offset + done)
