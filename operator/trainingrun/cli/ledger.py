"""The goodput ledger as ``trainingrun status`` prints it: one line of where the run's time went,
and a timeline of its attempts, with times counted from the run's creation so a person reads it
at a glance."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainingrun.contract import parse_time
from trainingrun.decide.progress import duration

PARTS = (
    ("productiveSeconds", "productive"),
    ("lostSeconds", "lost"),
    ("startupSeconds", "start-up"),
    ("waitingSeconds", "waiting"),
    ("stallSeconds", "checkpoint stall"),
)
KINDS = (
    ("eviction", "eviction"),
    ("notice", "notice"),
    ("nodeLost", "node lost"),
    ("sigkill", "SIGKILL"),
    ("other", "other"),
)
HEADERS = ["  #", "STARTED", "FIRST STEP", "LAST STEP", "COMMITTED", "ENDED", "ENDING", "LOST"]


def goodput_line(ledger: dict[str, Any]) -> str:
    """``83% of 12m5s: productive 10m1s, lost 40s, ...; steps lost: eviction 11``."""
    if not ledger:
        return ""
    wall = float(ledger.get("wallSeconds") or 0)
    head = f"{ledger.get('summary') or '-'} of {duration(wall)}"
    parts = [f"{name} {duration(float(ledger.get(key) or 0))}" for key, name in PARTS]
    lost = ledger.get("stepsLost") or {}
    steps = [f"{name} {lost[key]}" for key, name in KINDS if lost.get(key)]
    text = f"{head}: " + ", ".join(parts)
    text += "; steps lost: " + (", ".join(steps) if steps else "none")
    return text + f" (at {ledger.get('observedAt', '')})"


def attempt_rows(attempts: list[dict[str, Any]], created: str | None) -> list[list[str]]:
    """One row per attempt: when its pod was created, its first and last step and when, the
    newest commit at its end, when and why it ended, the steps it lost."""
    start = parse_time(created)
    rows = []
    for a in attempts:
        first = _step(a.get("firstStep"), a.get("firstStepTime"), start)
        last = _step(a.get("lastStep"), a.get("lastStepTime"), start)
        ending = a.get("ending") or ("running" if not a.get("ended") else "")
        if a.get("kind"):
            ending += f" ({a['kind']})"
        committed = a.get("committedStep")
        rows.append(
            [
                f"  {a.get('attempt', '')}",
                _since(a.get("created"), start),
                first,
                last,
                "" if committed is None else str(committed),
                _since(a.get("ended"), start),
                ending,
                "" if a.get("stepsLost") is None else str(a["stepsLost"]),
            ]
        )
    return rows


def _step(step: Any, at: str | None, start: datetime | None) -> str:
    if step is None:
        return "-"
    return f"{step} at {_since(at, start)}"


def _since(at: str | None, start: datetime | None) -> str:
    """A time as ``+1m15s`` after the run's creation (the time itself when that is unknown)."""
    t = parse_time(at)
    if t is None:
        return "-"
    if start is None:
        return at or "-"
    return "+" + duration(max(0.0, (t - start).total_seconds()))
