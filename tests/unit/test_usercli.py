"""The user commands' reading of a run's bucket, without a cluster (tests/integration/
test_usercli.py runs the commands against a live run).

Covers:

- run_store(): the store opened with the run's storage spec and the credentials of its Secret,
  and the run's place in the bucket equal to the TRAININGRUN_STORAGE_URI the operator gives the
  run's sidecar (a URI with a prefix, with a trailing slash, with none); a missing Secret is a
  CredentialsSecretError naming it;
- checkpoint_rows(): newest first; "yes" for an intact checkpoint (version 1, or version 2 with
  the parts of all its ranks), "no: <why>" from the operator's own check for a missing object
  or a missing MANIFEST.json (named by its key: the version-1 folder's, or one rank's part),
  and "no: marked bad" for a bad step without reading it.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.unit.builders import make_run
from tests.unit.fakes import DictStore
from trainingrun import contract
from trainingrun.api import StorageSpec
from trainingrun.checkpoint.manifest import (
    CHECKPOINT_MANIFEST,
    MANIFEST_VERSION,
    RUN_MANIFEST,
    CheckpointManifest,
    FileEntry,
    ManifestEntry,
    RunManifest,
    checkpoint_prefix,
    epoch_prefix,
    parse_run_manifest,
    part_prefix,
)
from trainingrun.cli import runs as usercli
from trainingrun.decide.naming import RunRef
from trainingrun.decide.pod import storage_env
from trainingrun.operator.kube import Kube
from trainingrun.storage.opener import (
    Credentials,
    CredentialsSecretError,
    Location,
    S3Store,
    Store,
    parse_uri,
)

SECRET = dict(zip(contract.CREDENTIAL_KEYS, ("AKIA", "s3cr3t"), strict=True))


class FakeKube:
    """The one call run_store makes: a Secret's decoded data, None when absent."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.secrets.get(f"{namespace}/{name}")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[StorageSpec, Credentials | None]]:
    """open_store's arguments, recorded; the store it returns has no client."""
    calls: list[tuple[StorageSpec, Credentials | None]] = []

    def fake_open(storage: StorageSpec, credentials: Credentials | None) -> Store:
        calls.append((storage, credentials))
        return S3Store(None, parse_uri(storage.uri).bucket)

    monkeypatch.setattr(usercli, "open_store", fake_open)
    return calls


@pytest.mark.parametrize(
    "uri",
    ["s3://ckpt-bucket/runs", "s3://ckpt-bucket/runs/", "s3://ckpt-bucket"],
    ids=["prefix", "trailing-slash", "bucket-only"],
)
def test_run_store_is_where_the_operator_points_the_sidecar(
    opened: list[tuple[StorageSpec, Credentials | None]], uri: str
) -> None:
    run = make_run("r1").with_storage(uri=uri, endpoint="http://s3:8333", credentials_secret="s")
    kube = FakeKube({f"{run.namespace}/s": SECRET})

    store, location = usercli.run_store(cast(Kube, kube), _object(run.ref()))

    env = {e["name"]: e["value"] for e in storage_env(run.ref()) if "value" in e}
    assert location == parse_uri(env[contract.ENV_STORAGE_URI])
    assert location.prefix.endswith(f"{run.namespace}/r1")
    assert store.bucket == "ckpt-bucket"
    assert opened == [
        (
            run.spec().checkpoint.storage,
            {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t"},
        )
    ]


def test_run_store_without_its_secret_names_it(
    opened: list[tuple[StorageSpec, Credentials | None]],
) -> None:
    run = make_run("r1").with_storage(credentials_secret="gone")

    with pytest.raises(CredentialsSecretError, match=f"Secret {run.namespace}/gone"):
        usercli.run_store(cast(Kube, FakeKube({})), _object(run.ref()))
    assert opened == []


def _object(ref: RunRef) -> dict[str, Any]:
    """The TrainingRun as the API server returns it (camelCase JSON)."""
    return {
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "spec": ref.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


# -- checkpoint rows ---------------------------------------------------------------------------

RUN = Location("ckpt", "runs/ml/r1")
FILES = {"model.safetensors": b"w" * 3000, "optimizer.pt": b"adam"}


class FakeStore(DictStore):
    """checkpoint_rows' two reads, filled with committed checkpoints by ``commit``: version 1
    (epoch 0), or ``ranks`` parts of ``epoch`` that each hold FILES."""

    def commit(self, *steps: int, epoch: int = 0, ranks: int = 1) -> FakeStore:
        files = [
            FileEntry(path=p, size=len(d), checksum_algorithm="CRC64NVME", checksum="x")
            for p, d in FILES.items()
        ]
        for step in steps:
            for rank in range(ranks):
                folder = part_prefix(step, epoch, rank)
                for path, data in FILES.items():
                    self.objects[RUN.key(folder, path)] = data
                ckpt = CheckpointManifest(
                    version=MANIFEST_VERSION,
                    step=step,
                    files=files,
                    created="t",
                    epoch=epoch,
                    rank=rank,
                    ranks=ranks,
                )
                self.objects[RUN.key(folder, CHECKPOINT_MANIFEST)] = ckpt.model_dump_json().encode()
        raw = self.objects.get(RUN.key(RUN_MANIFEST))
        before = parse_run_manifest(raw).entries if raw else []
        entries = [
            ManifestEntry(
                step=s,
                prefix=epoch_prefix(s, epoch),
                committed=f"t{s}",
                files=2 * ranks,
                bytes=3004 * ranks,
                epoch=epoch,
                ranks=ranks,
            )
            for s in steps
        ]
        manifest = RunManifest(entries=[*before, *entries], fence=epoch)
        self.objects[RUN.key(RUN_MANIFEST)] = manifest.to_json()
        return self


def test_checkpoint_rows_verify_as_the_operator_does() -> None:
    fake = FakeStore().commit(10, 20, 30, 40).commit(50, 60, epoch=2, ranks=2)
    del fake.objects[RUN.key(checkpoint_prefix(30), "optimizer.pt")]
    del fake.objects[RUN.key(checkpoint_prefix(20), CHECKPOINT_MANIFEST)]
    del fake.objects[RUN.key(part_prefix(60, 2, 1), CHECKPOINT_MANIFEST)]

    rows = usercli.checkpoint_rows(cast(Store, fake), RUN, bad={40})

    assert [(r[0], r[4]) for r in rows] == [
        (60, "no: checkpoints/checkpoint-60/e2/r1/MANIFEST.json is missing"),
        (50, "yes"),
        (40, "no: marked bad (status.badCheckpoints)"),
        (30, "no: optimizer.pt is missing"),
        (20, "no: checkpoints/checkpoint-20/MANIFEST.json is missing"),
        (10, "yes"),
    ]
    assert rows[-1][1:4] == ("2.9 KiB", "t10", "2")
    assert rows[1][1:4] == ("5.9 KiB", "t50", "4")
    assert not any("checkpoint-40/" in key for key in fake.gets)


def test_no_manifest_no_rows() -> None:
    assert usercli.checkpoint_rows(cast(Store, FakeStore()), RUN, bad=set()) == []


@pytest.mark.parametrize(
    ("pod", "row"),
    [
        pytest.param(
            {
                "metadata": {"name": "r-2-1"},
                "spec": {"nodeName": "n1"},
                "status": {"phase": "Running"},
            },
            ["  r-2-1", "Running", "n1", ""],
            id="running",
        ),
        pytest.param({"metadata": {"name": "r-2-0"}}, ["  r-2-0", "Pending", "-", ""], id="new"),
        pytest.param(
            {
                "metadata": {"name": "r-2-0", "deletionTimestamp": "2025-01-01T00:00:00Z"},
                "status": {"phase": "Running", "reason": ""},
            },
            ["  r-2-0", "Terminating", "-", ""],
            id="deleted",
        ),
        pytest.param(
            {"metadata": {"name": "r-2"}, "status": {"phase": "Failed", "reason": "Evicted"}},
            ["  r-2", "Failed", "-", "Evicted"],
            id="evicted",
        ),
    ],
)
def test_status_lists_each_pod_of_the_attempt(pod: dict[str, Any], row: list[str]) -> None:
    assert usercli.pod_row(pod) == row


@pytest.mark.parametrize(
    "est,line",
    [
        ({}, ""),
        (
            {"uploadSeconds": 0.123, "fits": True, "windowSeconds": 60, "message": "m"},
            "0.1 s to upload, fits the 60 s a save has (m)",
        ),
        (
            {"uploadSeconds": 150.0, "fits": False, "windowSeconds": 120, "message": "m"},
            "150 s to upload, DOES NOT FIT the 120 s a save has (m)",
        ),
    ],
    ids=["none", "under-a-second", "too-slow"],
)
def test_status_shows_whether_a_save_fits(est: dict[str, Any], line: str) -> None:
    assert usercli.save_line(est) == line


@pytest.mark.parametrize(
    "progress,line",
    [
        ({}, ""),
        (
            {"step": 48, "attempt": 1, "observedAt": "2026-11-29T10:00:00Z", "summary": "step 48"},
            "step 48; seen 2026-11-29T10:00:00Z (attempt 1)",
        ),
        (
            {
                "step": 600,
                "totalSteps": 1000,
                "percent": 60.0,
                "stepsPerSecond": 1.0,
                "samplesPerSecond": 64.0,
                "etaSeconds": 400,
                "eta": "6m40s",
                "estimatedCompletionTime": "2026-11-29T10:06:40Z",
                "attempt": 2,
                "observedAt": "2026-11-29T10:00:00Z",
                "summary": "60%",
            },
            "step 600 of 1000 (60%), 1 steps/s, 64 samples/s, ETA 6m40s "
            "(2026-11-29T10:06:40Z); seen 2026-11-29T10:00:00Z (attempt 2)",
        ),
    ],
    ids=["none", "no-total", "with-eta"],
)
def test_status_shows_progress(progress: dict[str, Any], line: str) -> None:
    assert usercli.progress_line(progress) == line
