"""``spec.checkpoint.storage`` of the TrainingRun API (``trainingrun.api``), and the base of its
models: where a run's checkpoints are kept, in which of the three stores.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

# s3:// and gs:// bucket names (GCS also takes underscores), az:// a storage account (3-24
# lowercase letters and digits) then a container (3-63, letters, digits, hyphens).
URI_PATTERN = (
    r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]|gs://[a-z0-9][a-z0-9._\-]{1,61}[a-z0-9]"
    r"|az://[a-z0-9]{3,24}/[a-z0-9][a-z0-9\-]{1,61}[a-z0-9])(/.*)?$"
)


class ApiModel(BaseModel):
    """The base of every model of the API: camelCase names, unknown fields ignored, frozen."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )


class StorageSpec(ApiModel):
    """Where checkpoints are kept."""

    uri: str = Field(
        description=(
            "Bucket and prefix: s3://bucket/prefix (AWS S3 or an S3-compatible store), "
            "gs://bucket/prefix (Google Cloud Storage) or az://account/container/prefix (Azure "
            "Blob Storage). Checkpoints of a run live under <uri>/<namespace>/<run>/."
        ),
        pattern=URI_PATTERN,
        max_length=1024,
    )
    endpoint: str | None = Field(
        default=None,
        description=(
            "Endpoint URL: of an S3-compatible store (MinIO, Ceph, SeaweedFS) for s3://, a "
            "private endpoint or emulator for gs:// and az:// (Azure: the account URL, "
            "http://host:port/<account> for Azurite). Empty means the cloud's own."
        ),
        # No user or password (they would show in messages), no underscore (botocore refuses).
        pattern=r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?(/[^\s]*)?$",
        max_length=1024,
    )
    region: str | None = Field(
        default=None, description="Bucket region.", pattern=r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$"
    )
    credentials_secret: str | None = Field(
        default=None,
        description=(
            "Name of a Secret in the run's namespace with the store's keys: s3:// "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; gs:// GOOGLE_SERVICE_ACCOUNT_JSON (a "
            "service-account key file); az:// AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN. "
            "Empty means the pod's own identity (IRSA, GKE or Azure Workload Identity)."
        ),
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
    )

    @field_validator("endpoint")
    @classmethod
    def _port(cls, endpoint: str | None) -> str | None:
        if endpoint and urlsplit(endpoint).port == 0:  # .port raises ValueError above 65535
            raise ValueError("the port must be from 1 to 65535")
        return endpoint

    @property
    def scheme(self) -> str:
        """s3, gs or az: which store the uri names."""
        return self.uri.partition("://")[0]
