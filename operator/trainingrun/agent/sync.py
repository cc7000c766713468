"""``trainingrun sync``: the checkpoint sync sidecar's loop.

Watches ``TRAININGRUN_CHECKPOINT_DIR`` (inotify through watchdog, with a polling fallback). Each
pass finds the complete checkpoints of the folder's layout (``local.survey``, the rules of
``trainingrun.checkpoint.layouts``) and, newest first, for each one not committed yet: uploads
every file
with a full-object checksum the endpoint checks (multipart for large ones), verifies each
object's size and stored checksum, then commits it by the protocol in
``trainingrun.checkpoint.commit``
(create-only MANIFEST.json, manifest.json by compare-and-swap, retention).

Each sidecar writes as one rank of one epoch (the fence its attempt holds,
``TRAININGRUN_EPOCH``, set by the operator; a sync started by hand takes one itself): once it
sees a newer epoch hold the fence it stops uploading for good.

On SIGTERM (the trainer has exited: a native sidecar stops last) it uploads and commits the
newest complete checkpoint within ``TRAININGRUN_DRAIN_SECONDS``, aborts what it could not
finish, and exits 0; also when SIGTERM comes during its start-up (``trainingrun.agent.stopsignal``).
After ``access_denied_seconds`` of nothing but access denied (credentials rotated or revoked) it
exits 1 with a termination message, so that the kubelet restarts it with the Secret read again.
On an endpoint that honours If-None-Match but ignores If-Match it commits nothing and exits 1
with a termination message (``sidecar.check_conditions``).
A preemption notice in the pod's annotations (downward API file) becomes a "save now" request to
the trainer integration. Faults (endpoint down, a file that changed) are
retried with jittered backoff; nothing unverified is ever committed. The sidecar's Prometheus
metrics are here too.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from types import FrameType

from trainingrun.agent import stopsignal
from trainingrun.agent.packs import plan as plan_packs
from trainingrun.agent.progress import ProgressPublisher, publish_last, start_publishing
from trainingrun.agent.sidecar import (
    PERMANENT,
    AccessDeniedWatch,
    IfMatchIgnored,
    LayoutReport,
    Metrics,
    NoticeRelay,
    SyncSettings,
    check_conditions,
    describe,
    layout_of,
    log_uploaded,
    protect_bodies,
    publish_progress,
    report_failure,
    watch,
)
from trainingrun.agent.transfer import (
    Cancelled,
    FileChanged,
    Progress,
    Transfer,
    VerificationFailed,
    verify_uploaded,
)
from trainingrun.checkpoint import local
from trainingrun.checkpoint.commit import (
    Capabilities,
    Committer,
    Outcome,
    detect_capabilities,
    take_fence,
)
from trainingrun.checkpoint.local import LocalCheckpoint, survey
from trainingrun.checkpoint.manifest import (
    MANIFEST_VERSION,
    PACKED_VERSION,
    CheckpointManifest,
    ManifestEntry,
    ManifestError,
    RunManifest,
    safe_relative_path,
)
from trainingrun.checkpoint.protocol import Fenced, StaleAttempt, worth_uploading
from trainingrun.contract import EXIT_ERROR, format_bytes, now_rfc3339_micro
from trainingrun.storage.opener import StorageError, Store

log = logging.getLogger("trainingrun.agent.sync")

__all__ = ["Sync", "SyncSettings", "main"]  # SyncSettings lives in syncsupport


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
        self.parts_written: set[int] = set()  # steps whose part this sidecar wrote
        self.fenced: Fenced | StaleAttempt | None = None
        self.seen_complete: dict[int, float] = {}
        self.layouts = LayoutReport(settings.checkpoint_dir, self.metrics)
        self.notice = NoticeRelay(settings.podinfo_dir, settings.checkpoint_dir, self.metrics)
        self.transfer = Transfer(store, settings.transfer)
        self.denied = AccessDeniedWatch(settings.access_denied_seconds)

    # -- lifecycle ------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        log.info("SIGTERM: uploading the newest complete checkpoint, then exiting")
        self.stopping.set()
        self.wake.set()

    def start(self) -> None:
        caps = self.caps = detect_capabilities(self.store, self.s.run, self.s.checksum)
        log.info("endpoint: %s", caps.describe())
        check_conditions(caps.conditional_writes, caps.if_match, self.s.termination_log)
        protect_bodies(self.store, caps.verifies_checksums)
        epoch = self.s.epoch if self.s.epoch is not None else take_own_fence(self.store, self.s)
        self.committer = Committer(
            self.store, self.s.run, self.caps, self.s.keep, epoch, self.s.rank, self.s.ranks
        )
        log.info("writing as epoch %d, rank %d of %d", epoch, self.s.rank, self.s.ranks)
        aborted = self.committer.abort_stale_uploads()
        if aborted:
            log.info("aborted %d unfinished multipart uploads of an earlier sync", aborted)
        manifest, _ = self.refresh_committed()
        if manifest is not None:  # what older attempts left, once; later only the steps it commits
            sweep(self.committer, manifest, [], self.metrics)

    def refresh_committed(self) -> tuple[RunManifest | None, str | None]:
        """The committed steps, read again; returns the manifest read and its ETag. Raises
        Fenced when a newer epoch holds the fence."""
        assert self.committer is not None
        manifest, etag = self.committer.read()
        self.committer.check_fence(manifest)
        self.committed = sorted(e.step for e in manifest.entries) if manifest else []
        if self.committed:
            self.metrics.last_step.set(self.committed[-1])
        return manifest, etag

    def publishing(self) -> bool:
        """Whether the trainer's progress is published: not once a newer attempt holds the
        fence (this pod is on its way out)."""
        return self.fenced is None

    def on_fenced(self, e: Fenced | StaleAttempt) -> None:
        """A newer attempt holds the fence: stop uploading for good (the pod is an old
        attempt's, on its way out)."""
        if self.fenced is None:
            log.warning("%s; no more uploads", e)
            self.metrics.fenced.set(1)
        self.fenced = e

    def run(self) -> int:
        """The sidecar's main loop; returns the exit code."""
        backoff = 1.0
        started = False
        while not self.stopping.is_set():
            try:
                if not started:
                    self.start()
                    started = True
                self.notice.check()
                publish_progress(self.s.checkpoint_dir, self.metrics)
                self.sync_once(trainer_gone=False)
                backoff = 1.0
                self.denied.clear()
                if self.fenced is not None:
                    self.stopping.wait()  # nothing more to do here until the pod stops
                self.wait_for_changes()
            # OSError: the local folder (a file removed or unreadable mid-scan); a later pass
            # sees it as it settled.
            except (StorageError, ManifestError, FileChanged, VerificationFailed, OSError) as e:
                report_failure(e, self.metrics)
                if self.denied.expired(e):  # the trainer is unprotected: a restart may help
                    self.denied.give_up(e, self.s.termination_log)
                    self.transfer.close()
                    return EXIT_ERROR
                self.stopping.wait(backoff * random.uniform(0.5, 1.0))  # noqa: S311
                backoff = min(backoff * 2, self.s.max_backoff_seconds)
            except (Fenced, StaleAttempt) as e:  # from start()
                self.on_fenced(e)
                self.stopping.wait()  # nothing more to do here until the pod stops
            except IfMatchIgnored:  # from start(): said; the kubelet restarts it, probing again
                self.transfer.close()
                return EXIT_ERROR
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
                except (Fenced, StaleAttempt) as e:  # from start()
                    self.on_fenced(e)
                    break
                except (Cancelled, IfMatchIgnored):
                    break
                except (StorageError, ManifestError, FileChanged, VerificationFailed, OSError) as e:
                    report_failure(e, self.metrics)
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

    # -- one pass -------------------------------------------------------------------------

    def sync_once(self, trainer_gone: bool, newest_only: bool = False) -> None:
        if self.fenced is not None:
            return
        now = time.time()
        found = survey(self.s.checkpoint_dir, self.s.format, self.s.pattern)
        self.layouts.report(found)
        quiet = self.s.quiet_seconds
        complete = [c for c in found.checkpoints if c.complete(now, quiet, trainer_gone)]
        for c in complete:
            self.seen_complete.setdefault(c.step, time.monotonic())
        todo = [c for c in complete if worth_uploading(c.step, self.committed, self.s.keep)]
        self.metrics.pending.set(len(todo))
        for ckpt in sorted(todo, key=lambda c: -c.step)[: 1 if newest_only else None]:
            if self.stopping.is_set() and not trainer_gone:
                return  # drain() takes over with the newest one
            try:
                self.upload_checkpoint(ckpt)
            except Fenced as e:
                self.on_fenced(e)
                return

    def upload_checkpoint(self, ckpt: LocalCheckpoint) -> None:
        """Uploads this rank's part of ``ckpt`` (once), then commits the step if all ranks'
        parts are there. The committed steps are read first: another rank or a restarted
        sidecar may have committed it meanwhile."""
        assert self.committer is not None
        read: tuple[RunManifest | None, str | None] | None = self.refresh_committed()
        if ckpt.step in self.committed:
            return
        started = time.monotonic()
        if ckpt.step not in self.parts_written:
            self.upload_part(ckpt)
            self.parts_written.add(ckpt.step)
            read = None  # the upload took a while: the commit reads the manifest afresh
        outcome = self.committer.try_commit(ckpt.step, self.s.attempt, read)
        self.after_commit(ckpt, outcome, started)

    def upload_part(self, ckpt: LocalCheckpoint) -> None:
        """Uploads and verifies this rank's files of ``ckpt`` and writes its part record."""
        assert self.caps is not None and self.committer is not None
        algo = self.caps.algorithm
        prefix = self.committer.data_prefix(ckpt.step)
        for rel, _ in ckpt.files:
            safe_relative_path(rel)
        if not ckpt.files:
            raise FileChanged(f"{ckpt.path} has no files")
        total = sum(size for _, size in ckpt.files)
        what = describe(ckpt)
        progress = Progress(what, total, len(ckpt.files), on_bytes=self.metrics.bytes.inc)
        log.info("%s: uploading %d files, %s", what, len(ckpt.files), format_bytes(total))
        started = time.monotonic()
        workers = self.s.transfer.concurrency
        direct, packs = plan_packs(list(ckpt.files), workers)
        pairs = [(str(ckpt.path / rel), f"{prefix}/{rel}") for rel, _ in direct]
        packed = [(pack, ckpt.path, prefix) for pack in packs]
        sums = self.transfer.upload_files(pairs, algo, progress, packed)
        self.metrics.files.inc(len(ckpt.files))
        entries = verify_uploaded(self.store, ckpt, prefix, algo, sums, workers, packs)
        elapsed = time.monotonic() - started
        part = CheckpointManifest(
            version=PACKED_VERSION if packs else MANIFEST_VERSION,
            step=ckpt.step,
            files=entries,
            created=now_rfc3339_micro(),
            epoch=self.committer.epoch,
            attempt=self.s.attempt,
            rank=self.committer.rank,
            ranks=self.committer.ranks,
            layout=layout_of(ckpt),
            # What a save of this size takes: the operator shows it against the grace period.
            upload_seconds=round(elapsed, 3),
        )
        self.committer.write_part(part)
        log_uploaded(what, len(entries), total, elapsed, algo.name, self.s.drain_seconds)

    def after_commit(self, ckpt: LocalCheckpoint, outcome: Outcome, started: float) -> None:
        what = describe(ckpt)
        if outcome.missing:
            log.info("%s: part written; waiting for ranks %s", what, list(outcome.missing))
            return
        if outcome.already is not None:
            log.info("%s is committed already (epoch %d)", what, outcome.already)
            self.committed = sorted({*self.committed, ckpt.step})
            return
        dropped = list(outcome.dropped)
        self.committed = sorted({*self.committed, ckpt.step} - {d.step for d in dropped})
        self.metrics.commits.inc()
        self.metrics.last_step.set(max(self.committed))
        self.metrics.lag.set(time.monotonic() - self.seen_complete.get(ckpt.step, started))
        log.info("%s committed (epoch %d)", what, self.committer.epoch if self.committer else 0)
        if outcome.manifest is not None and self.committer is not None:
            steps = [ckpt.step, *(d.step for d in dropped)]
            sweep(self.committer, outcome.manifest, dropped, self.metrics, steps)


def take_own_fence(store: Store, s: SyncSettings) -> int:
    """The epoch of a sync started by hand (no ``TRAININGRUN_EPOCH``): it takes the fence."""
    holder = f"sync@{socket.gethostname()}"
    _, epoch = take_fence(store, s.run, holder, s.attempt or 1)  # raises StaleAttempt
    log.info("no epoch given: took the run's fence, epoch %d", epoch)
    return epoch


def sweep(
    committer: Committer,
    manifest: RunManifest,
    dropped: list[ManifestEntry],
    metrics: Metrics,
    steps: list[int] | None = None,
) -> None:
    """Retention's second half and the old epochs' leftovers: objects no entry names (in the
    folders of ``steps`` only, when given)."""
    names = ", ".join(f"checkpoint-{d.step}" for d in dropped)
    try:
        n = committer.sweep(manifest, tuple(dropped), steps)
    except StorageError as e:
        # The manifest no longer names them: left over, they cost space, never a resume.
        metrics.failures.labels("RetentionDeleteFailed").inc()
        log.warning(
            "retention (keep %d): %s; deleting unused objects failed: %s; they stay in the "
            "bucket unused (s3:DeleteObject needed)",
            committer.keep,
            f"dropped {names} from the manifest" if names else "nothing dropped",
            e,
        )
        return
    if dropped or n:
        log.info(
            "retention (keep %d): dropped %s, deleted %d unused objects",
            committer.keep,
            names or "nothing",
            n,
        )


def main(
    store: Store,
    settings: SyncSettings,
    metrics: Metrics,
    stop: stopsignal.StopRequest | None = None,
) -> int:
    """The sidecar; ``stop``: the SIGTERM handler its command installed first thing (else it is
    installed here). A SIGTERM already received makes the run a drain once started."""
    stop = stop or stopsignal.install()
    sync = Sync(store, settings, metrics)
    stop.attach(sync.on_sigterm)
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
    observer = watch(settings.checkpoint_dir, sync.wake)
    publisher = None
    if settings.rank == 0:  # a gang's ranks train in step: rank 0 speaks for them
        publisher = ProgressPublisher(
            store, settings.run, settings.attempt, interval=settings.progress_seconds
        )
        start_publishing(publisher, settings.checkpoint_dir, sync.stopping, sync.publishing)
    log.info(
        "sync: watching %s%s, committing to s3://%s/%s (keep %d)",
        settings.checkpoint_dir,
        " (inotify)" if observer else " (polling)",
        settings.run.bucket,
        settings.run.prefix,
        settings.keep,
    )
    try:
        code = sync.run()
    finally:
        if observer is not None:
            observer.stop()
    if publisher is not None and sync.publishing():
        publish_last(publisher, settings.checkpoint_dir)
    return code
