"""decide.savefit: the estimate of a save's upload against the grace period and the spot
notices, and the SaveAtRisk condition it sets through plan().

Covers: no estimate without a measured upload; the window is the grace period, or a spot node's
notice when shorter (AWS, GCP, Azure by their node labels); the message names every window it
fits and misses; through plan(), a checkpoint too big for its grace period turns SaveAtRisk True
with one Warning Event (not repeated), and a smaller one turns it False without an Event;
between attempts (no node) the last estimate stays; the slowest rank's time is the checkpoint's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.builders import make_node, make_run
from trainingrun.api import CheckpointRef
from trainingrun.checkpoint.manifest import slowest
from trainingrun.decide import reasons as R
from trainingrun.decide.reconcile import plan
from trainingrun.decide.savefit import estimate, node_notice

GiB = 1 << 30


def ref(size: int | None, seconds: float | None) -> CheckpointRef:
    return CheckpointRef(step=10, uri="s3://b/p", bytes=size, upload_seconds=seconds)


def spot(key: str, value: str) -> dict[str, Any]:
    return make_node().labelled(key, value).build()


@pytest.mark.parametrize(
    "size,seconds",
    [(None, 10.0), (GiB, None), (None, None)],
    ids=["no-size", "no-time", "neither"],
)
def test_no_estimate_without_a_measured_upload(size: int | None, seconds: float | None) -> None:
    assert estimate(ref(size, seconds), 120, None) is None
    assert estimate(None, 120, None) is None


@pytest.mark.parametrize(
    "node,notice",
    [
        (spot("eks.amazonaws.com/capacityType", "SPOT"), "AWS spot notice"),
        (spot("karpenter.sh/capacity-type", "spot"), "AWS spot notice"),
        (spot("cloud.google.com/gke-spot", "true"), "GCP spot notice"),
        (spot("cloud.google.com/gke-preemptible", "true"), "GCP spot notice"),
        (spot("kubernetes.azure.com/scalesetpriority", "spot"), "Azure spot notice"),
        (spot("karpenter.sh/capacity-type", "on-demand"), None),
        (make_node().build(), None),
        (None, None),
    ],
    ids=["eks", "karpenter", "gke-spot", "gke-preemptible", "aks", "on-demand", "plain", "none"],
)
def test_spot_nodes_are_known_by_their_labels(node: Any, notice: str | None) -> None:
    found = node_notice(node)
    assert (found.name if found else None) == notice


@pytest.mark.parametrize(
    "seconds,grace,node,window,fits",
    [
        (20.0, 120, None, 120, True),
        (150.0, 120, None, 120, False),
        (20.0, 600, spot("eks.amazonaws.com/capacityType", "SPOT"), 120, True),
        (200.0, 600, spot("eks.amazonaws.com/capacityType", "SPOT"), 120, False),
        (40.0, 120, spot("cloud.google.com/gke-spot", "true"), 30, False),
        (25.0, 120, spot("kubernetes.azure.com/scalesetpriority", "spot"), 30, True),
        (25.0, 10, spot("cloud.google.com/gke-spot", "true"), 10, False),  # grace is shorter
    ],
    ids=["fits-grace", "over-grace", "aws", "over-aws", "over-gcp", "azure", "grace-below-gcp"],
)
def test_the_window_is_the_grace_period_or_a_shorter_spot_notice(
    seconds: float, grace: int, node: Any, window: int, fits: bool
) -> None:
    est = estimate(ref(2 * GiB, seconds), grace, node)

    assert est is not None
    assert (est.window_seconds, est.fits) == (window, fits)
    assert est.upload_seconds == seconds
    assert est.bytes_per_second == int(2 * GiB / seconds)


def test_the_message_names_every_window_it_fits_and_misses() -> None:
    est = estimate(ref(2 * GiB, 60.0), 120, None)

    assert est is not None
    assert est.message == (
        "a checkpoint of 2.0 GiB took 60.0 s to upload (34.1 MiB/s); fits the grace period "
        "(120 s), AWS spot notice (120 s); does not fit GCP spot notice (30 s), Azure spot "
        "notice (30 s)"
    )


def test_a_checkpoint_too_big_for_its_grace_period_warns_once() -> None:
    run = make_run("r1").with_grace_period(30).with_checkpoint(100, 4 * GiB, 45.0)
    node = make_node().build()
    status = run.status()

    first = plan(run.observe(node=node, status=status))
    again = plan(run.observe(node=node, status=first.status))

    cond = next(c for c in first.status.conditions if c.type == R.SAVE_AT_RISK)
    assert (cond.status, cond.reason) == ("True", R.SAVE_TOO_SLOW)
    assert "terminationGracePeriodSeconds (now 30 s)" in cond.message
    assert first.status.save_estimate is not None
    assert first.status.save_estimate.fits is False
    warned = [e for e in first.events if e.reason == R.SAVE_TOO_SLOW]
    assert [e.type for e in warned] == ["Warning"]
    assert not [e for e in again.events if e.reason == R.SAVE_TOO_SLOW]


def test_a_save_that_fits_turns_the_condition_false_quietly() -> None:
    big = make_run("r1").with_grace_period(30).with_checkpoint(100, 4 * GiB, 45.0)
    node = make_node().build()
    risky = plan(big.observe(node=node)).status
    small = make_run("r1").with_grace_period(30).with_checkpoint(200, GiB, 9.0)

    p = plan(small.observe(node=node, status=risky))

    cond = next(c for c in p.status.conditions if c.type == R.SAVE_AT_RISK)
    assert (cond.status, cond.reason) == ("False", R.SAVE_FITS)
    assert not [e for e in p.events if e.reason in (R.SAVE_FITS, R.SAVE_TOO_SLOW)]


def test_between_attempts_the_last_estimate_stays() -> None:
    run = make_run("r1").with_grace_period(120).with_checkpoint(100, GiB, 40.0)
    gke = spot("cloud.google.com/gke-spot", "true")
    on_spot = plan(run.observe(node=gke)).status

    p = plan(run.observe(node=None, status=on_spot))

    assert p.status.save_estimate == on_spot.save_estimate
    assert p.status.save_estimate is not None and p.status.save_estimate.window_seconds == 30


@pytest.mark.parametrize(
    "seconds,expected",
    [([3.0, 7.5, 5.0], 7.5), ([4.0], 4.0), ([4.0, None], None), ([], None)],
    ids=["slowest", "one", "a-part-unmeasured", "none"],
)
def test_a_checkpoint_takes_its_slowest_rank(
    seconds: list[float | None], expected: float | None
) -> None:
    assert slowest(seconds) == expected
