"""The pods of a new attempt, all ranks in one pass, and a gang's headless Service before them.

A create that answers 409 means the pod exists: it is the run's own (made by an earlier pass
that stopped before the status write) or another's, which is waited for as ``PodNameTaken``,
its Event said again once a minute. A gang's Service is created once per run and remembered;
one of that name that is not the run's is waited for as ``ServiceNameTaken``, one the API
server refuses as ``ServiceForbidden``. The launcher returns why an attempt waits; the starter
writes it to the status and posts its Event after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainingrun.decide import reasons as R
from trainingrun.decide.naming import RunRef, owned_by
from trainingrun.decide.pod import build_service
from trainingrun.operator.cache import ClusterView
from trainingrun.operator.kube import Forbidden, Invalid
from trainingrun.operator.metrics import OperatorMetrics
from trainingrun.operator.settings import OperatorSettings

log = logging.getLogger("trainingrun.operator")

Key = tuple[str, str]  # (namespace, run name)


class Creator(Protocol):
    """The writes a launch makes (``trainingrun.operator.applier.Applier``)."""

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...
    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...


@dataclass(frozen=True)
class Launched:
    """Rank 0's pod once every pod of the attempt exists; else when to try again and why
    (``held``: a reason and message for the status, and its Event after it; ``say_again``: the
    Event is due again though the reason is not new), or why the API server rejected a pod (the
    run fails with it). The launcher itself writes no status and posts no Event."""

    first: dict[str, Any] | None = None
    wait: float | None = None
    invalid: str | None = None
    held: tuple[str, str] | None = None
    say_again: bool = False


class Launcher:
    def __init__(
        self,
        api: Creator,
        view: ClusterView,
        metrics: OperatorMetrics,
        settings: OperatorSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._view = view
        self._metrics = metrics
        self._settings = settings
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._said: dict[Key, tuple[str, float]] = {}  # the name-taken message said, and when
        self._service_of: dict[Key, str] = {}  # the run UID whose Service is known to exist

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._said.pop((namespace, name), None)
            self._service_of.pop((namespace, name), None)

    def launch(self, ref: RunRef, pods: Sequence[dict[str, Any]]) -> Launched:
        """Creates ``pods`` (rank order) and, for a gang, its Service first."""
        if len(pods) > 1:
            refused = self._service(ref)
            if refused is not None:
                return refused
        first: dict[str, Any] | None = None
        for pod in pods:
            done = self._create(ref, pod)
            if done.first is None:
                return done
            first = first or done.first
        return Launched(first=first)

    def _create(self, ref: RunRef, pod: dict[str, Any]) -> Launched:
        namespace, what = ref.namespace, pod["metadata"]["name"]
        try:
            created, fresh = self._api.create_pod(pod)
        except Forbidden as e:
            # Quota, a terminating namespace, an admission webhook: not the spec's fault.
            log.warning("%s/%s: pod %s not created: %s", namespace, ref.name, what, e)
            held = (R.POD_FORBIDDEN, f"pod {what} not created, retrying: {e}")
            return Launched(wait=self._settings.resync_seconds, held=held)
        except Invalid as e:
            return Launched(invalid=f"pod rejected: {e}")
        if not fresh and not owned_by(created, ref.uid):
            return self._name_taken(ref, created, "pod", R.POD_NAME_TAKEN)
        if fresh:
            self._metrics.pods_created.inc()
        self._view.pods.put((namespace, what), created)
        return Launched(first=created)

    def _service(self, ref: RunRef) -> Launched | None:
        """None once the gang's headless Service exists (created now, or before by this
        operator); else why the attempt waits."""
        key = (ref.namespace, ref.name)
        with self._lock:
            if self._service_of.get(key) == ref.uid:
                return None
        try:
            service, _ = self._api.create_service(build_service(ref))
        except (Forbidden, Invalid) as e:
            message = f"headless service {ref.name} not created, retrying: {e}"
            log.warning("%s/%s: %s", ref.namespace, ref.name, message)
            held = (R.SERVICE_FORBIDDEN, message)
            return Launched(wait=self._settings.resync_seconds, held=held)
        if not owned_by(service, ref.uid):
            return self._name_taken(ref, service, "service", R.SERVICE_NAME_TAKEN)
        with self._lock:
            self._service_of[key] = ref.uid
        return None

    def _name_taken(self, ref: RunRef, obj: Mapping[str, Any], kind: str, reason: str) -> Launched:
        """The name is taken by an object that is not the run's: wait for it to go (a deleted
        run's pod of the same name is removed by the garbage collector)."""
        message = name_taken_message(obj, kind)
        now, key = self._monotonic(), (ref.namespace, ref.name)
        with self._lock:
            said, at = self._said.get(key, ("", 0.0))
            # Said again once a minute while it lasts, not at every retry; at once when it changes.
            say = said != message or now - at >= self._settings.name_taken_repeat_seconds
            if say:
                self._said[key] = (message, now)
        if say:
            log.warning("%s/%s: %s", ref.namespace, ref.name, message)
        # The other object is not watched (no run label, or another run's UID): poll for it.
        wait = min(self._settings.resync_seconds, self._settings.name_taken_retry_seconds)
        return Launched(wait=wait, held=(reason, message), say_again=say)


def name_taken_message(obj: Mapping[str, Any], kind: str = "pod") -> str:
    """What a user reads when the attempt's pod name (or a gang's Service name) is held by an
    object that is not the run's."""
    meta = obj.get("metadata") or {}
    owners = [f"{r.get('kind')}/{r.get('name')}" for r in meta.get("ownerReferences") or []]
    whose = f"owned by {', '.join(owners)}" if owners else "not owned by this run"
    going = "being deleted; waiting" if meta.get("deletionTimestamp") else None
    return (
        f"{kind} {meta.get('name')} exists and is not this run's ({whose}): "
        f"{going or 'delete it or rename the run'}"
    )
