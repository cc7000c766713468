"""tests/bench_transfer.py runs end to end, at a tiny size, on a SeaweedFS of its own.

The benchmark measures issue 16's target and is run by hand, not by ``make test``: a change to
sync, restore or the benchmark that breaks it would go unseen until someone next runs it for
25 minutes. This runs one round of every contender on every shape (each transfer checked by
file names and sizes by the benchmark itself, which raises on a mismatch) and the report.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import bench_transfer
from tests.integration.agents import S3, PrivateSeaweedFS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3, int]]:
    """A SeaweedFS apart from the session's: ``reclaim`` asks its master to vacuum, and this
    module must not hold up other tests on the same server meanwhile."""
    weed = PrivateSeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    weed.start()
    try:
        assert weed.proc is not None
        yield weed.s3, weed.proc.pid
    finally:
        weed.stop(keep_data=False)


@pytest.mark.timeout(900)
def test_bench_transfer_measures_every_contender_on_every_shape(
    server: tuple[S3, int], tmp_path: Path
) -> None:
    args = argparse.Namespace(
        shapes=list(bench_transfer.SHAPES), size_gib=0.02, rounds=1, hold_page_reporting=False
    )
    result = bench_transfer.run(args, server)

    b = bench_transfer
    grids = len(b.S5CMD_GRID) + len(b.CRT_GRID)
    contenders = {
        "up": 1 + grids + len(b.RCLONE_GRID["up"]) + len(b.BOTO3_GRID["up"]),
        "down": 1 + grids + len(b.RCLONE_GRID["down"]) + len(b.BOTO3_GRID["down"]),
    }
    families = ("s5cmd ", "crt ", "rclone ", "boto3 ")
    assert [shp["name"] for shp in result["shapes"]] == list(b.SHAPES)
    for shp in result["shapes"]:
        for key, ours in (("up", "sync"), ("down", "restore")):
            ran = shp[key]
            assert len(ran) == contenders[key], f"{shp['name']} {key}: {sorted(ran)}"
            assert ours in ran
            assert all(any(n.startswith(f) for n in ran) for f in families), sorted(ran)
            samples = [s for ss in ran.values() for s in ss]
            assert len(samples) == contenders[key]  # one round: one sample each
            assert all(s.seconds > 0 and s.cpu_seconds > 0 for s in samples), shp["name"]
    assert result["versions"]["rclone"].startswith("v")
    assert result["versions"]["s5cmd"] != "?"

    text = bench_transfer.report(result, "python -m tests.bench_transfer --size-gib 0.02")
    for name in bench_transfer.SHAPES:
        for direction in ("upload", "download"):
            assert f"### {name}: {direction}" in text
    assert text.count("| sync |") == len(bench_transfer.SHAPES)
    assert text.count("| restore |") == len(bench_transfer.SHAPES)
