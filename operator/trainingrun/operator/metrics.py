"""The operator's Prometheus metrics (served by ``trainingrun operator --metrics-port``).

Transitions are counted by the reason of the Event each one posts (Started, Resumed, Preempted,
Failed, CheckpointBad, Succeeded, the budget and permanent reasons), so a dashboard and
``kubectl get events`` speak the same words. Runs by phase and lingering old pods are read from
the operator's cache and memory at scrape time.

Per-run metrics (``RunCollector``) are read at scrape time from the runs the operator's cache
holds: their status (progress, latest checkpoint, restarts, preemptions, the goodput ledger) and
their restart budget, labelled by namespace and run only (plus a small fixed enum for a few), so
a pass writes nothing for them. ``LeaderFlag`` says whether this replica leads: it is made
before the election, so a standby's scrape answers 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainingrun.api import RestartPolicySpec
from trainingrun.decide import reasons as R
from trainingrun.decide import status as S

PHASES = ("Pending", "Running", "Backoff", "Succeeded", "Failed")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = self.registry = registry
        self.transitions = Counter(
            "trainingrun_transitions",
            "Run transitions, by the reason of the Event posted for each.",
            ["reason"],
            registry=r,
        )
        self.pods_created = Counter(
            "trainingrun_pods_created", "Attempt pods the operator created.", registry=r
        )
        self.pass_seconds = Histogram(
            "trainingrun_reconcile_seconds",
            "Duration of one reconcile pass of one run.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.pass_errors = Counter(
            "trainingrun_reconcile_errors",
            "Reconcile passes that raised (retried after the resync interval).",
            registry=r,
        )
        self.events_dropped = Counter(
            "trainingrun_events_dropped",
            "Events not posted because the API server did not keep up.",
            registry=r,
        )
        self.runs = Gauge(
            "trainingrun_runs", "TrainingRuns the operator knows, by phase.", ["phase"], registry=r
        )
        self.old_pod_deletes = Counter(
            "trainingrun_old_pod_deletes",
            "DELETEs of pods of older attempts, by result: accepted, gone (already), or failed "
            "(the API server refused or did not answer; retried at a later pass).",
            ["result"],
            registry=r,
        )
        self.api_calls = Counter(
            "trainingrun_api_calls",
            "Calls to the Kubernetes API server (the operator's own; not its watches), by verb "
            "and the API path's template.",
            ["verb", "resource"],
            registry=r,
        )
        self.bucket_calls = Counter(
            "trainingrun_bucket_calls",
            "Calls of the operator to the runs' buckets, by the store operation (get, put, "
            "head, list_objects, ...).",
            ["operation"],
            registry=r,
        )
        self.old_pods_lingering = Gauge(
            "trainingrun_old_pods_lingering",
            "Pods of older attempts that do not go: still there after a grace-0 DELETE, or every "
            "DELETE refused (an OldPodLingers Event each).",
            registry=r,
        )

    def count_runs_with(self, phases: Callable[[], Iterable[str]]) -> None:
        """Makes the runs gauge read ``phases()`` (one phase per known run) at scrape time."""

        def counter(phase: str) -> Callable[[], float]:
            return lambda: float(sum(1 for p in phases() if p == phase))

        for phase in PHASES:
            self.runs.labels(phase=phase).set_function(counter(phase))

    def export_runs_with(
        self,
        runs: Callable[[], Iterable[Mapping[str, Any]]],
        keep_finished_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Exports the per-run metrics of ``runs()`` (the cached runs) at scrape time; a run that
        ended stays ``keep_finished_seconds`` after it ended (0: only unfinished runs)."""
        self.registry.register(RunCollector(runs, keep_finished_seconds, clock))

    def count_api_call(self, verb: str, resource: str) -> None:
        self.api_calls.labels(verb=verb, resource=resource).inc()

    def count_bucket_call(self, operation: str) -> None:
        self.bucket_calls.labels(operation=operation).inc()

    def count_lingering_with(self, lingering: Callable[[], int]) -> None:
        """Makes the lingering old pods gauge read ``lingering()`` at scrape time."""
        self.old_pods_lingering.set_function(lambda: float(lingering()))


class LeaderFlag:
    """``trainingrun_operator_leader``: 0 while this replica waits for the Lease, 1 once it leads
    (or from the start without leader election). A leader that loses the Lease exits, so the
    flag never goes back to 0 in one process."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.gauge = Gauge(
            "trainingrun_operator_leader",
            "1 on the operator replica that leads (holds the Lease) and acts, 0 on a standby.",
            registry=registry,
        )

    def leading(self) -> None:
        self.gauge.set(1)


# -- per-run metrics ---------------------------------------------------------------------------

RUN_LABELS = ("namespace", "run")
# status.goodput's seconds by kind (trainingrun_run_seconds_total{kind}); wall time apart, as
# it is their sum and more (a label's values should not add up to one of them).
GOODPUT_SECONDS = {
    "productive": "productiveSeconds",
    "lost": "lostSeconds",
    "startup": "startupSeconds",
    "waiting": "waitingSeconds",
    "stall": "stallSeconds",
}
# status.goodput.stepsLost by cause (trainingrun_run_steps_lost_total{preemption}).
STEPS_LOST = {
    "eviction": "eviction",
    "notice": "notice",
    "node_lost": "nodeLost",
    "sigkill": "sigkill",
    "other": "other",
}
KNOWN_PHASES = frozenset(
    {
        S.PHASE_PENDING,
        S.PHASE_RUNNING,
        S.PHASE_BACKOFF,
        S.PHASE_SUCCEEDED,
        S.PHASE_FAILED,
        S.PHASE_SUSPENDING,
        S.PHASE_SUSPENDED,
        S.PHASE_QUEUED,
    }
)
UNKNOWN_PHASE = "Unknown"  # a phase this release does not write: one label value for all


@dataclass(frozen=True)
class RunFamily:
    """One per-run metric: its name as exposed (a counter's without ``_total``), its type, help,
    and the labels it has besides namespace and run."""

    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()


RUN_FAMILIES = (
    RunFamily("trainingrun_run_info", "gauge", "1 for each run exported, by phase.", ("phase",)),
    RunFamily("trainingrun_run_progress_step", "gauge", "The trainer's step (status.progress)."),
    RunFamily(
        "trainingrun_run_progress_total_steps",
        "gauge",
        "Steps the trainer will run, when its framework knows.",
    ),
    RunFamily("trainingrun_run_progress_ratio", "gauge", "step / totalSteps, 0 to 1."),
    RunFamily(
        "trainingrun_run_progress_steps_per_second",
        "gauge",
        "Steps per second since the current attempt's first step.",
    ),
    RunFamily(
        "trainingrun_run_eta_seconds",
        "gauge",
        "Seconds left at the scrape: the status ETA less the time since progress was observed.",
    ),
    RunFamily(
        "trainingrun_run_attempt_start_timestamp_seconds",
        "gauge",
        "When the current attempt started (the Running condition turned True); absent while "
        "no attempt runs.",
    ),
    RunFamily(
        "trainingrun_run_last_commit_timestamp_seconds",
        "gauge",
        "When the newest committed checkpoint was committed (Unix seconds).",
    ),
    RunFamily("trainingrun_run_checkpoint_step", "gauge", "Step of the newest commit."),
    RunFamily("trainingrun_run_restarts", "counter", "Failed attempts so far (status.restarts)."),
    RunFamily(
        "trainingrun_run_restart_budget",
        "gauge",
        "Failed attempts tolerated before the run fails (spec.restartPolicy.maxRestarts).",
    ),
    RunFamily(
        "trainingrun_run_preemptions", "counter", "Preempted attempts so far (status.preemptions)."
    ),
    RunFamily(
        "trainingrun_run_goodput_ratio",
        "gauge",
        "Productive training time / wall time since the run was created, 0 to 1.",
    ),
    RunFamily(
        "trainingrun_run_wall_seconds",
        "counter",
        "Wall time since the run was created, as the goodput ledger last counted it.",
    ),
    RunFamily(
        "trainingrun_run_seconds",
        "counter",
        "The run's wall time by what it went to: productive, lost (trained past the last commit "
        "of an attempt that ended), startup, waiting (no pod), stall (an attempt's final save "
        "and upload after its last step).",
        ("kind",),
    ),
    RunFamily(
        "trainingrun_run_steps_lost",
        "counter",
        "Steps trained after the last commit of attempts that ended, by the ending's cause.",
        ("preemption",),
    ),
)


def _number(value: Any) -> float | None:
    """A finite number of a status field, else None (absent, null, text, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _timestamp(value: Any) -> float | None:
    """Unix seconds of an RFC 3339 time in the status, else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo else None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _condition_time(status: Mapping[str, Any], ctype: str) -> tuple[bool, float | None]:
    """(True, lastTransitionTime) when the condition ``ctype`` is True, else (False, None)."""
    conditions = status.get("conditions")
    for entry in conditions if isinstance(conditions, list) else ():
        cond = _map(entry)
        if cond.get("type") == ctype and cond.get("status") == "True":
            return True, _timestamp(cond.get("lastTransitionTime"))
    return False, None


def finished_at(status: Mapping[str, Any]) -> tuple[bool, float | None]:
    """(finished, when): a run ends when its Succeeded or Failed condition turns True."""
    for ctype in (R.SUCCEEDED, R.FAILED):
        true, when = _condition_time(status, ctype)
        if true:
            return True, when
    return False, None


def exported(run: Mapping[str, Any], now: float, keep_finished_seconds: float) -> bool:
    """Whether the run's metrics are exported: while it has not ended, and for
    ``keep_finished_seconds`` after it ended (a finished run with no end time: not)."""
    finished, when = finished_at(_map(run.get("status")))
    if not finished:
        return True
    return when is not None and now - when < keep_finished_seconds


def run_samples(run: Mapping[str, Any], now: float) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """The run's samples as (family name, values of its labels besides namespace and run,
    value), from whatever of its status is there: an absent or malformed field yields none."""
    status, spec = _map(run.get("status")), _map(run.get("spec"))
    phase = str(status.get("phase") or S.PHASE_PENDING)
    yield "trainingrun_run_info", (phase if phase in KNOWN_PHASES else UNKNOWN_PHASE,), 1.0

    progress = _map(status.get("progress"))
    step, total = _number(progress.get("step")), _number(progress.get("totalSteps"))
    figures: list[tuple[str, float | None]] = [
        ("trainingrun_run_progress_step", step),
        ("trainingrun_run_progress_total_steps", total),
    ]
    percent = _number(progress.get("percent"))
    if percent is None and step is not None and total:
        percent = 100.0 * min(step, total) / total
    figures.append(("trainingrun_run_progress_ratio", None if percent is None else percent / 100))
    figures.append(
        ("trainingrun_run_progress_steps_per_second", _number(progress.get("stepsPerSecond")))
    )
    eta, observed = _number(progress.get("etaSeconds")), _timestamp(progress.get("observedAt"))
    if eta is not None and observed is not None:
        eta = max(0.0, eta - max(0.0, now - observed))
    figures.append(("trainingrun_run_eta_seconds", eta))

    _, started = _condition_time(status, R.RUNNING)
    figures.append(("trainingrun_run_attempt_start_timestamp_seconds", started))
    latest = _map(status.get("latestCheckpoint"))
    committed = _timestamp(latest.get("time"))
    figures.append(("trainingrun_run_last_commit_timestamp_seconds", committed))
    figures.append(("trainingrun_run_checkpoint_step", _number(latest.get("step"))))

    figures.append(("trainingrun_run_restarts", _number(status.get("restarts", 0))))
    policy = _map(spec.get("restartPolicy"))
    budget = _number(policy.get("maxRestarts", RestartPolicySpec().max_restarts))
    figures.append(("trainingrun_run_restart_budget", budget))
    figures.append(("trainingrun_run_preemptions", _number(status.get("preemptions", 0))))

    goodput = _map(status.get("goodput"))
    ratio, percent = _number(goodput.get("ratio")), _number(goodput.get("percent"))
    if ratio is None and percent is not None:
        ratio = percent / 100
    figures.append(("trainingrun_run_goodput_ratio", ratio))
    figures.append(("trainingrun_run_wall_seconds", _number(goodput.get("wallSeconds"))))
    for name, value in figures:
        if value is not None:
            yield name, (), value
    for kind, field in GOODPUT_SECONDS.items():
        value = _number(goodput.get(field))
        if value is not None:
            yield "trainingrun_run_seconds", (kind,), value
    lost = _map(goodput.get("stepsLost"))
    for cause, field in STEPS_LOST.items():
        value = _number(lost.get(field))
        if value is not None:
            yield "trainingrun_run_steps_lost", (cause,), value


def _empty_family(family: RunFamily) -> CounterMetricFamily | GaugeMetricFamily:
    labels = [*RUN_LABELS, *family.labels]
    if family.type == "counter":
        return CounterMetricFamily(family.name, family.help, labels=labels)
    return GaugeMetricFamily(family.name, family.help, labels=labels)


class RunCollector(Collector):
    """The per-run metrics, built at scrape time from ``runs()`` (the operator's cached runs,
    read without the API): nothing is kept or updated between scrapes."""

    def __init__(
        self,
        runs: Callable[[], Iterable[Mapping[str, Any]]],
        keep_finished_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._runs, self._keep, self._clock = runs, keep_finished_seconds, clock

    def describe(self) -> Iterable[Metric]:
        """The families without samples: the registry learns the names without a scrape."""
        return [_empty_family(f) for f in RUN_FAMILIES]

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        families = {f.name: _empty_family(f) for f in RUN_FAMILIES}
        for run in self._runs():
            if not exported(run, now, self._keep):
                continue
            meta = _map(run.get("metadata"))
            where = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            for name, labels, value in run_samples(run, now):
                families[name].add_metric([*where, *labels], value)
        return families.values()
