"""``trainingrun restore``: the init container that puts the chosen checkpoint on local disk.

Reads ``manifest.json``, the step's committed entry and the part record of each of its ranks,
and downloads every file the parts name (all ranks' files: the whole checkpoint) with parallel
ranged GETs into a staging folder, verifies each size and checksum as it lands, and only then
moves it where its layout goes: ``checkpoint-<step>/`` for the HF Trainer (marked complete, so
sync does not upload it again), else the entry's ``layout.base``, with the framework's pointer
files (``layout.extras``, but not one named like a checkpoint file) written beside it. Object
names that would escape the folder, or that one folder cannot hold together (a file ``a`` and a
file ``a/b``), are refused before anything is written; so is a checkpoint larger than the room
the folder has: its volume's free space and, under ``TRAININGRUN_SIZE_LIMIT``
(``spec.checkpoint.sizeLimit``), that limit less what the folder already holds.

Exit codes (documented in docs/, read by the operator):

- 0: restored and verified.
- 3 (``contract.EXIT_CHECKPOINT_BAD``): the checkpoint is not usable: not committed, its
  ``MANIFEST.json`` missing or malformed, an object missing, short, or with a wrong checksum, a
  name escaping the folder or clashing with another. The termination message names the
  checkpoint and the file; the operator marks the step bad and resubmits from the previous
  committed one.
- 4 (``contract.EXIT_INSUFFICIENT_DISK``): the checkpoint does not fit, found before the
  download or as the volume filled up (ENOSPC, EDQUOT) during it. The termination message names
  the step, the bytes needed and free, and the fix. Larger than ``spec.checkpoint.sizeLimit``
  less what the folder holds: the operator fails the run. Else the node's disk is short now
  (the message starts with ``NODE_DISK_FULL_MESSAGE``): the attempt failed and is retried.
- 1: anything else (endpoint unreachable, access denied, an unexpected error, named with its
  type in the termination message): the attempt failed and is retried.
- 2: the container's settings are wrong (missing environment).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from trainingrun.agent.download import Download
from trainingrun.agent.packs import Target
from trainingrun.agent.room import (
    DISK_FULL,
    NODE_FIX,
    InsufficientDisk,
    NodeDiskFull,
    byte_count,
    check_room,
)
from trainingrun.agent.transfer import Progress, TransferSettings, VerificationFailed
from trainingrun.checkpoint import local
from trainingrun.checkpoint.layouts import STAGING_PREFIX
from trainingrun.checkpoint.lookup import read_committed
from trainingrun.checkpoint.manifest import (
    RUN_MANIFEST,
    FileEntry,
    Layout,
    ManifestError,
    parse_run_manifest,
    safe_relative_path,
)
from trainingrun.contract import (
    EXIT_CHECKPOINT_BAD,
    EXIT_ERROR,
    EXIT_INSUFFICIENT_DISK,
    EXIT_OK,
    EXIT_STOPPED,
    checkpoint_dirname,
    format_bytes,
)
from trainingrun.decide.classify import NODE_DISK_FULL_MESSAGE
from trainingrun.storage import checksum
from trainingrun.storage.opener import Location, NotFound, StorageError, Store, log_text

log = logging.getLogger("trainingrun.agent.restore")


class CheckpointBad(Exception):
    """The chosen checkpoint cannot be trusted; the message names it and the file."""


@dataclass(frozen=True)
class RestoreSettings:
    checkpoint_dir: Path
    run: Location
    step: int
    transfer: TransferSettings = field(default_factory=TransferSettings)
    termination_log: Path = Path("/dev/termination-log")
    # spec.checkpoint.sizeLimit in bytes; None: only the volume's free space counts.
    size_limit: int | None = None
    # A trainer started beside the restore waits for its outcome (local.RESTORED).
    tell_trainer: bool = False


class Metrics:
    def __init__(self, registry: Any = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.bytes = Counter(
            "trainingrun_restore_downloaded_bytes", "Bytes downloaded.", registry=self.registry
        )
        self.failures = Counter(
            "trainingrun_restore_failures",
            "Failed restores, by reason.",
            ["reason"],
            registry=self.registry,
        )


def target_path(folder: Path, relative: str) -> Path:
    """Where a checkpoint file goes; refuses a name that would land outside ``folder``."""
    try:
        safe_relative_path(relative)
    except ManifestError as e:
        raise CheckpointBad(str(e)) from e
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise CheckpointBad(f"file name {relative!r} escapes the checkpoint folder")
    return path


def read_checkpoint(
    store: Store, s: RestoreSettings
) -> tuple[list[tuple[str, FileEntry]], Layout | None]:
    """(key relative to the run prefix, file) of every file of the step's committed entry, once
    manifest.json confirms the step is committed: only what that entry names is read; and the
    entry's layout (None: the HF Trainer's ``checkpoint-<step>/``)."""
    what = checkpoint_dirname(s.step)
    raw = store.get(s.run.key(RUN_MANIFEST))
    if raw is None:
        raise CheckpointBad(f"{what}: s3://{s.run.bucket}/{s.run.key(RUN_MANIFEST)} does not exist")
    try:
        manifest = parse_run_manifest(raw)
        entry = next((e for e in manifest.entries if e.step == s.step), None)
        if entry is None:
            raise CheckpointBad(f"{what} is not committed in {RUN_MANIFEST}")
        return read_committed(store, s.run, entry).files, entry.layout
    except ManifestError as e:
        raise CheckpointBad(f"{what}: {e}") from e


def check_names(what: str, paths: Iterable[str], layout: Layout | None) -> None:
    """Refuses a checkpoint whose files one folder cannot hold together: a name that is also
    the folder of another (``a`` and ``a/b``), among its files and its layout's extra files."""
    names = {*paths, *(layout.extras if layout else ())}
    for name in sorted(names):
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in names:
                raise CheckpointBad(
                    f"{what}: file name {folder!r} is also the folder of {name!r}; one folder "
                    "cannot hold both"
                )


def restore(store: Store, s: RestoreSettings, metrics: Metrics | None = None) -> Path:
    """Downloads and verifies checkpoint ``s.step`` and puts it where its layout goes; returns
    what the trainer resumes from."""
    metrics = metrics or Metrics()
    what = checkpoint_dirname(s.step)
    named, layout = read_checkpoint(store, s)
    check_names(what, (f.path for _, f in named), layout)
    final = s.checkpoint_dir / Layout.folder(layout, s.step)
    staging = s.checkpoint_dir / f"{STAGING_PREFIX}{what}"
    shutil.rmtree(staging, ignore_errors=True)
    s.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    total = sum(f.size for _, f in named)
    room = check_room(s.checkpoint_dir, s.size_limit, what, total)

    log.info("%s: downloading %d files, %s", what, len(named), format_bytes(total))
    started = time.monotonic()
    extras = extras_beside(what, layout, {f.path for _, f in named})
    try:
        download(store, s, named, staging, metrics)
        place(staging, final, layout, extras)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in DISK_FULL:  # it fit the limit: the node's
            raise NodeDiskFull(
                f"{what} needs {byte_count(total)}, and the checkpoint volume filled up during the "
                f"download ({e.strerror}) with {byte_count(room)} free before it: {NODE_FIX}"
            ) from e
        raise
    elapsed = time.monotonic() - started
    log.info(
        "%s restored and verified: %d files, %s in %.1f s (%s/s)",
        what,
        len(named),
        format_bytes(total),
        elapsed,
        format_bytes(total / max(elapsed, 1e-6)),
    )
    resume = s.checkpoint_dir / Layout.resume_path(layout, s.step)
    log.info("the trainer resumes from %s", resume)
    return resume


def download(
    store: Store,
    s: RestoreSettings,
    named: list[tuple[str, FileEntry]],
    staging: Path,
    metrics: Metrics,
) -> None:
    """Downloads the checkpoint's files into ``staging``, each verified as it lands."""
    what = checkpoint_dirname(s.step)
    staging.mkdir(parents=True)
    files = []
    packs: dict[str, list[Target]] = {}  # a pack's key -> where its files go
    algos: dict[str, checksum.Algorithm] = {}
    for relative_key, f in named:
        dest = target_path(staging, f.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        key = s.run.key(relative_key)
        try:
            algo = checksum.algorithm(f.checksum_algorithm)
        except ValueError as e:
            raise CheckpointBad(f"{what}: {f.path}: {e}") from e
        if algos.setdefault(key, algo) != algo:
            raise CheckpointBad(f"{what}: {f.pack} holds files of two checksum algorithms")
        if f.pack is None:
            files.append((key, str(dest), f.size, f.checksum))
        else:
            packs.setdefault(key, []).append(
                Target(f.path, str(dest), f.offset, f.size, f.checksum)
            )
    # What is read: a pack's bytes up to its last file kept, those of a file another rank's
    # copy stands for included (read past, trainingrun.agent.packs.Splitter).
    total = sum(f[2] for f in files) + sum(
        max(t.offset + t.size for t in ts) for ts in packs.values()
    )
    progress = Progress(what, total, len(named), on_bytes=metrics.bytes.inc)
    transfer = Download(store, s.transfer)
    try:
        transfer.download_files(files, algos.__getitem__, progress, packs)
    except VerificationFailed as e:
        raise CheckpointBad(f"{what} is corrupt: {e}") from e
    except NotFound as e:
        raise CheckpointBad(f"{what}: an object is gone: {e}") from e
    finally:
        transfer.close()


def extras_beside(what: str, layout: Layout | None, paths: set[str]) -> dict[str, str]:
    """The layout's extra files to write beside the checkpoint: not one named like a checkpoint
    file, which would replace that file after its checksum was verified (the file, as the
    trainer wrote it, is kept)."""
    extras = dict(layout.extras) if layout else {}
    for clash in sorted(paths.intersection(extras)):
        log.warning(
            "%s: not writing the layout's extra file %r: it is also a checkpoint file, which "
            "is kept as downloaded and verified",
            what,
            clash,
        )
        del extras[clash]
    return extras


def place(staging: Path, final: Path, layout: Layout | None, extras: dict[str, str]) -> None:
    """Puts the verified files where their layout goes: the HF Trainer's folder marked
    complete, else the files and the framework's pointer files (``extras``, from
    ``extras_beside``) under the layout's base."""
    if layout is None:
        shutil.rmtree(final, ignore_errors=True)
        local.mark_complete(staging)
        local.share(staging)
        staging.rename(final)
    else:
        for relative, text in extras.items():
            target_path(staging, relative).write_text(text)
        local.share(staging)
        move_into(staging, final)


def move_into(staging: Path, final: Path) -> None:
    """Puts the staged files in place: the folder renamed when nothing is there yet, else file
    by file (a layout whose files sit beside the trainer's others, such as DeepSpeed's
    ``latest``, or a checkpoint folder left by an earlier attempt)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():
        staging.rename(final)
        return
    for root, _dirs, names in os.walk(staging):
        for name in names:
            source = Path(root, name)
            dest = final / source.relative_to(staging)
            if dest.is_dir():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, dest)
    shutil.rmtree(staging, ignore_errors=True)


def main(store: Store, s: RestoreSettings, metrics: Metrics) -> int:
    """Restores, then writes the outcome a trainer started beside the restore waits for
    (``local.RESTORED``), when one does."""
    if not s.tell_trainer:
        return _restore(store, s, metrics)[0]
    before = signal.signal(signal.SIGTERM, stop_on_sigterm(s.checkpoint_dir))
    try:
        code, message = _restore(store, s, metrics)
    finally:
        signal.signal(signal.SIGTERM, before)
    try:
        local.write_restored(s.checkpoint_dir, local.Restored(code, message))
    except OSError as e:
        log.error("could not write the restore's outcome for the trainer: %s", e)
        return code or EXIT_ERROR
    return code


def stop_on_sigterm(checkpoint_dir: Path) -> Callable[[int, FrameType | None], None]:
    """The restore's SIGTERM handler beside the trainer: the pod is being deleted, so the
    outcome says so at once and the process ends; the trainer, waiting for the outcome, ends
    too, instead of waiting out the pod's grace period."""

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped = local.Restored(EXIT_STOPPED, "the restore was stopped: the pod is being deleted")
        with contextlib.suppress(OSError):
            local.write_restored(checkpoint_dir, stopped)
        os._exit(EXIT_STOPPED)

    return stop


def _restore(store: Store, s: RestoreSettings, metrics: Metrics) -> tuple[int, str]:
    unexpected, logged = False, ""
    try:
        resume = restore(store, s, metrics)
        return EXIT_OK, f"{checkpoint_dirname(s.step)} restored and verified at {resume}"
    except CheckpointBad as e:
        reason, message, code = "CheckpointBad", f"checkpoint bad: {e}", EXIT_CHECKPOINT_BAD
    except InsufficientDisk as e:
        reason, code = "InsufficientDisk", EXIT_INSUFFICIENT_DISK
        message = f"insufficient disk: {e}"
    except NodeDiskFull as e:  # the same code, told apart by its message (decide.classify)
        reason, code = "NodeDiskFull", EXIT_INSUFFICIENT_DISK
        message = f"{NODE_DISK_FULL_MESSAGE}: {e}"
    except StorageError as e:
        reason, message, code = type(e).__name__, f"restore failed: {e}", EXIT_ERROR
        # The pod's log also has what the endpoint said (escaped); the termination message,
        # which the operator reads, has the product's words only.
        logged = f"restore failed: {log_text(e)}"
    except Exception as e:  # the folder refusing (EACCES), a bug: named, never a bare exit 1
        reason, code, unexpected = type(e).__name__, EXIT_ERROR, True
        message = f"restore failed: {type(e).__name__}: {e}"
    metrics.failures.labels(reason).inc()
    log.error("%s", logged or message, exc_info=unexpected)
    local.write_termination_message(s.termination_log, message)
    return code, message
