"""``trainingrun sync``: the checkpoint sync sidecar.

Watches ``TRAININGRUN_CHECKPOINT_DIR`` (inotify through watchdog, with a polling fallback), and
for each complete ``checkpoint-<step>/`` that is not committed yet, newest first:

1. uploads every file with a full-object checksum the endpoint checks (multipart for large ones);
2. verifies each object's size and stored checksum;
3. writes ``checkpoints/checkpoint-<step>/MANIFEST.json`` create-only;
4. adds the step to ``manifest.json`` by compare-and-swap (If-Match, retried on 412). Only now
   is the step committed;
5. applies retention (``keep``): the manifest drops old entries first, their objects go after.

On SIGTERM (the trainer has exited: a native sidecar stops last) it uploads and commits the
newest complete checkpoint within ``TRAININGRUN_DRAIN_SECONDS``, aborts what it could not
finish, and exits 0. A preemption notice in the pod's annotations (downward API file) becomes a
"save now" request to the trainer integration. Faults (endpoint down, a file that changed) are
retried with jittered backoff; nothing unverified is ever committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from trainingrun import checksum, local
from trainingrun.checksum import Algorithm
from trainingrun.contract import ANNOTATION_NOTICE, now_rfc3339_micro
from trainingrun.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    ManifestError,
    RunManifest,
    checkpoint_prefix,
    parse_checkpoint_manifest,
    parse_run_manifest,
    safe_relative_path,
    same_files,
    with_committed,
    worth_uploading,
)
from trainingrun.storage import (
    ChecksumMismatch,
    Location,
    NotFound,
    PreconditionFailed,
    StorageAccessDenied,
    StorageError,
    StorageRejected,
    StorageUnavailable,
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

CAS_ATTEMPTS = 20
# Failures that retrying does not fix; the loop still retries them slowly (someone may fix the
# bucket or the Secret), but a drain does not wait for them.
PERMANENT = (StorageAccessDenied, NotFound, StorageRejected, ManifestError)


# ---------------------------------------------------------------------------------------------
# The local folder


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
        step = local.checkpoint_step(entry.name)
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
                if local.is_internal(rel):
                    marked = True
                    continue
                if not full.is_file() or full.is_symlink():
                    continue  # only regular files are checkpoint data
                files.append((rel, st.st_size))
        has_state = any(rel == local.TRAINER_STATE for rel, _ in files)
        found.append(LocalCheckpoint(step, root, marked, has_state, tuple(sorted(files)), newest))
    return sorted(found, key=lambda c: c.step)


# ---------------------------------------------------------------------------------------------
# What the endpoint can do


@dataclass(frozen=True)
class Capabilities:
    algorithm: Algorithm
    verifies_checksums: bool
    conditional_writes: bool

    def describe(self) -> str:
        return (
            f"checksum {self.algorithm.name} "
            f"({'checked' if self.verifies_checksums else 'NOT checked'} by the endpoint), "
            f"conditional writes {'yes' if self.conditional_writes else 'no'}"
        )


def detect_capabilities(store: Store, run: Location, wanted: str = "auto") -> Capabilities:
    """Probes the endpoint with a few tiny objects under the run's prefix: which checksum it
    accepts and checks, and whether it honours If-None-Match. The probe objects are removed."""
    probe = run.key(".trainingrun-probe", uuid.uuid4().hex)
    names = checksum.PREFERENCE if wanted == "auto" else (checksum.algorithm(wanted).name,)
    data = b"trainingrun capability probe"
    chosen: Algorithm | None = None
    verifies = False
    try:
        for name in names:
            algo = checksum.ALGORITHMS[name]
            try:
                store.put_checked(probe, data, algo.header, checksum.digest(algo, data))
            except StorageRejected:
                log.info("endpoint refuses %s checksums", name)
                continue
            chosen = algo
            wrong = checksum.digest(algo, data + b"!")
            try:
                store.put_checked(probe, data, algo.header, wrong)
            except ChecksumMismatch:
                verifies = True
            except StorageRejected:
                verifies = True  # refused, which is what matters
            break
        if chosen is None:
            raise StorageRejected(
                f"the endpoint accepts none of the checksum algorithms {', '.join(names)}; "
                "set TRAININGRUN_CHECKSUM to one it supports"
            )
        cond_key = probe + "-cond"
        store.put(cond_key, b"1", if_none_match=True)
        try:
            store.put(cond_key, b"2", if_none_match=True)
            conditional = False
        except PreconditionFailed:
            conditional = True
        except StorageRejected:
            conditional = False
    finally:
        with contextlib.suppress(StorageError):
            store.delete([probe, probe + "-cond"])
    return Capabilities(chosen, verifies, conditional)


# ---------------------------------------------------------------------------------------------
# Committing


class Committer:
    """Writes a checkpoint's MANIFEST.json and commits it to manifest.json."""

    def __init__(self, store: Store, run: Location, caps: Capabilities, keep: int) -> None:
        self.store = store
        self.run = run
        self.caps = caps
        self.keep = keep

    def read(self) -> tuple[RunManifest | None, str | None]:
        got = self.store.get_with_etag(self.run.key(RUN_MANIFEST))
        if got is None:
            return None, None
        return parse_run_manifest(got[0]), got[1]

    def write_checkpoint_manifest(self, ckpt: CheckpointManifest) -> None:
        key = self.run.key(checkpoint_prefix(ckpt.step), CHECKPOINT_MANIFEST)
        body = ckpt.model_dump_json(indent=1).encode()
        try:
            self.store.put(key, body, if_none_match=self.caps.conditional_writes)
            return
        except PreconditionFailed:
            pass
        # One exists: left by an earlier attempt or a sync killed before its commit.
        existing = self.store.get_with_etag(key)
        if existing is not None:
            try:
                if same_files(parse_checkpoint_manifest(existing[0], ckpt.step), ckpt):
                    return
            except ManifestError:
                pass
            manifest, _ = self.read()
            if manifest and any(e.step == ckpt.step for e in manifest.entries):
                raise PreconditionFailed(
                    f"checkpoint-{ckpt.step} is already committed with other contents; "
                    "a second writer is active for this run"
                )
            # Not committed, so nobody trusts it: replace it, but only the version we read.
            self.store.put(key, body, if_match=existing[1])
        else:
            self.store.put(key, body, if_none_match=True)

    def commit(self, entry: ManifestEntry) -> list[ManifestEntry]:
        """Adds ``entry`` by compare-and-swap; returns the entries retention dropped."""
        key = self.run.key(RUN_MANIFEST)
        for attempt in range(CAS_ATTEMPTS):
            manifest, etag = self.read()
            updated, dropped = with_committed(manifest, entry, self.keep)
            try:
                if not self.caps.conditional_writes:
                    self.store.put(key, updated.to_json())
                    check, _ = self.read()  # best effort without CAS: confirm it stuck
                    if check is None or all(e.step != entry.step for e in check.entries):
                        raise PreconditionFailed(f"{key}: a concurrent write replaced ours")
                elif etag is None:
                    self.store.put(key, updated.to_json(), if_none_match=True)
                else:
                    self.store.put(key, updated.to_json(), if_match=etag)
                return dropped
            except PreconditionFailed:
                time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))  # noqa: S311
        raise StorageUnavailable(
            f"{key}: still losing the compare-and-swap after {CAS_ATTEMPTS} tries"
        )

    def delete_checkpoint_objects(self, steps: list[int]) -> int:
        """Deletes the objects of dropped steps, after the manifest no longer names them."""
        keys: list[str] = []
        for step in steps:
            keys.extend(
                k for k, _ in self.store.list_objects(self.run.key(checkpoint_prefix(step)) + "/")
            )
        if keys:
            self.store.delete(keys)
        return len(keys)


# ---------------------------------------------------------------------------------------------
# The sidecar


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
        # Verify: every object there with the size we read and, where the endpoint stores it,
        # our checksum; a file whose size changed since the scan means it is still being written.
        entries = []
        for rel, size in ckpt.files:
            key = f"{prefix}/{rel}"
            local_size = (ckpt.path / rel).stat().st_size
            if local_size != size:
                raise FileChanged(f"{ckpt.path / rel} changed size during the upload")
            head = self.store.head(key, algo.header)
            if head is None or head[0] != size:
                raise VerificationFailed(f"{key}: expected {size} bytes, found {head and head[0]}")
            if head[1] is not None and head[1] != sums[key]:
                raise VerificationFailed(f"{key}: stored checksum {head[1]} != ours {sums[key]}")
            entries.append(
                FileEntry(path=rel, size=size, checksum_algorithm=algo.name, checksum=sums[key])
            )
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
            log.info(
                "retention (keep %d): dropped %s, deleted %d objects",
                self.s.keep,
                names,
                n,
            )


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
