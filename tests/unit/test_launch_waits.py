"""An attempt whose pods or Service the API server refuses waits, said in the run's status
first and then in an Event: the launcher returns why, the starter writes it (the order the
docs give: an Event after the status it describes). A refused Service is ``ServiceForbidden``,
a refused pod ``PodForbidden``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_reconciler import World
from trainingrun.decide import reasons as R
from trainingrun.operator.kube import Forbidden


def _record_order(w: World) -> list[str]:
    calls: list[str] = []
    patch, post = w.kube.patch_run_status, w.events.post

    def patch_run_status(*args: Any, **kwargs: Any) -> Any:
        calls.append("status")
        return patch(*args, **kwargs)

    def post_event(run: Any, type_: str, reason: str, message: str) -> None:
        calls.append(reason)
        post(run, type_, reason, message)

    w.kube.patch_run_status = patch_run_status  # type: ignore[method-assign]
    w.events.post = post_event  # type: ignore[method-assign]
    return calls


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise Forbidden("exceeded quota: compute-resources, requested: pods=1")


@pytest.mark.parametrize(
    ("replicas", "refused", "reason"),
    [
        pytest.param(2, "create_service", R.SERVICE_FORBIDDEN, id="gang-service-refused"),
        pytest.param(1, "create_pod", R.POD_FORBIDDEN, id="pod-refused"),
        pytest.param(2, "create_pod", R.POD_FORBIDDEN, id="gang-pod-refused"),
    ],
)
def test_a_refused_create_is_recorded_then_said(replicas: int, refused: str, reason: str) -> None:
    w = World(replicas=replicas)
    setattr(w.kube, refused, _refuse)
    calls = _record_order(w)

    w.reconcile()

    status = w.status()
    assert status["reason"] == reason
    assert "exceeded quota" in status["message"]
    said = [c for c in calls if c == reason]
    assert said == [reason]
    assert calls.index("status") < calls.index(reason), calls
    assert w.kube.creates == []


def test_a_wait_for_the_same_refusal_is_said_once() -> None:
    w = World(replicas=2)
    w.kube.create_service = _refuse  # type: ignore[method-assign]
    calls = _record_order(w)

    w.reconcile()
    w.clock.advance(30)
    w.reconcile()

    assert calls.count(R.SERVICE_FORBIDDEN) == 1
