"""``status.progress`` from the progress record the sync sidecar of rank 0 published
(``trainingrun.checkpoint.progress``): the step, the percent done, the rate and the ETA.

Display only: no decision reads it. The rate counts the steps made since the current attempt's
first step that its sidecar saw, over the time since (both on the sidecar's clock): an ETA
from the global step over the time since the process started would collapse after a resume
(every step before it counted as made in no time), and one from the run's age would count the
time lost to preemptions as training.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainingrun.api import RunProgress, TrainingRunStatus
from trainingrun.checkpoint.progress import ProgressRecord
from trainingrun.contract import rfc3339
from trainingrun.decide.status import PHASE_RUNNING

# A rate from fewer seconds or steps than these is noise (the first steps compile, warm up).
MIN_RATE_SECONDS = 10.0
MIN_RATE_STEPS = 2
# An ETA beyond this is not one (a trainer reporting a step a year): none is shown.
MAX_ETA_SECONDS = 10 * 365 * 86400


def marked(
    status: TrainingRunStatus, record: ProgressRecord | None, now: datetime
) -> TrainingRunStatus:
    """``status`` with its progress from ``record`` when one was read this pass (else the one it
    shows), without a rate or ETA unless the run is Running. The operator reads a record at most
    once a minute per run, so progress alone changes the status at most that often, and not at
    all while the record stays the same (a stalled trainer, a sidecar that cannot publish)."""
    current = status.progress if record is None else shown(record, status.attempt, now)
    if record is not None and _same_record(status.progress, current):
        current = status.progress  # nothing new published: no write for the ETA's text alone
    if current is not None and status.phase != PHASE_RUNNING:
        current = without_eta(current)
    if current == status.progress:
        return status
    return status.model_copy(update={"progress": current})


def _same_record(before: RunProgress | None, after: RunProgress | None) -> bool:
    """Whether two figures come from the same record (the sidecar publishes on change only)."""
    if before is None or after is None:
        return False
    return (before.observed_at, before.attempt, before.step) == (
        after.observed_at,
        after.attempt,
        after.step,
    )


def shown(record: ProgressRecord, attempt: int, now: datetime) -> RunProgress:
    """What ``status.progress`` says of ``record`` for the run's current ``attempt`` at ``now``.
    A record of another attempt (the new one's trainer has not reported yet) shows its step
    and no rate or ETA: they were measured on a pod that is gone."""
    total = record.total_steps
    percent = None if total is None else round(min(100.0, 100.0 * record.step / total), 1)
    rate = steps_per_second(record) if record.attempt == attempt else None
    eta = eta_seconds(record.step, total, rate)
    observed = datetime.fromtimestamp(record.observed, UTC)
    completion = observed + timedelta(seconds=eta) if eta is not None else None
    left = None if completion is None else max(0.0, (completion - now).total_seconds())
    return RunProgress(
        step=record.step,
        total_steps=total,
        percent=percent,
        steps_per_second=None if rate is None else round(rate, 4),
        samples_per_second=_rounded(record.samples_per_second),
        tokens_per_second=_rounded(record.tokens_per_second),
        eta_seconds=eta,
        estimated_completion_time=rfc3339(completion) if completion is not None else None,
        eta=duration(left) if left is not None else None,
        summary=f"{percent:g}%" if percent is not None else f"step {record.step}",
        attempt=record.attempt,
        observed_at=rfc3339(observed),
    )


def steps_per_second(record: ProgressRecord) -> float | None:
    """Steps made per second since the attempt's first step seen; None before there is enough
    to tell (MIN_RATE_SECONDS, MIN_RATE_STEPS)."""
    steps = record.step - record.first_step
    seconds = record.observed - record.first_seen
    if steps < MIN_RATE_STEPS or seconds < MIN_RATE_SECONDS:
        return None
    return steps / seconds


def eta_seconds(step: int, total: int | None, rate: float | None) -> int | None:
    """Seconds to ``total`` at ``rate``: 0 once there, None when either is unknown or the
    answer is beyond MAX_ETA_SECONDS."""
    if total is None:
        return None
    if step >= total:
        return 0
    if not rate:
        return None
    eta = (total - step) / rate
    return round(eta) if eta <= MAX_ETA_SECONDS else None


def without_eta(progress: RunProgress) -> RunProgress:
    """The progress of a run whose attempt is not training (between attempts, held, ended):
    its step and percent stay, its rate and ETA go (nothing is running at that rate)."""
    return progress.model_copy(
        update={
            "steps_per_second": None,
            "eta_seconds": None,
            "estimated_completion_time": None,
            "eta": None,
        }
    )


def duration(seconds: float) -> str:
    """A time left for people, two units at most: 45s, 5m30s, 1h12m, 3d4h."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{s}s"
    return f"{s}s"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
