"""The sync sidecar's surroundings: its settings, its Prometheus metrics and failure log lines,
the watch on the checkpoint folder, the downward API file the preemption notice arrives in, its
report of the checkpoint formats it recognises, its watch on access denied (credentials
rotated or revoked) with the termination message that says so, and the signing of request
bodies for an endpoint that checks no checksum."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from trainingrun.agent.transfer import TransferSettings
from trainingrun.checkpoint import layouts, local
from trainingrun.checkpoint.local import LocalCheckpoint, Survey
from trainingrun.checkpoint.manifest import Layout, ManifestError
from trainingrun.contract import ANNOTATION_NOTICE, format_bytes
from trainingrun.decide.protection import ACCESS_DENIED_MESSAGE
from trainingrun.storage.opener import (
    Location,
    NotFound,
    StorageAccessDenied,
    StorageRejected,
    Store,
    log_text,
)

log = logging.getLogger("trainingrun.agent.sync")

# How the termination message starts when the sidecar refuses an endpoint that honours
# If-None-Match and ignores If-Match (``check_conditions``). It shares its first words with
# ``ACCESS_DENIED_MESSAGE``: checkpoints are not committed.
IF_MATCH_IGNORED_MESSAGE = "checkpoints are not being committed: the endpoint ignores If-Match"


class IfMatchIgnored(Exception):
    """The endpoint honours If-None-Match but ignores If-Match: a commit's compare-and-swap
    would not see a fence the operator took meanwhile, and would set it back."""


# Failures that retrying does not fix; the loop still retries them slowly (someone may fix the
# bucket or the Secret), but a drain does not wait for them.
PERMANENT = (StorageAccessDenied, NotFound, StorageRejected, ManifestError)


@dataclass(frozen=True)
class SyncSettings:
    """The sidecar's settings (``trainingrun sync`` reads them from its environment)."""

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
    # The fence this attempt holds (the operator takes it before the pod exists); None: take
    # one at start, for a sync run by hand.
    epoch: int | None = None
    attempt: int = 0
    rank: int = 0
    ranks: int = 1
    # The checkpoint layout (trainingrun.checkpoint.layouts): auto, a format's name, or pattern.
    format: str = layouts.AUTO
    pattern: layouts.Pattern | None = None
    # Nothing but access denied this long: exit for a restart that reads the credentials again.
    access_denied_seconds: float = 300.0
    progress_seconds: float = 60.0  # how often at most rank 0 publishes the trainer's progress
    termination_log: Path | None = Path("/dev/termination-log")


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
        self.unrecognised = Gauge(
            "trainingrun_sync_unrecognised_files",
            "Files in the checkpoint folder that match no checkpoint format (never uploaded).",
            registry=r,
        )
        self.fenced = Gauge(
            "trainingrun_sync_fenced",
            "1 once a newer attempt holds the run's fence and this sidecar stopped uploading.",
            registry=r,
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


def watch(checkpoint_dir: Path, wake: threading.Event) -> Any:
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


class NoticeRelay:
    """Turns a preemption notice in the pod's annotations (downward API file) into a "save now"
    request to the trainer integration, once."""

    def __init__(self, podinfo_dir: Path | None, checkpoint_dir: Path, metrics: Metrics) -> None:
        self.podinfo_dir = podinfo_dir
        self.checkpoint_dir = checkpoint_dir
        self.metrics = metrics
        self.sent = False

    def check(self) -> None:
        if self.sent or self.podinfo_dir is None:
            return
        notice = read_annotation(self.podinfo_dir / "annotations", ANNOTATION_NOTICE)
        if not notice:
            return
        log.info("preemption notice (%s): asking the trainer to save now", notice)
        self.sent = True  # once: a request that cannot be written is not retried
        try:
            local.request_save(self.checkpoint_dir, f"preemption notice: {notice}")
        except OSError as e:
            self.metrics.failures.labels("SaveRequestFailed").inc()
            log.error(
                "cannot ask the trainer to save (%s): it saves at SIGTERM instead; run the "
                "pod's containers as one user (pod securityContext.runAsUser) so the sidecar "
                "can write to %s",
                e,
                self.checkpoint_dir / local.CONTROL_DIR,
            )


def publish_progress(checkpoint_dir: Path, metrics: Metrics) -> None:
    """The trainer's step, from its progress file, as a metric."""
    progress = local.read_progress(checkpoint_dir)
    if progress:
        metrics.trainer_step.set(progress.step)


class LayoutReport:
    """Which checkpoint formats the folder holds, and which files match none."""

    def __init__(self, checkpoint_dir: Path, metrics: Metrics) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.metrics = metrics
        self.recognised: tuple[str, ...] = ()
        self.unrecognised: tuple[str, ...] = ()
        self.unreadable: tuple[str, ...] = ()

    def report(self, found: Survey) -> None:
        """Says which formats the folder's checkpoints are in, and which files match none, each
        time that changes: a trainer writing a layout nobody reads is not silently
        unprotected."""
        if found.formats and found.formats != self.recognised:
            log.info("checkpoint format recognised: %s", ", ".join(found.formats))
            self.recognised = found.formats
        if found.unrecognised != self.unrecognised:
            self.unrecognised = found.unrecognised
            self.metrics.unrecognised.set(len(found.unrecognised))
            if found.unrecognised:
                shown = ", ".join(found.unrecognised[:5])
                more = len(found.unrecognised) - 5
                log.warning(
                    "%d files in %s match no checkpoint format (%s%s) and are not uploaded; set "
                    "spec.checkpoint.format, or spec.checkpoint.pattern for a layout of your own "
                    "(docs/checkpoints.md, formats)",
                    len(found.unrecognised),
                    self.checkpoint_dir,
                    shown,
                    f", and {more} more" if more > 0 else "",
                )
        if found.unreadable != self.unreadable:
            self.unreadable = found.unreadable
            if found.unreadable:
                log.warning(
                    "cannot list %s in %s (permission denied for uid %d): its checkpoints are "
                    "not seen nor uploaded; name the trainer's user in the template "
                    "(securityContext.runAsUser) and the operator runs the sync sidecar as the "
                    "same user, or have the trainer leave its folders readable to others",
                    ", ".join(found.unreadable[:5]),
                    self.checkpoint_dir,
                    os.getuid(),
                )


def describe(ckpt: LocalCheckpoint) -> str:
    """How logs name a checkpoint: its step, and what the trainer wrote when that is not the
    HF Trainer's ``checkpoint-<step>``."""
    name = ckpt.found.name
    return f"checkpoint-{ckpt.step}" + ("" if ckpt.found.format == "hf" else f" ({name})")


def layout_of(ckpt: LocalCheckpoint) -> Layout | None:
    """The layout its part records; none for the HF Trainer's ``checkpoint-<step>/`` (what
    earlier releases wrote, and read)."""
    f = ckpt.found
    if f.format == "hf":
        return None
    return Layout(format=f.format, base=f.base, resume=f.resume, extras=dict(f.extras))


class AccessDeniedWatch:
    """How long the sidecar has seen nothing but access denied. Its credentials are environment
    variables fixed when it started: once a Secret is rotated, or a key revoked, only a restart
    reads them again, so after ``limit`` seconds of nothing else the sidecar exits and lets the
    kubelet restart it (a native sidecar is restarted whatever its exit code)."""

    def __init__(self, limit: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self.since: float | None = None

    def clear(self) -> None:
        """Anything but access denied: a pass that worked, or another failure."""
        self.since = None

    def expired(self, error: BaseException) -> bool:
        """Notes one failure; True once access denied has lasted ``limit`` seconds."""
        if not isinstance(error, StorageAccessDenied):
            self.clear()
            return False
        now = self.clock()
        if self.since is None:
            self.since = now
        return now - self.since >= self.limit

    def give_up(self, error: BaseException, termination_log: Path | None) -> None:
        """Says so where the operator sees it: the log and the termination message."""
        message = (
            f"{ACCESS_DENIED_MESSAGE} for {self.limit:.0f} s ({error}); exiting so that the "
            "sidecar restarts with the credentials Secret read again"
        )
        log.error("%s", message)
        local.write_termination_message(termination_log, message)


def report_failure(e: BaseException, metrics: Metrics) -> None:
    """One failed pass: counted by reason and logged, saying when waiting will not help."""
    # Every manifest problem under one reason (too large, too new, malformed): the metric's
    # label set stays the documented one, which alerts select on.
    reason = "ManifestError" if isinstance(e, ManifestError) else type(e).__name__
    metrics.failures.labels(reason).inc()
    hint = " (will not fix itself: see the message)" if isinstance(e, PERMANENT) else ""
    if isinstance(e, PermissionError):
        hint = (
            f" (the sidecar runs as uid {os.getuid()} and the trainer keeps this file private: "
            "name the trainer's user in the template, securityContext.runAsUser, and the "
            "operator runs its containers as that user; docs/troubleshooting.md)"
        )
    log.error("sync: %s: %s%s; retrying", reason, log_text(e), hint)


def log_uploaded(
    what: str, files: int, size: int, elapsed: float, algo: str, drain_seconds: float
) -> None:
    """The log line of a part uploaded and verified, and a warning when it took longer than
    the sidecar has after SIGTERM: a save on preemption of this size would be lost."""
    rate = format_bytes(size / max(elapsed, 1e-6))
    log.info(
        "%s: uploaded and verified %d files, %s in %.1f s (%s/s), %s",
        what,
        files,
        format_bytes(size),
        elapsed,
        rate,
        algo,
    )
    if elapsed > drain_seconds:
        log.warning(
            "%s: its upload took %.0f s, longer than the %.0f s this sidecar has after SIGTERM: "
            "a save on preemption would not be committed; raise "
            "spec.preemption.terminationGracePeriodSeconds or save less per checkpoint",
            what,
            elapsed,
            drain_seconds,
        )


def protect_bodies(store: Store, checked: bool) -> None:
    """An endpoint that ignores the checksums request bodies carry (``checked`` False: the
    capability probe's finding) gets them signed instead, so a body damaged on the way is still
    refused where the endpoint checks signed bodies (AWS S3 does; SeaweedFS 4.48 does not,
    docs/storage-s3.md)."""
    if checked:
        return
    store.sign_bodies()
    log.info(
        "the endpoint does not check checksums: each upload's signature covers its body "
        "instead (a SHA-256 of every byte sent)"
    )


def check_conditions(if_none_match: bool, if_match: bool, termination_log: Path | None) -> None:
    """What the probe found of the endpoint's conditional writes (``commit.Capabilities``):
    none honoured, a warning: the commits write and read back, the documented fallback. If-None-
    Match honoured but not If-Match: the commits would trust a compare-and-swap that is not one,
    so IfMatchIgnored, said in the log and the termination message."""
    if not if_none_match:
        log.warning(
            "the endpoint ignores If-None-Match/If-Match: commits fall back to write-then-"
            "read-back; two writers racing between the write and the read can both win, and "
            "a fence taken meanwhile can be lost (docs/checkpoints.md, guarantees)"
        )
        return
    if if_match:
        return
    message = (
        f"{IF_MATCH_IGNORED_MESSAGE} (it honours If-None-Match), so a commit could replace the "
        "fence of a newer attempt unseen; this sidecar commits nothing and exits. Use an "
        "endpoint that honours If-Match on uploads "
        "(docs/storage.md#conditional-writes-and-the-manifest)"
    )
    log.error("%s", message)
    local.write_termination_message(termination_log, message)
    raise IfMatchIgnored(message)
