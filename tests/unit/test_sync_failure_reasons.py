"""The sync sidecar's failure reasons (``trainingrun_sync_failures_total{reason}`` and the
``sync: <reason>: ...`` log line) stay the documented set: every manifest problem, too large,
too new or malformed, is ``ManifestError``, which docs/operations.md's alert selects on.
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from trainingrun.agent.sidecar import Metrics, report_failure
from trainingrun.checkpoint.capped import ManifestError, ManifestTooLarge, ManifestTooNew
from trainingrun.storage.opener import StorageUnavailable


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ManifestError("manifest.json is malformed"), "ManifestError"),
        (ManifestTooNew("manifest.json is of version 99", "manifest.json", 2), "ManifestError"),
        (
            ManifestTooLarge("manifest.json is over 4 MiB", "manifest.json", 1),
            "ManifestError",
        ),
        (StorageUnavailable("s3://b/k: the endpoint answered 503"), "StorageUnavailable"),
    ],
    ids=["malformed", "too-new", "too-large", "storage"],
)
def test_a_failure_is_counted_and_logged_under_its_documented_reason(
    error: Exception, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)

    with caplog.at_level(logging.ERROR):
        report_failure(error, metrics)

    assert registry.get_sample_value("trainingrun_sync_failures_total", {"reason": reason}) == 1
    assert f"sync: {reason}: " in caplog.text


def test_a_file_the_trainer_keeps_private_names_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(CollectorRegistry())
    error = PermissionError(13, "Permission denied", "/checkpoints/checkpoint-60/model.safetensors")

    with caplog.at_level(logging.ERROR):
        report_failure(error, metrics)

    assert "sync: PermissionError: " in caplog.text
    assert "model.safetensors" in caplog.text
    assert "securityContext.runAsUser" in caplog.text
