"""The operator's Prometheus metrics (served by ``trainingrun operator --metrics-port``).

Transitions are counted by the reason of the Event each one posts (Started, Resumed, Preempted,
Failed, CheckpointBad, Succeeded, the budget and permanent reasons), so a dashboard and
``kubectl get events`` speak the same words. Runs by phase and lingering old pods are read from
the operator's cache and memory at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("Pending", "Running", "Backoff", "Succeeded", "Failed")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
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

    def count_api_call(self, verb: str, resource: str) -> None:
        self.api_calls.labels(verb=verb, resource=resource).inc()

    def count_bucket_call(self, operation: str) -> None:
        self.bucket_calls.labels(operation=operation).inc()

    def count_lingering_with(self, lingering: Callable[[], int]) -> None:
        """Makes the lingering old pods gauge read ``lingering()`` at scrape time."""
        self.old_pods_lingering.set_function(lambda: float(lingering()))
