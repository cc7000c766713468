"""``trainingrun restore``: the init container that puts the chosen checkpoint on local disk.

Reads ``manifest.json``, the step's committed entry and the part record of each of its ranks,
and downloads every file the parts name (all ranks' files: the whole checkpoint) with parallel
ranged GETs into a staging folder, verifies each size and checksum as it lands, and only then
moves it where its layout goes: ``checkpoint-<step>/`` for the HF Trainer (marked complete, so
sync does not upload it again), else the entry's ``layout.base``, with the framework's pointer
files (``layout.extras``) written beside it. Object names that would escape the folder are
refused before anything is written.

Exit codes (documented in docs/, read by the operator):

- 0: restored and verified.
- 3 (``contract.EXIT_CHECKPOINT_BAD``): the checkpoint is not usable: not committed, its
  ``MANIFEST.json`` missing or malformed, an object missing, short, or with a wrong checksum, or
  a name escaping the folder. The termination message names the checkpoint and the file; the
  operator marks the step bad and resubmits from the previous committed one.
- 1: anything else (endpoint unreachable, access denied): the attempt failed and is retried.
- 2: the container's settings are wrong (missing environment).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from trainingrun import checksum, local
from trainingrun.committed import read_committed
from trainingrun.contract import EXIT_CHECKPOINT_BAD, EXIT_ERROR, EXIT_OK
from trainingrun.layouts import STAGING_PREFIX
from trainingrun.manifest import (
    RUN_MANIFEST,
    FileEntry,
    Layout,
    ManifestError,
    checkpoint_dirname,
    parse_run_manifest,
    safe_relative_path,
)
from trainingrun.storage import Location, NotFound, StorageError, Store
from trainingrun.transfer import (
    Progress,
    Transfer,
    TransferSettings,
    VerificationFailed,
    format_bytes,
)

log = logging.getLogger("trainingrun.restore")


class CheckpointBad(Exception):
    """The chosen checkpoint cannot be trusted; the message names it and the file."""


@dataclass(frozen=True)
class RestoreSettings:
    checkpoint_dir: Path
    run: Location
    step: int
    transfer: TransferSettings = field(default_factory=TransferSettings)
    termination_log: Path = Path("/dev/termination-log")


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


def restore(store: Store, s: RestoreSettings, metrics: Metrics | None = None) -> Path:
    """Downloads and verifies checkpoint ``s.step`` and puts it where its layout goes; returns
    what the trainer resumes from."""
    metrics = metrics or Metrics()
    what = checkpoint_dirname(s.step)
    named, layout = read_checkpoint(store, s)
    final = s.checkpoint_dir / Layout.folder(layout, s.step)
    staging = s.checkpoint_dir / f"{STAGING_PREFIX}{what}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files = []
    algos = {}
    for relative_key, f in named:
        dest = target_path(staging, f.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        key = s.run.key(relative_key)
        try:
            algos[key] = checksum.algorithm(f.checksum_algorithm)
        except ValueError as e:
            raise CheckpointBad(f"{what}: {f.path}: {e}") from e
        files.append((key, str(dest), f.size, f.checksum))
    total = sum(f.size for _, f in named)

    progress = Progress(what, total, len(files), on_bytes=metrics.bytes.inc)
    log.info("%s: downloading %d files, %s", what, len(files), format_bytes(total))
    started = time.monotonic()
    transfer = Transfer(store, s.transfer)
    try:
        transfer.download_files(files, algos.__getitem__, progress)
    except VerificationFailed as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointBad(f"{what} is corrupt: {e}") from e
    except NotFound as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointBad(f"{what}: an object is gone: {e}") from e
    finally:
        transfer.close()
    if layout is None:
        shutil.rmtree(final, ignore_errors=True)
        local.mark_complete(staging)
        local.share(staging)
        staging.rename(final)
    else:
        for relative, text in layout.extras.items():
            target_path(staging, relative).write_text(text)
        local.share(staging)
        move_into(staging, final)
    elapsed = time.monotonic() - started
    log.info(
        "%s restored and verified: %d files, %s in %.1f s (%s/s)",
        what,
        len(files),
        format_bytes(total),
        elapsed,
        format_bytes(total / max(elapsed, 1e-6)),
    )
    resume = s.checkpoint_dir / Layout.resume_path(layout, s.step)
    log.info("the trainer resumes from %s", resume)
    return resume


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
    try:
        restore(store, s, metrics)
        return EXIT_OK
    except CheckpointBad as e:
        metrics.failures.labels("CheckpointBad").inc()
        message = f"checkpoint bad: {e}"
        code = EXIT_CHECKPOINT_BAD
    except StorageError as e:
        metrics.failures.labels(type(e).__name__).inc()
        message = f"restore failed: {e}"
        code = EXIT_ERROR
    log.error("%s", message)
    local.write_termination_message(s.termination_log, message)
    return code
