"""tests/bench_stores.py runs end to end, at a tiny size, on the real emulators.

The benchmark is run by hand, not by ``make test``, and reports a contender that fails as a
row instead of stopping. So a change that breaks it (as the packing of small files once did:
it looked for an object the committed copy no longer has, and measured nothing) went unseen
until the next time someone ran it. This runs one round of every contender, each checked byte
for byte by the benchmark itself, and fails on any contender that did not run or did not match.
"""

from __future__ import annotations

import argparse

import pytest

from tests import bench_stores

# The gs:// upload that fake-gcs-server cannot take (no XML multipart upload): tried once by
# design and reported as failed.
EXPECTED_TO_FAIL = {f"upload {bench_stores.XML_MPU}"}


# The benchmark's own per-transfer limit is SIGALRM, the timer pytest-timeout's signal method
# uses too: this test's limit runs in a thread instead.
@pytest.mark.timeout(600, method="thread")
def test_bench_stores_measures_and_checks_every_contender_on_both_emulators() -> None:
    args = argparse.Namespace(
        size_gib=0.02, rounds=1, stores=["gs", "az"], transfer_timeout=120, max_minutes=8
    )
    result = bench_stores.run(args)

    assert set(result["stores"]) == {"gs", "az"}
    for scheme, (_emu, out) in result["stores"].items():
        assert not out.stopped, f"{scheme}: {out.stopped}"
        failed = {what: err for what, err in out.failed.items() if what not in EXPECTED_TO_FAIL}
        assert not failed, f"{scheme}: {failed}"
        ran = {f"upload {n}" for n in out.up} | {f"download {n}" for n in out.down}
        assert {"upload sync", "download restore"} <= ran, f"{scheme}: ran {sorted(ran)}"
        assert len(out.up) >= 2 and len(out.down) >= 2, f"{scheme}: no baseline ran: {sorted(ran)}"
        # Every contender that ran was checked byte for byte against the source.
        assert set(out.verified) == ran, f"{scheme}: unchecked {sorted(ran - set(out.verified))}"
        assert all(s.seconds > 0 for samples in out.up.values() for s in samples)

    text = bench_stores.report(result, "python -m tests.bench_stores --size-gib 0.02 --rounds 1")
    for label in ("gs://", "az://"):
        assert f"{label} sync: " in text and f"{label} restore: " in text
    assert "no ratio" not in text
