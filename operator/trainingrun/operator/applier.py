"""The apply step of a reconcile pass: the one room of a pass that writes to the Kubernetes API.

The pass gathers (reads only: the caches, the API server, the bucket), ``plan()`` decides, and
every write the pass then makes goes through an ``Applier``, in this order:

1. the run's status: a JSON merge patch, only when it changed, the cache given the run as
   written (one write per pass; a pass that ends pods and starts the next attempt writes the
   ending first, and the started attempt with its pods);
2. the Events that report it, handed to the Event sink after the write landed;
3. the annotations the plan asks for: a preemption notice handed on to the attempt's other
   pods (``decide.notices``), then the pods asked to save and stop for a hold;
4. the DELETEs of pods of older attempts and of those the plan ends
   (``trainingrun.operator.oldpods``);
5. the next attempt's headless Service and pods (``trainingrun.operator.launch``), and the
   status that records it started, with its Events;
6. the Kueue Workload: created when the run's is missing; released, finished or replaced as
   the pass left the run (``trainingrun.operator.queues``).

The rooms decide what to write (each from its pure ``decide`` module); only this one calls the
API client's writes, which a unit test holds for every pass the reconciler's tests run. Also the
storage policy's refusal, which fails a run before any call to the storage it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from trainingrun.api import TrainingRunStatus
from trainingrun.contract import ANNOTATION_NOTICE
from trainingrun.decide.naming import RunRef
from trainingrun.decide.observed import Plan
from trainingrun.decide.status import Event, fail
from trainingrun.decide.storagepolicy import refusal
from trainingrun.decide.waits import Wait
from trainingrun.operator.cache import ClusterView
from trainingrun.operator.events import EventSink
from trainingrun.operator.notices import PodAnnotator
from trainingrun.operator.oldpods import PodDeleter
from trainingrun.operator.queues import ObjectWriter
from trainingrun.operator.settings import OperatorSettings


class WriteApi(PodAnnotator, PodDeleter, ObjectWriter, Protocol):
    """The writes of ``trainingrun.operator.kube.Kube`` a pass makes, all through the applier:
    the rooms' own (annotations, pod deletes, Workloads), the status, and a launch's creates."""

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None: ...
    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...
    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...


class Applier:
    """Carries out a pass's writes (the module docstring gives their order). Errors of the API
    client reach the caller, which decides what a refusal means."""

    def __init__(self, api: WriteApi, view: ClusterView, events: EventSink) -> None:
        self.api, self.view, self.events = api, view, events

    def record(self, run: dict[str, Any], ref: RunRef, p: Plan) -> None:
        """The plan's status, then its Events, then the notice it hands on to the attempt's
        other pods, then the pods it asks to save and stop (steps 1 to 3)."""
        self.write(ref.namespace, ref.name, run.get("status") or {}, p.status)
        self.say(run, p.events)
        if p.notice is not None:
            for pod in p.notice.pods:
                self.annotate_pod(ref.namespace, pod, {ANNOTATION_NOTICE: p.notice.text})
        for pod in p.annotate:  # asked to save and stop for a hold (decide.hold)
            self.annotate_pod(ref.namespace, pod, dict(p.annotations))

    def say(self, run: dict[str, Any], events: list[Event]) -> None:
        """Events, to the sink, in order (after the status write they describe)."""
        for ev in events:
            self.events.post(run, ev.type, ev.reason, ev.message)

    def fail(
        self,
        run: dict[str, Any],
        status: TrainingRunStatus,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        """Ends the run as Failed with a reason that names the problem; never retried."""
        meta = run["metadata"]
        generation = int(meta.get("generation") or 0)
        new, event = fail(status, generation, reason, message, now)
        self.write(meta["namespace"], meta["name"], run.get("status") or {}, new)
        self.say(run, [event])

    def wait(self, run: dict[str, Any], status: TrainingRunStatus, held: Wait) -> float:
        """Records why the next attempt's start waits; returns when to try again."""
        meta = run["metadata"]
        before = status.model_dump(by_alias=True, mode="json")
        self.write(meta["namespace"], meta["name"], before, held.status)
        self.say(run, [held.event] if held.event is not None else [])
        return held.retry_after

    def write(
        self, namespace: str, name: str, before: Mapping[str, Any], after: TrainingRunStatus
    ) -> None:
        new = after.model_dump(by_alias=True, mode="json")
        old = TrainingRunStatus.model_validate(dict(before)).model_dump(by_alias=True, mode="json")
        if new == old:
            return
        # Merge patch: keys that became None are removed.
        updated = self.api.patch_run_status(namespace, name, new)
        if updated is not None:
            self.view.runs.put((namespace, name), updated)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.api.annotate_pod(namespace, name, annotations)

    def delete_pod_by_uid(
        self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None
    ) -> bool:
        return self.api.delete_pod_by_uid(namespace, name, uid, grace_seconds)

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return self.api.create_pod(pod)

    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return self.api.create_service(service)

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        return self.api.create_object(group, version, plural, body)

    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None:
        self.api.replace_object_status(group, version, plural, body)

    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str,
        uid: str | None = None,
    ) -> bool:
        return self.api.delete_object(group, version, plural, name, namespace, uid)


def storage_refused(
    writer: Applier,
    settings: OperatorSettings,
    run: dict[str, Any],
    status: TrainingRunStatus,
    ref: RunRef,
    now: datetime,
) -> bool:
    """Fails the run when it may not use the storage it names (decide.storagepolicy), before
    any call to that storage; True when it did."""
    storage = ref.spec.checkpoint.storage
    allowed = (settings.allowed_endpoints, settings.allowed_uris)
    refused = refusal(storage, ref.namespace, ref.name, *allowed)
    if refused is not None:
        writer.fail(run, status, refused.reason, refused.message, now)
    return refused is not None
