"""Writing a run's status: a JSON merge patch only when the status changed, the cache given the
run as written, and the Events that report the write handed over after it landed. Also the
storage policy's refusal, which fails a run before any call to the storage it names."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from trainingrun.api import TrainingRunStatus
from trainingrun.decide.naming import RunRef
from trainingrun.decide.status import fail
from trainingrun.decide.storagepolicy import refusal
from trainingrun.decide.waits import Wait
from trainingrun.operator.cache import ClusterView
from trainingrun.operator.events import EventSink
from trainingrun.operator.settings import OperatorSettings


class StatusApi(Protocol):
    """The call of ``trainingrun.operator.kube.Kube`` that writes a run's status."""

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None: ...


class StatusWriter:
    """Writes a run's status (a merge patch, only when it changed) and posts its Events."""

    def __init__(self, api: StatusApi, view: ClusterView, events: EventSink) -> None:
        self.api, self.view, self.events = api, view, events

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
        self.events.post(run, event.type, event.reason, event.message)

    def wait(self, run: dict[str, Any], status: TrainingRunStatus, held: Wait) -> float:
        """Records why the next attempt's start waits; returns when to try again."""
        meta = run["metadata"]
        before = status.model_dump(by_alias=True, mode="json")
        self.write(meta["namespace"], meta["name"], before, held.status)
        if held.event is not None:
            self.events.post(run, held.event.type, held.event.reason, held.event.message)
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


def storage_refused(
    writer: StatusWriter,
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
