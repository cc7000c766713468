"""An endpoint's words in the operator's log: kept for the admin, on one line, escaped, so a
reply with newlines and escape codes cannot forge a log line or drive a terminal (issue 44,
finding 11). The stores' own escaping is in test_bounds_stores_replies.py; this holds the
operator's log lines that report a failed bucket read to it.
"""

from __future__ import annotations

import logging

import pytest

from tests.unit.builders import NAMESPACE
from tests.unit.test_reconciler import World
from trainingrun.decide import reasons as R
from trainingrun.storage.opener import StorageUnavailable

SECRET = "creds"
FORGED = "busy\n2026-01-01 00:00:00 INFO trainingrun.operator: all good\x1b[2J"


def test_an_endpoints_words_reach_the_operators_log_escaped_on_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(storage={"endpoint": "http://10.1.2.3:9000", "credentials_secret": SECRET})
    w.kube.secrets[(NAMESPACE, SECRET)] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "k"}

    def answers_with_forged_lines(key: str) -> bytes | None:
        raise StorageUnavailable("s3://ckpt/runs: the endpoint answered 503", detail=FORGED)

    w.bucket.get = answers_with_forged_lines  # type: ignore[method-assign]
    w.bucket.get_with_etag = answers_with_forged_lines  # type: ignore[assignment]

    with caplog.at_level(logging.WARNING, logger="trainingrun.operator"):
        w.reconcile()

    assert w.status()["reason"] == R.STORAGE_UNAVAILABLE
    lines = [r.getMessage() for r in caplog.records]
    assert any("busy\\n2026-01-01 00:00:00 INFO" in line and "\\x1b[2J" in line for line in lines)
    assert all("\n" not in line and "\x1b" not in line for line in lines), lines
    status = w.status()
    assert "2026-01-01" not in status["message"]
    assert all("2026-01-01" not in message for _, _, message in w.events.posted)
