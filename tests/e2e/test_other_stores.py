"""The example end to end on gs:// (fake-gcs-server), az:// (Azurite) and s3:// on MinIO, the three
runs at once: the operator takes each run's fence in its store, the sidecar commits there, the
attempt is evicted (SIGTERM: the callback saves at the next step end, the sidecar drains), the
next attempt's restore verifies and resumes, and each run's final weights, read back from its own
store, are bitwise equal to an uninterrupted run's. The same chain on SeaweedFS is
test_full_chain.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.azurite import Azurite
from tests.e2e.test_full_chain import MAX_STEPS, Chain
from tests.fakegcs import FakeGcs
from tests.integration.stores import Bucket
from tests.integration.support import OperatorProcess, Runs, evict, read_committed
from tests.localenv import LocalEnv
from tests.minio import Minio
from tests.podrunner import RunnerHandle
from trainingrun.checkpoint.manifest import parse_run_manifest

pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def admin_lists_the_emulators(
    operator: OperatorProcess,
    localenv: LocalEnv,
    fake_gcs: FakeGcs,
    azurite: Azurite,
    minio: Minio,
) -> Iterator[None]:
    """The session's operator as its administrator sets it up where fake-gcs-server runs: the
    stores' endpoints in TRAININGRUN_ALLOWED_ENDPOINTS. A gs:// run on an emulator has no key
    to give, and a custom endpoint without a Secret is refused unless the admin lists it."""
    before = dict(operator.extra_env)
    endpoints = [localenv.s3_endpoint, fake_gcs.endpoint, azurite.endpoint, minio.endpoint]
    operator.stop()
    operator.extra_env = {**before, "TRAININGRUN_ALLOWED_ENDPOINTS": ",".join(endpoints)}
    operator.start()
    yield
    operator.stop()
    operator.extra_env = before
    operator.start()


def _on(bucket: Bucket, prefix: str, secret: str | None) -> Any:
    """The run's body with its storage in ``bucket``."""

    def shape(body: dict[str, Any]) -> dict[str, Any]:
        storage: dict[str, Any] = {"uri": bucket.uri(prefix), "endpoint": bucket.endpoint}
        if bucket.region:
            storage["region"] = bucket.region
        if secret:
            storage["credentialsSecret"] = secret
        body["spec"]["checkpoint"]["storage"] = storage
        return body

    return shape


def _final_weights(bucket: Bucket, chain: Chain) -> bytes:
    store = bucket.store()
    body = store.get(f"{chain.run_key}/manifest.json")
    assert body is not None
    entry = next(e for e in parse_run_manifest(body).entries if e.step == MAX_STEPS)

    def get(key: str) -> bytes:
        out = bytearray()
        size = dict(store.list_objects(key))[key]
        assert store.read_range(key, 0, size - 1, out.extend) == size
        return bytes(out)

    return read_committed(get, f"{chain.run_key}/{entry.part_prefixes[0]}", "model.safetensors")


def test_evicted_run_resumes_to_the_uninterrupted_weights_on_gcs_azure_and_minio(
    admin_lists_the_emulators: None,
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    core_v1: Any,
    fake_gcs: FakeGcs,
    azurite: Azurite,
    minio: Minio,
    tmp_path: Path,
    chain_reference: tuple[bytes, dict[int, float]],
) -> None:
    gcs = Bucket.fake_gcs(fake_gcs.endpoint, fake_gcs.bucket)
    az = Bucket.azurite(azurite.endpoint, azurite.account, azurite.container, azurite.key)
    s3 = Bucket.minio(minio)
    for name, bucket in (("azcreds", az), ("miniocreds", s3)):
        core_v1.create_namespaced_secret(
            runs.namespace,
            client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=bucket.secret),
        )
    for kind in ("gs", "az", "s3"):
        (tmp_path / kind).mkdir()
    chains = {
        bucket.kind: (
            bucket,
            Chain(
                runs,
                localenv,
                prefix,
                f"on-{bucket.kind}",
                tmp_path / bucket.kind,
                runner_nodes,
                _on(bucket, prefix, secret),
            ),
        )
        for bucket, secret in ((gcs, None), (az, "azcreds"), (s3, "miniocreds"))
    }
    for _, chain in chains.values():
        chain.wait_attempt(1)
        chain.wait_step(1, 15)
        evict(core_v1, runs.namespace, chain.pod(1))
    for kind, (bucket, chain) in chains.items():
        # Attempt 2 may be over by now (45 steps take ~12 s): its end and loss file tell.
        status = runs.wait_status(
            chain.name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run's end"
        )
        assert status["phase"] == "Succeeded", (kind, status)
        assert (status["attempt"], status["preemptions"]) == (2, 1), (kind, status)
        resumed = chain.resume_step(2)
        assert resumed >= 15, f"{kind}: resumed from step {resumed}, not the SIGTERM save"
        assert _final_weights(bucket, chain) == chain_reference[0], f"{kind}: weights differ"
        last = chain.step(2)
        assert last == MAX_STEPS
