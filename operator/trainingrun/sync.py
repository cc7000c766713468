"""``trainingrun sync``: the checkpoint sync sidecar's loop.

Watches ``TRAININGRUN_CHECKPOINT_DIR`` (inotify through watchdog, with a polling fallback). Each
pass finds the complete ``checkpoint-<step>/`` folders (``local.scan``) and, newest first, for
each one not committed yet: uploads every file with a full-object checksum the endpoint checks
(multipart for large ones), verifies each object's size and stored checksum, then commits it by
the protocol in ``trainingrun.commit`` (create-only MANIFEST.json, manifest.json by
compare-and-swap, retention).

On SIGTERM (the trainer has exited: a native sidecar stops last) it uploads and commits the
newest complete checkpoint within ``TRAININGRUN_DRAIN_SECONDS``, aborts what it could not
finish, and exits 0. A preemption notice in the pod's annotations (downward API file) becomes a
"save now" request to the trainer integration. Faults (endpoint down, a file that changed) are
retried with jittered backoff; nothing unverified is ever committed. The sidecar's Prometheus
metrics are here too.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from trainingrun import local
from trainingrun.commit import Capabilities, Committer, detect_capabilities, verify_uploaded
from trainingrun.contract import ANNOTATION_NOTICE, now_rfc3339_micro
from trainingrun.local import LocalCheckpoint, scan
from trainingrun.manifest import (
    MANIFEST_VERSION,
    CheckpointManifest,
    ManifestEntry,
    ManifestError,
    checkpoint_prefix,
    safe_relative_path,
    worth_uploading,
)
from trainingrun.storage import (
    Location,
    NotFound,
    StorageAccessDenied,
    StorageError,
    StorageRejected,
    Store,
)
from trainingrun.transfer import (
    Cancelled,
    FileChanged,
    Progress,
    Transfer,
    TransferSettings,
    VerificationFailed,
    format_bytes,
)

log = logging.getLogger("trainingrun.sync")

# Failures that retrying does not fix; the loop still retries them slowly (someone may fix the
# bucket or the Secret), but a drain does not wait for them.
PERMANENT = (StorageAccessDenied, NotFound, StorageRejected, ManifestError)


@dataclass(frozen=True)
class SyncSettings:
    checkpoint_dir: Path
    run: Location
    keep: int = 3
    quiet_seconds: float = 10.0
    poll_seconds: float = 2.0
    settle_seconds: float = 0.5
    drain_seconds: float = 60.0
    checksum: str = "auto"
    transfer: TransferSettings = field(default_factory=TransferSettings)
    podinfo_dir: Path | None = None
    max_backoff_seconds: float = 30.0


class Metrics:
    """The sidecar's Prometheus metrics (served when a metrics port is set)."""

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.bytes = Counter("trainingrun_sync_uploaded_bytes", "Bytes uploaded.", registry=r)
        self.files = Counter("trainingrun_sync_uploaded_files", "Files uploaded.", registry=r)
        self.commits = Counter(
            "trainingrun_sync_committed_checkpoints", "Checkpoints committed.", registry=r
        )
        self.last_step = Gauge(
            "trainingrun_sync_last_committed_step", "Newest committed step.", registry=r
        )
        self.lag = Gauge(
            "trainingrun_sync_upload_lag_seconds",
            "From a checkpoint seen complete to its commit, for the last one committed.",
            registry=r,
        )
        self.pending = Gauge(
            "trainingrun_sync_pending_checkpoints",
            "Complete checkpoints not committed yet.",
            registry=r,
        )
        self.failures = Counter(
            "trainingrun_sync_failures",
            "Failed attempts to commit, by reason.",
            ["reason"],
            registry=r,
        )
        self.trainer_step = Gauge(
            "trainingrun_trainer_step", "The trainer's step, from its progress file.", registry=r
        )


class Sync:
    def __init__(
        self, store: Store, settings: SyncSettings, metrics: Metrics | None = None
    ) -> None:
        self.store = store
        self.s = settings
        self.metrics = metrics or Metrics()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.caps: Capabilities | None = None
        self.committer: Committer | None = None
        self.committed: list[int] = []
        self.seen_complete: dict[int, float] = {}
        self.notice_sent = False
        self.transfer = Transfer(store, settings.transfer)

    # -- lifecycle ------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        log.info("SIGTERM: uploading the newest complete checkpoint, then exiting")
        self.stopping.set()
        self.wake.set()

    def start(self) -> None:
        self.caps = detect_capabilities(self.store, self.s.run, self.s.checksum)
        log.info("endpoint: %s", self.caps.describe())
        if not self.caps.conditional_writes:
            log.warning(
                "the endpoint ignores If-None-Match/If-Match: commits fall back to write-then-"
                "read-back, which is safe with one writer per run (the operator's guarantee)"
            )
        self.committer = Committer(self.store, self.s.run, self.caps, self.s.keep)
        stale = self.store.list_multipart(self.s.run.key("checkpoints") + "/")
        for key, upload_id in stale:
            self.store.abort_multipart(key, upload_id)
        if stale:
            log.info("aborted %d unfinished multipart uploads of an earlier sync", len(stale))
        self.refresh_committed()

    def refresh_committed(self) -> None:
        assert self.committer is not None
        manifest, _ = self.committer.read()
        self.committed = sorted(e.step for e in manifest.entries) if manifest else []
        if self.committed:
            self.metrics.last_step.set(self.committed[-1])

    def run(self) -> int:
        """The sidecar's main loop; returns the exit code."""
        backoff = 1.0
        started = False
        while not self.stopping.is_set():
            try:
                if not started:
                    self.start()
                    started = True
                self.check_notice()
                self.publish_progress()
                self.sync_once(trainer_gone=False)
                backoff = 1.0
                self.wait_for_changes()
            # OSError: the local folder (a file removed or unreadable mid-scan); a later pass
            # sees it as it settled.
            except (StorageError, ManifestError, FileChanged, VerificationFailed, OSError) as e:
                self._failed(e)
                self.stopping.wait(backoff * random.uniform(0.5, 1.0))  # noqa: S311
                backoff = min(backoff * 2, self.s.max_backoff_seconds)
            except Cancelled:
                break
        return self.drain(started)

    def wait_for_changes(self) -> None:
        """Until the poll interval passes or the folder changed and then stayed still for
        ``settle_seconds``: a save writes many files, and one scan after the burst is enough."""
        if not self.wake.wait(min(self.s.poll_seconds, self.s.quiet_seconds)):
            return
        deadline = time.monotonic() + self.s.quiet_seconds
        while not self.stopping.is_set() and time.monotonic() < deadline:
            self.wake.clear()
            if not self.wake.wait(self.s.settle_seconds):
                return

    def drain(self, started: bool) -> int:
        """After SIGTERM: commit the newest complete checkpoint before the deadline."""
        deadline = time.monotonic() + self.s.drain_seconds
        timer = threading.Timer(self.s.drain_seconds, self.transfer.cancel)
        timer.daemon = True
        timer.start()
        try:
            while time.monotonic() < deadline:
                try:
                    if not started:
                        self.start()
                        started = True
                    self.sync_once(trainer_gone=True, newest_only=True)
                    break
                except Cancelled:
                    break
                except (StorageError, ManifestError, FileChanged, VerificationFailed, OSError) as e:
                    self._failed(e)
                    if isinstance(e, PERMANENT):
                        break  # waiting out the grace period would not change it
                    time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        finally:
            timer.cancel()
            aborted = self.transfer.abort_open_uploads()
            if aborted:
                log.warning(
                    "drain deadline: aborted %d unfinished uploads, nothing committed", aborted
                )
            self.transfer.close()
        log.info(
            "sync stopped; newest committed step %s",
            self.committed[-1] if self.committed else "none",
        )
        return 0

    def _failed(self, e: BaseException) -> None:
        reason = type(e).__name__
        self.metrics.failures.labels(reason).inc()
        hint = " (will not fix itself: see the message)" if isinstance(e, PERMANENT) else ""
        log.error("sync: %s: %s%s; retrying", reason, e, hint)

    # -- notice and progress --------------------------------------------------------------

    def check_notice(self) -> None:
        if self.notice_sent or self.s.podinfo_dir is None:
            return
        notice = read_annotation(self.s.podinfo_dir / "annotations", ANNOTATION_NOTICE)
        if notice:
            log.info("preemption notice (%s): asking the trainer to save now", notice)
            self.notice_sent = True  # once: a request that cannot be written is not retried
            try:
                local.request_save(self.s.checkpoint_dir, f"preemption notice: {notice}")
            except OSError as e:
                self.metrics.failures.labels("SaveRequestFailed").inc()
                log.error(
                    "cannot ask the trainer to save (%s): it saves at SIGTERM instead; run the "
                    "pod's containers as one user (pod securityContext.runAsUser) so the sidecar "
                    "can write to %s",
                    e,
                    self.s.checkpoint_dir / local.CONTROL_DIR,
                )

    def publish_progress(self) -> None:
        progress = local.read_progress(self.s.checkpoint_dir)
        if progress:
            self.metrics.trainer_step.set(progress.step)

    # -- one pass -------------------------------------------------------------------------

    def sync_once(self, trainer_gone: bool, newest_only: bool = False) -> None:
        now = time.time()
        complete = [
            c
            for c in scan(self.s.checkpoint_dir)
            if c.complete(now, self.s.quiet_seconds, trainer_gone)
        ]
        for c in complete:
            self.seen_complete.setdefault(c.step, time.monotonic())
        todo = [c for c in complete if worth_uploading(c.step, self.committed, self.s.keep)]
        self.metrics.pending.set(len(todo))
        for ckpt in sorted(todo, key=lambda c: -c.step)[: 1 if newest_only else None]:
            if self.stopping.is_set() and not trainer_gone:
                return  # drain() takes over with the newest one
            self.upload_checkpoint(ckpt)

    def upload_checkpoint(self, ckpt: LocalCheckpoint) -> None:
        assert self.caps is not None and self.committer is not None
        algo = self.caps.algorithm
        prefix = self.s.run.key(checkpoint_prefix(ckpt.step))
        for rel, _ in ckpt.files:
            safe_relative_path(rel)
        if not ckpt.files:
            raise FileChanged(f"{ckpt.path} has no files")
        total = sum(size for _, size in ckpt.files)
        what = f"checkpoint-{ckpt.step}"
        progress = Progress(what, total, len(ckpt.files), on_bytes=self.metrics.bytes.inc)
        log.info("%s: uploading %d files, %s", what, len(ckpt.files), format_bytes(total))
        started = time.monotonic()
        pairs = [(str(ckpt.path / rel), f"{prefix}/{rel}") for rel, _ in ckpt.files]
        sums = self.transfer.upload_files(pairs, algo, progress)
        self.metrics.files.inc(len(pairs))
        entries = verify_uploaded(self.store, ckpt, prefix, algo, sums)
        manifest = CheckpointManifest(
            version=MANIFEST_VERSION, step=ckpt.step, files=entries, created=now_rfc3339_micro()
        )
        self.committer.write_checkpoint_manifest(manifest)
        entry = ManifestEntry(
            step=ckpt.step,
            prefix=checkpoint_prefix(ckpt.step),
            committed=now_rfc3339_micro(),
            files=len(entries),
            bytes=total,
        )
        dropped = self.committer.commit(entry)
        elapsed = time.monotonic() - started
        self.committed = sorted({*self.committed, ckpt.step} - {d.step for d in dropped})
        self.metrics.commits.inc()
        self.metrics.last_step.set(max(self.committed))
        self.metrics.lag.set(time.monotonic() - self.seen_complete.get(ckpt.step, started))
        log.info(
            "%s committed: %d files, %s in %.1f s (%s/s), %s",
            what,
            len(entries),
            format_bytes(total),
            elapsed,
            format_bytes(total / max(elapsed, 1e-6)),
            algo.name,
        )
        if dropped:
            self.delete_dropped(dropped)

    def delete_dropped(self, dropped: list[ManifestEntry]) -> None:
        """Retention's second half: the objects of the steps the manifest no longer names."""
        assert self.committer is not None
        names = ", ".join(f"checkpoint-{d.step}" for d in dropped)
        try:
            n = self.committer.delete_checkpoint_objects([d.step for d in dropped])
        except StorageError as e:
            # The manifest no longer names them: left over, they cost space, never a resume.
            self.metrics.failures.labels("RetentionDeleteFailed").inc()
            log.warning(
                "retention (keep %d): dropped %s from the manifest, but deleting their "
                "objects failed: %s; they stay in the bucket unused (s3:DeleteObject needed)",
                self.s.keep,
                names,
                e,
            )
            return
        log.info("retention (keep %d): dropped %s, deleted %d objects", self.s.keep, names, n)


def read_annotation(path: Path, name: str) -> str | None:
    """One annotation from a downward API file (lines of ``key="escaped value"``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                # Go's %q leaves printable non-ASCII as UTF-8; only backslash escapes decode.
                value = value[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
            return value or "set"
    return None


def _watch(checkpoint_dir: Path, wake: threading.Event) -> Any:
    """Wakes the loop on any change under the folder; None when inotify is unavailable (the loop
    then polls)."""

    root = str(checkpoint_dir)

    class _Wake(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            # The progress file changes at every step: waking a scan for it would cost the
            # trainer CPU at every step for nothing (progress is read on the poll anyway).
            paths = [event.src_path, getattr(event, "dest_path", "") or ""]
            if any(
                p and not local.is_control(os.path.relpath(os.fsdecode(p), root)) for p in paths
            ):
                wake.set()

    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    observer = Observer()
    try:
        observer.schedule(_Wake(), str(checkpoint_dir), recursive=True)
        observer.daemon = True
        observer.start()
    except OSError as e:
        log.warning("inotify unavailable (%s); polling the folder instead", e)
        return None
    return observer


def main(store: Store, settings: SyncSettings, metrics: Metrics) -> int:
    sync = Sync(store, settings, metrics)
    signal.signal(signal.SIGTERM, sync.on_sigterm)
    try:
        # The sidecar starts before the trainer: the control folder it creates is one the
        # trainer can write progress into and the sidecar a save request, whatever their users.
        local.prepare_control_dir(settings.checkpoint_dir)
    except OSError as e:
        log.warning(
            "cannot make %s writable for the pod's containers (%s): preemption notices may not "
            "reach the trainer; run the containers as one user (pod securityContext.runAsUser)",
            settings.checkpoint_dir / local.CONTROL_DIR,
            e,
        )
    observer = _watch(settings.checkpoint_dir, sync.wake)
    log.info(
        "sync: watching %s%s, committing to s3://%s/%s (keep %d)",
        settings.checkpoint_dir,
        " (inotify)" if observer else " (polling)",
        settings.run.bucket,
        settings.run.prefix,
        settings.keep,
    )
    try:
        return sync.run()
    finally:
        if observer is not None:
            observer.stop()
