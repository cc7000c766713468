"""The sidecar's publishing of the trainer's progress: the trainer integration's progress file
(``.trainingrun/progress.json``) read, and put into the run's prefix as the progress record
(``trainingrun.checkpoint.progress``) that the operator shows in ``status.progress``.

Rank 0 only, at most once per ``interval`` and only when the step changed, by a plain PUT (a PUT
replaces an object whole: a reader sees the old record or the new). Its own thread: a put that
waits out a slow endpoint never holds a checkpoint's upload, and a failed put only leaves the
display behind. The pod writes nothing it could not write before (the run's prefix) and gets no
Kubernetes credentials; the operator reads the record when it refreshes the run's manifest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainingrun.checkpoint import local
from trainingrun.checkpoint.progress import (
    LAST_WORD_RECORD,
    MAX_STEP,
    PROGRESS_RECORD,
    ProgressError,
    ProgressRecord,
    decode,
    encode,
    rate,
    seconds,
)
from trainingrun.storage.opener import Location, StorageError, Store, log_text

log = logging.getLogger("trainingrun.agent.sync")

# How often at most the record is put: the status shows it at most once a minute anyway.
PUBLISH_SECONDS = 60.0


# A progress file's time older than this is not the trainer's step (a clock set back, a file
# left from before): the time it was read stands for it.
REACHED_AT_MAX_AGE = 3600.0


def reached_at(progress: local.Progress, now: float) -> float:
    """When the trainer reached ``progress``'s step: its file's time when it is plausible (the
    trainer writes the file at every step end), else ``now``. A record published after the
    trainer stopped (the last word) so says when its last step was made, not when it was read."""
    at = progress.written_at
    return at if at is not None and now - REACHED_AT_MAX_AGE <= at <= now else now


class ProgressPublisher:
    """Puts the progress record of this pod's trainer (see the module doc)."""

    def __init__(
        self,
        store: Store,
        run: Location,
        attempt: int,
        interval: float = PUBLISH_SECONDS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.key = run.key(PROGRESS_RECORD)
        self.last_key = run.key(LAST_WORD_RECORD)
        self.attempt = attempt
        self.interval = interval
        self.clock = clock
        self.monotonic = monotonic
        self.first: tuple[int, float] | None = None  # the first step seen, and when
        self.published: tuple[int, float | None] | None = None  # the step, save time last put
        self.last_try: float | None = None
        self.failing = False
        self.last_word = False  # the next record is the last word (its ``final``)

    def check(self, progress: local.Progress | None) -> bool:
        """Notes ``progress`` (the trainer's file as just read) and puts the record when due;
        True when it put one."""
        if progress is None or not 0 <= progress.step <= MAX_STEP:
            return False
        now = self.clock()
        at = reached_at(progress, now)
        if self.first is None:
            self.first = self.published_first(progress.step) or (progress.step, at)
        # A step going back (the trainer restarted in the pod from an older checkpoint) starts
        # the measure again.
        if progress.step < self.first[0]:
            self.first = (progress.step, at)
        if (progress.step, progress.save_seconds) == self.published:
            return False
        tried = self.last_try
        if tried is not None and self.monotonic() - tried < self.interval:
            return False
        self.last_try = self.monotonic()
        return self.put(self.record(progress, max(at, self.first[1])))

    def final(self, progress: local.Progress | None) -> bool:
        """The last word, at the sidecar's end (the trainer has exited): the record put whatever
        the interval, so the operator reads the trainer's last step when the attempt ends (the
        goodput ledger's steps lost). True when it put one."""
        self.last_try = None
        self.last_word = True
        self.published = None  # said once more, as the last word, even when nothing changed
        return self.check(progress)

    def published_first(self, step: int) -> tuple[int, float] | None:
        """The first step of this attempt and when it was seen, from the record a sidecar of
        this attempt published before (this one restarted: the kubelet restarts a native
        sidecar that exits), so the rate still counts from the attempt's start. One bounded
        read, once; None when there is none of this attempt, or it cannot be read."""
        try:
            data = self.store.get(self.key)
            record = decode(data) if data is not None else None
        except (StorageError, ProgressError):
            return None
        if record is None or record.attempt != self.attempt or record.first_step > step:
            return None
        return record.first_step, record.first_seen

    def record(self, progress: local.Progress, now: float) -> ProgressRecord:
        assert self.first is not None
        total = progress.max_steps
        return ProgressRecord(
            step=progress.step,
            attempt=self.attempt,
            first_step=self.first[0],
            first_seen=self.first[1],
            observed=now,
            total_steps=total if total is not None and 1 <= total <= MAX_STEP else None,
            samples_per_second=rate(progress.samples_per_second),
            tokens_per_second=rate(progress.tokens_per_second),
            save_seconds=seconds(progress.save_seconds),
            final=self.last_word,
        )

    def put(self, record: ProgressRecord) -> bool:
        try:
            self.store.put(self.key, encode(record))
            if record.final:  # kept apart: the next attempt's records replace progress.json
                self.store.put(self.last_key, encode(record))
        except StorageError as e:
            if not self.failing:  # once per outage: the display is all it costs
                log.warning("cannot publish the trainer's progress: %s", log_text(e))
            self.failing = True
            return False
        if self.failing:
            log.info("publishing the trainer's progress again")
        self.failing = False
        self.published = (record.step, record.save_seconds)
        return True


def start_publishing(
    publisher: ProgressPublisher,
    checkpoint_dir: Path,
    stopping: threading.Event,
    active: Callable[[], bool] = lambda: True,
    poll_seconds: float = 5.0,
) -> threading.Thread:
    """The publishing thread: reads the progress file every ``poll_seconds`` and publishes it
    while ``active()`` (a sidecar fenced out by a newer attempt publishes no more), until
    ``stopping`` is set; then it says the last word."""

    def loop() -> None:
        while not stopping.wait(poll_seconds):
            if not active():
                continue
            try:
                publisher.check(local.read_progress(checkpoint_dir))
            except Exception:  # the display must never end the sidecar
                log.exception("publishing the trainer's progress failed")
        # Stopping: the kubelet stops a native sidecar once the trainer has exited, so its last
        # step is known now; said at once, before the drain's upload (and again after it).
        if active():
            publish_last(publisher, checkpoint_dir)

    thread = threading.Thread(target=loop, name="trainingrun-progress", daemon=True)
    thread.start()
    return thread


def publish_last(publisher: ProgressPublisher, checkpoint_dir: Path) -> None:
    """The trainer's last progress, put once the sidecar's work is done (``final``)."""
    try:
        publisher.final(local.read_progress(checkpoint_dir))
    except Exception:  # the display must never change the sidecar's exit
        log.exception("publishing the trainer's last progress failed")
