"""What every layout rule works on and returns: a snapshot of the local checkpoint folder
(``FileInfo``, one per file or symlink, paths relative to the folder) and the checkpoints found
in it (``Found``). Pure: no file system access here; ``trainingrun.checkpoint.local`` takes the
snapshot.
"""

from __future__ import annotations

import enum
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Ours, written beside or inside a checkpoint by the trainer integrations and the restore: never
# uploaded, never a format's file. ``<folder>/.trainingrun-complete`` marks a folder complete;
# ``<file>.trainingrun-complete`` a single-file checkpoint.
COMPLETE_MARKER = ".trainingrun-complete"
CONTROL_DIR = ".trainingrun"
# torch.distributed.checkpoint's metadata file, written last (the frameworks built on it too).
DCP_METADATA = ".metadata"
# Where the restore stages a checkpoint before moving it into place.
STAGING_PREFIX = ".restore-"


class Proof(enum.Enum):
    """How sure a rule is that a checkpoint is whole."""

    COMPLETE = "complete"  # the framework's own marker says so (or ours)
    INCOMPLETE = "incomplete"  # still being written, or a save that was killed half-way
    # No marker: whole once nothing changed for the quiet period, or once the trainer exited
    # (the file the framework writes last is there, so a killed save cannot look whole).
    QUIET = "quiet"
    # No marker, and a save killed half-way can look whole: only the quiet period proves it,
    # also after the trainer exited.
    SETTLED = "settled"


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the checkpoint folder, '/'-separated
    size: int
    mtime: float
    link: str | None = None  # a symlink's target as stored; None for a regular file


@dataclass(frozen=True)
class Found:
    """One checkpoint: ``files`` are relative to ``base`` (a folder relative to the checkpoint
    folder, "" for the folder itself) and are what is uploaded; ``resume`` (relative to the
    checkpoint folder) is what the trainer's resume argument takes; ``extras`` are small files
    the restore writes beside it (relative to ``base``), such as a framework's pointer to its
    newest checkpoint, which the trainer rewrites each save and so is never uploaded."""

    format: str
    step: int
    base: str
    files: tuple[str, ...]
    resume: str
    proof: Proof
    newest_mtime: float
    extras: tuple[tuple[str, str], ...] = ()
    name: str = ""  # how logs name it (the folder or file the framework wrote)

    def complete(self, now: float, quiet_seconds: float, trainer_gone: bool) -> bool:
        """Proved whole, or (no marker in this layout) nothing changed for the quiet period or
        the trainer has exited, so nothing will change any more."""
        if self.proof is Proof.COMPLETE:
            return True
        if self.proof is Proof.INCOMPLETE:
            return False
        quiet = now - self.newest_mtime >= quiet_seconds
        return quiet or (trainer_gone and self.proof is Proof.QUIET)


@dataclass(frozen=True)
class RuleResult:
    """What one rule made of a snapshot: the checkpoints, and every path it claims as its
    format's (checkpoint files, pointers, temporaries, helper scripts)."""

    found: tuple[Found, ...] = ()
    claimed: frozenset[str] = field(default_factory=frozenset)


def is_control(path: str) -> bool:
    return path.split("/", 1)[0] == CONTROL_DIR


def is_ours(path: str) -> bool:
    """The control folder and our markers: never a checkpoint file, never unrecognised."""
    return is_control(path) or path.endswith(COMPLETE_MARKER)


def is_staging(path: str) -> bool:
    return path.split("/", 1)[0].startswith(STAGING_PREFIX)


def marker_for(path: str, is_folder: bool) -> str:
    """Our completion marker of a checkpoint folder or file (relative paths)."""
    return posixpath.join(path, COMPLETE_MARKER) if is_folder else path + COMPLETE_MARKER


def parent(path: str) -> str:
    return posixpath.dirname(path)


def name(path: str) -> str:
    return posixpath.basename(path)


def under(path: str, folder: str) -> bool:
    return path.startswith(folder + "/")


def relative(path: str, base: str) -> str:
    return path[len(base) + 1 :] if base else path


def folders(paths: Iterable[str]) -> set[str]:
    """Every folder that holds one of ``paths`` (at any depth)."""
    out: set[str] = set()
    for p in paths:
        d = parent(p)
        while d and d not in out:
            out.add(d)
            d = parent(d)
    return out


def files_under(snapshot: Sequence[FileInfo], folder: str) -> list[FileInfo]:
    return [f for f in snapshot if under(f.path, folder)]


def last_number(text: str) -> int | None:
    numbers = re.findall(r"\d+", text)
    return int(numbers[-1]) if numbers else None


Snapshot = Sequence[FileInfo]


def has(snapshot: Snapshot, path: str) -> bool:
    return any(f.path == path for f in snapshot)


def proof_of(whole: bool) -> Proof:
    """For a layout whose marker proves a checkpoint whole: without it, it is not."""
    return Proof.COMPLETE if whole else Proof.INCOMPLETE


def folder_checkpoint(
    fmt: str,
    inside: Sequence[FileInfo],
    folder: str,
    step: int,
    proof: Proof,
    resume: str | None = None,
) -> Found:
    """A checkpoint that is one folder, from ``inside`` (its files: ``files_under(snapshot,
    folder)``, which the rule also claims): its files relative to it, resumed from the folder
    (unless ``resume`` says otherwise). Our marker inside proves it complete."""
    if has(inside, marker_for(folder, True)):
        proof = Proof.COMPLETE
    data = [f for f in inside if f.link is None and not is_ours(f.path)]
    return Found(
        format=fmt,
        step=step,
        base=folder,
        files=tuple(sorted(relative(f.path, folder) for f in data)),
        resume=folder if resume is None else resume,
        proof=proof,
        newest_mtime=max((f.mtime for f in inside), default=0.0),
        name=folder,
    )


def file_checkpoint(fmt: str, snapshot: Sequence[FileInfo], f: FileInfo, step: int) -> Found:
    """A checkpoint that is one file, resumed from that file; complete by our marker beside it,
    else once quiet (a file written in place can be cut short by a kill)."""
    marked = has(snapshot, marker_for(f.path, False))
    return Found(
        format=fmt,
        step=step,
        base=parent(f.path),
        files=(name(f.path),),
        resume=f.path,
        proof=Proof.COMPLETE if marked else Proof.SETTLED,
        newest_mtime=f.mtime,
        name=f.path,
    )


def claim_folder(inside: Sequence[FileInfo]) -> set[str]:
    """What a rule claims for a checkpoint folder: every file under it (``inside``, from
    ``files_under``)."""
    return {f.path for f in inside}


def text(contents: dict[str, str], path: str) -> str | None:
    """A pointer file's text, stripped; None when the snapshot has none."""
    value = contents.get(path)
    return value.strip() if value is not None else None
