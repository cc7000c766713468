"""bench_operator's progress comparison (``--compare-progress``): the hostile records it plants,
what it reads from the runs' statuses and the operator's log and metrics, and its section of
docs/benchmarks.md.

Covers: the hostile runs spread evenly over the fleet, every kind in turn and the 100 MB one
capped; each hostile record as the operator's decoding takes it (refused, or shown without its
NaN, infinite or negative rates) and the large ones on either side of the store's cap; a run's
status judged against what it published (its own step shown, past its first or not, a step not
its own, progress or a ledger step shown from a refused record, a rate shown from a NaN record);
the "no progress shown" log lines counted by reason with the object's name left out, and a
well-formed run named among them caught; reads and status writes a second from two metrics
scrapes; the machine's busy CPU time; each measurement's label.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.bench_operator import (
    BIG,
    BIG_BYTES,
    GARBAGE,
    HOSTILE_KINDS,
    HUGE,
    NAN,
    STEP,
    Variant,
    check_shown,
    good_step,
    hostile_body,
    hostile_plan,
    machine_busy_seconds,
    refusals,
    rest_between,
)
from trainingrun.checkpoint.progress import ProgressError, decode
from trainingrun.storage.base import MAX_GET_BYTES

NOW = 1_800_000_000.0
NAMES = [f"r{i:04d}" for i in range(1000)]


def test_hostile_runs_are_every_tenth_with_each_kind_in_turn() -> None:
    plan = hostile_plan(NAMES, 0.1, huge_at_most=10)
    assert sorted(plan) == [f"r{i:04d}" for i in range(9, 1000, 10)]
    counts = {kind: list(plan.values()).count(kind) for kind in HOSTILE_KINDS}
    assert counts[HUGE] == 10
    assert sum(counts.values()) == 100
    assert all(22 <= counts[k] <= 23 for k in (BIG, GARBAGE, STEP, NAN)), counts


@pytest.mark.parametrize(
    ("runs", "share", "count"),
    [(40, 0.25, 10), (1000, 0.1, 100), (7, 0.5, 4), (10, 0.01, 0)],
    ids=["a-quarter-of-40", "a-tenth-of-1000", "half-of-7-rounded", "none-of-10"],
)
def test_hostile_plan_picks_the_share_rounded(runs: int, share: float, count: int) -> None:
    names = NAMES[:runs]
    plan = hostile_plan(names, share)
    assert len(plan) == count
    assert set(plan) <= set(names)


@pytest.mark.parametrize("kind", [BIG, GARBAGE, STEP], ids=["7-MiB", "random-bytes", "step-1e18"])
def test_refused_kinds_are_refused_by_the_decoding(kind: str) -> None:
    with pytest.raises(ProgressError):
        decode(hostile_body(kind, 3, 1, NOW))


@pytest.mark.parametrize("index", [0, 1], ids=["negative-rates", "nan-and-inf"])
def test_nan_rates_are_dropped_and_the_step_kept(index: int) -> None:
    record = decode(hostile_body(NAN, index, 2, NOW))
    assert record.step == good_step(index, 2)
    assert record.samples_per_second is None
    assert record.tokens_per_second is None


def test_the_large_records_fall_on_either_side_of_the_stores_cap() -> None:
    assert len(hostile_body(BIG, 0, 0, NOW)) == BIG_BYTES < MAX_GET_BYTES
    assert len(hostile_body(HUGE, 0, 0, NOW)) > MAX_GET_BYTES


def status(step: int | None = None, **more: Any) -> dict[str, Any]:
    progress = None if step is None else {"step": step, "summary": "x", **more}
    return {"progress": progress} if progress else {}


@pytest.mark.parametrize(
    ("kind", "shown", "wrong", "moved"),
    [
        (None, status(good_step(1, 1)), False, 1),
        (None, status(good_step(1, 0)), False, 0),
        (None, status(good_step(1, 1) + 1), True, 0),
        (None, status(good_step(0, 1)), True, 0),
        (None, {}, False, 0),
        (GARBAGE, {}, False, 0),
        (STEP, status(good_step(1, 1)), True, 0),
        (HUGE, {"attempts": [{"attempt": 1, "lastStep": 5}]}, True, 0),
        (BIG, {"attempts": [{"attempt": 1, "firstStep": None}]}, False, 0),
        (NAN, status(good_step(1, 2)), False, 0),
        (NAN, status(good_step(1, 2), samplesPerSecond=1.0), True, 0),
    ],
    ids=[
        "good-run-its-later-step",
        "good-run-its-first-step",
        "good-run-a-step-not-its-own",
        "good-run-another-runs-step",
        "good-run-nothing-shown-yet",
        "refused-nothing-shown",
        "refused-shows-progress",
        "refused-a-step-in-the-ledger",
        "refused-ledger-without-steps",
        "nan-rates-step-without-rates",
        "nan-rates-a-rate-shown",
    ],
)
def test_a_status_is_judged_against_what_its_run_published(
    kind: str | None, shown: dict[str, Any], wrong: bool, moved: int
) -> None:
    names = ["r0000", "r0001"]
    plan = {"r0001": kind} if kind else {}
    result = check_shown({"r0001": shown}, names, plan)
    assert (result.wrong == ["r0001"]) is wrong
    assert result.good_moved == moved
    assert result.refused == (kind not in (None, NAN))


def test_refusals_are_counted_by_reason_without_the_object() -> None:
    lines = [
        "2026-11-29 10:00:00,000 INFO trainingrun.operator.reconciler: bench-a/r0009: no "
        "progress shown: s3://trainingrun/bench-a/bench-a/r0009/progress.json is 100000000 "
        "bytes, over the 8388608 bytes this read takes",
        "2026-11-29 10:00:01,000 INFO trainingrun.operator.reconciler: bench-a/r0019: no "
        "progress shown: s3://trainingrun/bench-a/bench-a/r0019/progress.json is 100000000 "
        "bytes, over the 8388608 bytes this read takes",
        "2026-11-29 10:00:02,000 INFO x: bench-a/r0029: no progress shown: the progress record "
        "is not valid JSON",
        "2026-11-29 10:00:03,000 INFO x: bench-a/r0001: no progress shown: the progress record "
        "is not valid JSON",
        "2026-11-29 10:00:04,000 INFO x: bench-a/r0001: attempt 2 started",
    ]
    plan = {"r0009": HUGE, "r0019": HUGE, "r0029": GARBAGE}
    reasons, others = refusals(lines, plan)
    assert reasons == {
        "the object is 100000000 bytes, over the 8388608 bytes this read takes": 2,
        "the progress record is not valid JSON": 2,
    }
    assert others == ["r0001"]


def test_reads_and_status_writes_a_second_from_two_scrapes() -> None:
    get = 'trainingrun_bucket_calls_total{operation="get"}'
    tagged = 'trainingrun_bucket_calls_total{operation="get_with_etag"}'
    patch = (
        'trainingrun_api_calls_total{resource="/apis/{group}/{version}/namespaces/{namespace}'
        '/trainingruns/{name}/status",verb="PATCH"}'
    )
    pod = 'trainingrun_api_calls_total{resource="/api/v1/namespaces/{namespace}/pods",verb="PATCH"}'
    before = {get: 100.0, tagged: 5.0, patch: 10.0, pod: 0.0}
    after = {get: 200.0, tagged: 500.0, patch: 60.0, pod: 70.0}
    rest = rest_between(before, after, seconds=10.0, cpu_seconds_used=0.5)
    assert rest.progress_reads == pytest.approx(10.0)
    assert rest.status_writes == pytest.approx(5.0)
    assert rest.cpu_ms == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("variant", "label"),
    [
        (Variant(), "progress off"),
        (Variant(progress=True), "progress on"),
        (Variant(True, 0.1), "progress on, 10% of runs hostile"),
    ],
)
def test_each_measurement_says_what_the_runs_published(variant: Variant, label: str) -> None:
    assert variant.label() == label


def test_the_machines_busy_time_leaves_out_idle_and_io_wait(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 50 1000 20 3 2 0 40 0\ncpu0 50 2 25 500 10 1 1 0 20 0\n")
    hz = os.sysconf("SC_CLK_TCK")
    assert machine_busy_seconds(stat) == pytest.approx((100 + 5 + 50 + 3 + 2) / hz)
