"""Fixtures of the unit tests: moto's in-memory S3, one per module, and a store on it; the
agents' commands run with an environment of the test's own.

The integration and end-to-end fixtures are in tests/conftest.py; builders of runs and pods are
in builders.py, fakes of the API server and the bucket in fakes.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.unit.fakes import BUCKET, NAMED_BUCKET, moto_s3
from trainingrun import cli
from trainingrun.storage.opener import S3Store, Store

# The least environment both agents start with (``trainingrun sync`` and ``restore``).
AGENT_ENV = {
    "TRAININGRUN_STORAGE_URI": "s3://bucket/runs/ml/r1",
    "TRAININGRUN_CHECKPOINT_DIR": "/checkpoints",
    "TRAININGRUN_RESTORE_STEP": "120",
    "AWS_REGION": "us-east-1",
}
# What the agents read from the environment: nothing of the machine's may leak into a test.
AGENT_VARIABLES = ("TRAININGRUN_", "AWS_", "AZURE_", "GOOGLE_")


@pytest.fixture(scope="module")
def moto_client() -> Iterator[Any]:
    """One in-memory S3 and client for the module, with ``BUCKET`` and ``NAMED_BUCKET``
    (making a client takes about a second)."""
    with moto_s3(BUCKET, NAMED_BUCKET) as client:
        yield client


@pytest.fixture
def client(moto_client: Any) -> Any:
    """The module's client over an empty ``BUCKET`` without unfinished uploads."""
    listed = moto_client.list_objects_v2(Bucket=BUCKET).get("Contents") or []
    if listed:
        keys = [{"Key": o["Key"]} for o in listed]
        moto_client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})
    uploads = moto_client.list_multipart_uploads(Bucket=BUCKET).get("Uploads") or []
    for upload in uploads:
        moto_client.abort_multipart_upload(
            Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
        )
    return moto_client


@pytest.fixture
def store(client: Any) -> Store:
    """An ``S3Store`` of the empty ``BUCKET``."""
    return S3Store(client, BUCKET)


@pytest.fixture
def run_agent(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, dict[str, str]], int]:
    """Runs ``trainingrun <command>`` (``cli.main``) with ``AGENT_ENV`` and the overrides (an
    empty value unsets) as the whole of the agents' environment; returns its exit code."""

    def run(command: str, overrides: dict[str, str]) -> int:
        for name in list(os.environ):
            if name.startswith(AGENT_VARIABLES):
                monkeypatch.delenv(name)
        for name, value in {**AGENT_ENV, **overrides}.items():
            if value:
                monkeypatch.setenv(name, value)
        return cli.main([command])

    return run
