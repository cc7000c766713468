"""The local checkpoint folder: the conventions the trainer integration, the sync sidecar and the
restore share, and the scan that finds its checkpoints (``scan``: every ``checkpoint-<step>/``
with its files and whether it is complete, ``LocalCheckpoint``). Names and file helpers only, no
storage client.

Layout of ``TRAININGRUN_CHECKPOINT_DIR`` (an ``emptyDir`` shared by the three containers)::

    checkpoint-<step>/                 one checkpoint, as the trainer writes it
    checkpoint-<step>/.trainingrun-complete
                                       written last by the trainer integration: the folder is
                                       complete (never uploaded)
    .trainingrun/save-now              written by the sidecar on a preemption notice or SIGTERM;
                                       the callback saves at the next step end and stops
    .trainingrun/progress.json         written by the callback: {"step": .., "max_steps": ..}

A trainer without the integration still gets sync: a ``checkpoint-<step>/`` holding
``trainer_state.json`` whose files did not change for a quiet period counts as complete.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

COMPLETE_MARKER = ".trainingrun-complete"
CONTROL_DIR = ".trainingrun"
SAVE_NOW = "save-now"
PROGRESS = "progress.json"
# Written last by the HuggingFace Trainer's save; its presence plus quiet means complete.
TRAINER_STATE = "trainer_state.json"

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(name: str) -> int | None:
    """The step of a folder named ``checkpoint-<step>``, else None."""
    m = _CHECKPOINT_RE.match(name)
    return int(m.group(1)) if m else None


def is_control(relative_path: str) -> bool:
    """Paths (relative to the checkpoint folder) of the control files the trainer and the sidecar
    exchange (progress, save-now): written every step, never part of a checkpoint."""
    parts = Path(relative_path).parts
    return bool(parts) and parts[0] == CONTROL_DIR


def is_internal(relative_path: str) -> bool:
    """Files of ours inside a checkpoint folder that are never uploaded."""
    return Path(relative_path).name == COMPLETE_MARKER


def mark_complete(folder: Path) -> None:
    """Marks a checkpoint folder complete; called after every file of it is written."""
    (folder / COMPLETE_MARKER).write_text("")


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
    step: int
    max_steps: int | None


def write_progress(checkpoint_dir: Path, progress: Progress) -> None:
    """Atomically replaces the progress file (a reader never sees half of it)."""
    path = control_path(checkpoint_dir, PROGRESS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": progress.step, "max_steps": progress.max_steps}))
    os.replace(tmp, path)


def read_progress(checkpoint_dir: Path) -> Progress | None:
    try:
        raw = json.loads(control_path(checkpoint_dir, PROGRESS).read_text())
        return Progress(int(raw["step"]), raw.get("max_steps"))
    # Written by the trainer's side, so anything may be there: a missing file, a half-written
    # one, Infinity (OverflowError), deep nesting (RecursionError).
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None


# ---------------------------------------------------------------------------------------------
# Finding checkpoints


@dataclass(frozen=True)
class LocalCheckpoint:
    step: int
    path: Path
    marked: bool  # the trainer integration said it is complete
    has_state: bool  # trainer_state.json exists
    files: tuple[tuple[str, int], ...]  # (relative path, size), ours excluded
    newest_mtime: float

    def complete(self, now: float, quiet_seconds: float, trainer_gone: bool) -> bool:
        """Marked by the integration; else trainer_state.json and no change for the quiet
        period (or the trainer has exited, so nothing will change any more)."""
        if self.marked:
            return True
        return self.has_state and (trainer_gone or now - self.newest_mtime >= quiet_seconds)


def scan(checkpoint_dir: Path) -> list[LocalCheckpoint]:
    """Every ``checkpoint-<step>/`` folder, oldest step first. Files vanishing mid-scan (the
    trainer rotating its own checkpoints) just drop out."""
    found = []
    try:
        entries = list(os.scandir(checkpoint_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        step = checkpoint_step(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=False):
            continue
        files: list[tuple[str, int]] = []
        newest = 0.0
        marked = False
        root = Path(entry.path)
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                full = Path(dirpath, name)
                rel = full.relative_to(root).as_posix()
                try:
                    st = full.lstat()
                except FileNotFoundError:
                    continue
                newest = max(newest, st.st_mtime)
                if is_internal(rel):
                    marked = True
                    continue
                if not full.is_file() or full.is_symlink():
                    continue  # only regular files are checkpoint data
                files.append((rel, st.st_size))
        has_state = any(rel == TRAINER_STATE for rel, _ in files)
        found.append(LocalCheckpoint(step, root, marked, has_state, tuple(sorted(files)), newest))
    return sorted(found, key=lambda c: c.step)
