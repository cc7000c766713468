"""bench_transfer's report: the medians' verdict, and ours against the best baseline round by
round (the two ran in the same round), so a reader sees how far a verdict stands from the noise.

Covers: the paired ratio of each round (a faster round of ours above 1.00x, a slower one below,
rounds of unequal count refused); the verdict taken from the medians while some rounds fall on
the other side; the best baseline chosen by its median, not by its best round; each round's
order a repeatable permutation of every contender, different between shapes and directions, in
which no contender always runs right after the same one (a rotation would).
"""

from __future__ import annotations

import itertools

import pytest

from tests.bench_transfer import Sample, paired, report, round_by_round
from tests.benchutil import shuffled


def samples(*seconds: float) -> list[Sample]:
    return [Sample(s, s / 2) for s in seconds]


@pytest.mark.parametrize(
    ("ours", "baseline", "expected"),
    [
        ((1.0,), (1.0,), [1.0]),
        ((1.0, 2.0), (1.1, 1.0), [1.1, 0.5]),
        ((0.5, 4.0, 1.25), (1.0, 1.0, 1.0), [2.0, 0.25, 0.8]),
    ],
)
def test_paired_is_the_throughput_ratio_of_each_round(
    ours: tuple[float, ...], baseline: tuple[float, ...], expected: list[float]
) -> None:
    assert paired(samples(*ours), samples(*baseline)) == pytest.approx(expected)


def test_paired_refuses_rounds_of_unequal_count() -> None:
    with pytest.raises(ValueError, match=r"shorter|longer"):
        paired(samples(1.0, 1.0), samples(1.0))


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([1.0, 0.99], "1.00x, 0.99x; at or above 1.00x in 1 of 2"),
        ([0.5, 0.6, 0.7], "0.50x, 0.60x, 0.70x; at or above 1.00x in 0 of 3"),
        ([1.2], "1.20x; at or above 1.00x in 1 of 1"),
    ],
)
def test_round_by_round_counts_the_rounds_at_target(ratios: list[float], expected: str) -> None:
    assert round_by_round(ratios) == expected


def result(up: dict[str, list[Sample]], down: dict[str, list[Sample]]) -> dict[str, object]:
    return {
        "rounds": 3,
        "versions": {"s5cmd": "v", "s3transfer": "v", "awscrt": "v", "rclone": "v", "boto3": "v"},
        "shapes": [
            {"name": "large", "description": "d", "gib": 1.0, "files": 9, "up": up, "down": down}
        ],
    }


def test_report_gives_the_medians_verdict_and_each_round() -> None:
    # Ours wins the median (1.0 s against 1.1 s) but loses the middle round.
    up = {"sync": samples(1.0, 1.2, 0.9), "s5cmd": samples(1.1, 1.0, 1.1)}
    # A baseline with the best single round (0.5 s) but the worse median is not the best.
    down = {
        "restore": samples(2.0, 2.0, 2.0),
        "s5cmd": samples(1.9, 1.8, 1.8),
        "rclone": samples(0.5, 3.0, 3.0),
    }
    text = report(result(up, down), "cmd")
    assert "- large upload: sync = 1.10x the best baseline (s5cmd): target 1.00x met" in text
    assert "- round by round against s5cmd: 1.10x, 0.83x, 1.22x; at or above 1.00x in 2 of 3" in (
        text
    )
    assert "- large download: restore = 0.90x the best baseline (s5cmd): target 1.00x NOT met" in (
        text
    )
    assert "against s5cmd: 0.95x, 0.90x, 0.90x; at or above 1.00x in 0 of 3" in text
    assert "against rclone" not in text
    assert "Machine:" not in text


def test_report_says_when_free_page_reporting_was_held() -> None:
    up = {"sync": samples(1.0), "s5cmd": samples(1.1)}
    down = {"restore": samples(1.0), "s5cmd": samples(1.1)}
    run = result(up, down) | {"page_reporting": "free page reporting held for the run"}
    assert "Machine: free page reporting held for the run." in report(run, "cmd")


NAMES = ["restore", "s5cmd a", "s5cmd b", "crt a", "crt b", "rclone a", "rclone b", "boto3 a"]


@pytest.mark.parametrize("rnd", range(4))
def test_each_round_runs_every_contender_once_in_a_repeatable_order(rnd: int) -> None:
    order = shuffled(NAMES, "large", "down", rnd)
    assert sorted(order) == sorted(NAMES)
    assert order == shuffled(NAMES, "large", "down", rnd)


def test_no_contender_always_runs_right_after_the_same_one() -> None:
    # A rotation keeps every neighbour: "restore" would follow "boto3 a" in every round.
    before: dict[str, set[str]] = {}
    for rnd in range(5):
        order = shuffled(NAMES, "sharded", "down", rnd)
        for prev, who in itertools.pairwise(order):
            before.setdefault(who, set()).add(prev)
    assert all(len(prev) >= 2 for prev in before.values()), before


def test_the_order_differs_between_shapes_and_directions() -> None:
    orders = {
        tuple(shuffled(NAMES, shape, direction, 0))
        for shape in ("large", "sharded")
        for direction in ("up", "down")
    }
    assert len(orders) > 1
