"""The stores as the agents and a test see them: SeaweedFS and MinIO (s3://), fake-gcs-server
(gs://) and Azurite (az://). ``Bucket`` gives a run's uri, the environment the pod builder
would give sync and restore, and this package's own ``Store`` for a test to read, corrupt or
list what the agents wrote, so one test body runs against each store."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import localenv
from tests.integration.support import wait_for
from tests.minio import REGION, Minio
from trainingrun.contract import ENV_STORAGE_ENDPOINT
from trainingrun.storage.opener import Location, Store, open_location, parse_uri

# Variables of the machine an agent must not inherit: each store's own credential chain.
_FOREIGN = ("AWS_", "TRAININGRUN_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR_HOST")


@dataclass(frozen=True)
class Bucket:
    """One store's bucket (container); ``agent_vars`` reach the store as the pod's env does."""

    kind: str  # s3 (SeaweedFS, MinIO), gs, az
    root: str  # the bucket's uri: s3://trainingrun, gs://trainingrun, az://acct/trainingrun
    endpoint: str
    secret: dict[str, str] | None
    agent_vars: dict[str, str] = field(default_factory=dict)
    region: str | None = None
    # Whether the store lists the unfinished uploads under a folder's prefix: MinIO lists a
    # key's own only (docs/storage-s3.md).
    lists_uploads_by_prefix: bool = True

    @classmethod
    def seaweedfs(cls, env: localenv.LocalEnv) -> Bucket:
        keys = (env.s3_access_key, env.s3_secret_key)
        return cls._s3(env.bucket, env.s3_endpoint, *keys, env.s3_region)

    @classmethod
    def minio(cls, server: Minio) -> Bucket:
        keys = (server.access_key, server.secret_key)
        return cls._s3(server.bucket, server.endpoint, *keys, REGION, lists_uploads_by_prefix=False)

    @classmethod
    def _s3(
        cls, bucket: str, endpoint: str, access_key: str, secret_key: str, region: str, **kw: bool
    ) -> Bucket:
        keys = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
        agent = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": region, **keys}
        return cls("s3", f"s3://{bucket}", endpoint, keys, agent, region, **kw)

    @classmethod
    def fake_gcs(cls, endpoint: str, bucket: str) -> Bucket:
        # No Secret: calls to an endpoint go unsigned (an emulator takes any).
        return cls("gs", f"gs://{bucket}", endpoint, None, {ENV_STORAGE_ENDPOINT: endpoint})

    @classmethod
    def azurite(cls, endpoint: str, account: str, container: str, key: str) -> Bucket:
        secret = {"AZURE_STORAGE_KEY": key}
        agent = {ENV_STORAGE_ENDPOINT: endpoint, **secret}
        return cls("az", f"az://{account}/{container}", endpoint, secret, agent)

    def uri(self, run_key: str) -> str:
        return f"{self.root}/{run_key}"

    def location(self, run_key: str = "") -> Location:
        return parse_uri(self.uri(run_key) if run_key else self.root)

    def env(self, uri: str, checkpoint_dir: Path, **extra: str) -> dict[str, str]:
        """The environment the operator gives sync and restore, metrics off (tests run many)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
        env.update(self.agent_vars)
        env.update(
            {
                "TRAININGRUN_STORAGE_URI": uri,
                "TRAININGRUN_CHECKPOINT_DIR": str(checkpoint_dir),
                "TRAININGRUN_METRICS_PORT": "0",
                "TRAININGRUN_QUIET_SECONDS": "1",
                "TRAININGRUN_SYNC_NICE": "0",
            }
        )
        env.update(extra)
        return env

    def store(self) -> Store:
        return open_location(self.location(), self.endpoint, self.region, self.secret)

    def manifest(self, run_key: str, store: Store | None = None) -> dict[str, Any] | None:
        """The run's manifest.json as JSON; None while there is none."""
        body = (store or self.store()).get(f"{run_key}/manifest.json")
        return dict(json.loads(body)) if body is not None else None

    def keys(self, prefix: str) -> list[str]:
        return [key for key, _ in self.store().list_objects(prefix)]

    def wait_committed(self, run_key: str, step: int, timeout: float) -> dict[str, Any]:
        """Waits until ``step`` is in the run's manifest.json; returns the manifest."""
        store = self.store()

        def committed() -> dict[str, Any] | None:
            manifest = self.manifest(run_key, store)
            if manifest is None or not any(e["step"] == step for e in manifest["entries"]):
                return None
            return manifest

        return wait_for(
            committed, timeout, f"checkpoint-{step} committed under {self.uri(run_key)}"
        )
