"""The progress record: what the sync sidecar of rank 0 publishes into the run's prefix
(``<run>/progress.json``) for the operator to show, and its bounded decoding.

The record is display only: no decision reads it. It is written by the pod, so whoever can
write to the bucket can write anything there; ``decode`` takes at most ``MAX_BYTES``, refuses a
record that is not one, and clamps or drops figures out of range (a step of 10^18, a NaN or
negative rate), so a hostile record changes nothing but that run's display. This module is
pure and imports nothing of the package.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

PROGRESS_RECORD = "progress.json"
# The sidecar's last word, also put here: the next attempt's sidecar replaces progress.json as
# soon as its trainer reports, and the operator may read the last word after that.
LAST_WORD_RECORD = "progress-last.json"
VERSION = 1
# The sidecar writes ~250 bytes; anything over this is not its record and is not decoded.
MAX_BYTES = 4096
# Steps no training run reaches (10^12 steps of 1 ms: 30 years); larger ones are refused.
MAX_STEP = 10**12
# Samples or tokens per second beyond any hardware: dropped, not shown.
MAX_RATE = 1e12
# Seconds no attempt lasts (30 years): a save time beyond is dropped.
MAX_SECONDS = 1e9


class ProgressError(ValueError):
    """A progress record that cannot be shown; the message says why, never what it held."""


@dataclass(frozen=True)
class ProgressRecord:
    """The trainer's progress as the sidecar saw it. Times are the sidecar's clock (Unix
    seconds), so rates from two of them need no clock shared with the operator."""

    step: int
    attempt: int
    # The first step this attempt's sidecar saw, and when: a rate measured from there counts
    # only this attempt's steps, so a resume does not inflate or collapse it.
    first_step: int
    first_seen: float
    observed: float
    total_steps: int | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    # Seconds the trainer stood still in saves since its process began (its integration's).
    save_seconds: float | None = None
    # The sidecar's last word: published once its trainer stopped and its work was done.
    final: bool = False
    version: int = VERSION


def encode(record: ProgressRecord) -> bytes:
    """The record as the sidecar writes it."""
    return json.dumps(asdict(record), sort_keys=True).encode()


def decode(data: bytes) -> ProgressRecord:
    """The record in ``data``, within its caps. Raises ProgressError."""
    if len(data) > MAX_BYTES:
        raise ProgressError(f"the progress record is over {MAX_BYTES} bytes")
    try:
        raw = json.loads(data)
    # ValueError also covers integers past Python's digit limit; RecursionError, deep nesting.
    except (ValueError, RecursionError) as e:
        raise ProgressError("the progress record is not valid JSON") from e
    if not isinstance(raw, dict):
        raise ProgressError("the progress record is not a JSON object")
    version = _int(raw, "version", 1, 1 << 20)
    if version > VERSION:
        raise ProgressError(f"the progress record has version {version}, newer than {VERSION}")
    first_seen = _time(raw, "first_seen")
    observed = _time(raw, "observed")
    if observed < first_seen:
        raise ProgressError("the progress record was observed before its first step was seen")
    step = _int(raw, "step", 0, MAX_STEP)
    total = _optional_int(raw, "total_steps", 1, MAX_STEP)
    return ProgressRecord(
        step=step,
        attempt=_int(raw, "attempt", 0, 1 << 31),
        first_step=min(_int(raw, "first_step", 0, MAX_STEP), step),
        first_seen=first_seen,
        observed=observed,
        total_steps=total,
        samples_per_second=rate(raw.get("samples_per_second")),
        tokens_per_second=rate(raw.get("tokens_per_second")),
        save_seconds=seconds(raw.get("save_seconds")),
        final=raw.get("final") is True,
    )


def rate(value: Any) -> float | None:
    """A rate as shown: a finite number in (0, MAX_RATE], else none."""
    found = _finite(value)
    return found if found is not None and 0 < found <= MAX_RATE else None


def seconds(value: Any) -> float | None:
    """Seconds as shown: a finite number in [0, MAX_SECONDS], else none."""
    found = _finite(value)
    return found if found is not None and 0 <= found <= MAX_SECONDS else None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int past float's range
        return None
    return value if math.isfinite(value) else None


def _int(raw: dict[str, Any], name: str, low: int, high: int) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProgressError(f"the progress record's {name} is not a whole number in range")
    return value


def _optional_int(raw: dict[str, Any], name: str, low: int, high: int) -> int | None:
    return None if raw.get(name) is None else _int(raw, name, low, high)


def _time(raw: dict[str, Any], name: str) -> float:
    """Unix seconds between 2000 and 2200."""
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProgressError(f"the progress record's {name} is not a time")
    try:
        value = float(value)
    except OverflowError:
        raise ProgressError(f"the progress record's {name} is not a time") from None
    if not 946684800.0 <= value <= 7258118400.0:  # NaN fails too
        raise ProgressError(f"the progress record's {name} is not a time")
    return value
