"""S3Store.list_multipart reads every page of ListMultipartUploads.

AWS answers at most 1,000 unfinished uploads a page, with ``IsTruncated`` and the markers of
the next one; the sidecar aborts the stale uploads it lists at its start, so an upload on a
later page would be left behind. The answers here are botocore's Stubber's: each request is
checked against the markers the page before gave.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from trainingrun.storage.opener import BucketNotFound, S3Store

BUCKET, PREFIX = "ckpt", "runs/r1/checkpoints/"


def _client() -> Any:
    return boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",  # no request leaves the Stubber
    )


def _page(keys: list[str], next_marker: tuple[str, str] | None) -> dict[str, Any]:
    page: dict[str, Any] = {
        "Bucket": BUCKET,
        "Uploads": [{"Key": f"{PREFIX}{k}", "UploadId": f"id-{k}"} for k in keys],
        "IsTruncated": next_marker is not None,
    }
    if next_marker is not None:
        page["NextKeyMarker"], page["NextUploadIdMarker"] = next_marker
    return page


@pytest.mark.parametrize(
    "pages",
    [
        pytest.param([["a"]], id="one-page"),
        pytest.param([[]], id="none"),
        pytest.param([["a", "b"], ["c"]], id="two-pages"),
        pytest.param([["a"], ["b"], ["c", "d"]], id="three-pages"),
    ],
)
def test_every_page_is_listed(pages: list[list[str]]) -> None:
    client = _client()
    with Stubber(client) as stub:
        expected: dict[str, Any] = {"Bucket": BUCKET, "Prefix": PREFIX}
        for i, keys in enumerate(pages):
            last = i == len(pages) - 1
            marker = None if last else (f"{PREFIX}{keys[-1]}", f"id-{keys[-1]}")
            stub.add_response("list_multipart_uploads", _page(keys, marker), dict(expected))
            if marker is not None:
                expected = {**expected, "KeyMarker": marker[0], "UploadIdMarker": marker[1]}
        listed = S3Store(client, BUCKET).list_multipart(PREFIX)
        stub.assert_no_pending_responses()

    assert listed == [(f"{PREFIX}{k}", f"id-{k}") for keys in pages for k in keys]


def test_a_missing_bucket_raises_bucket_not_found() -> None:
    client = _client()
    with Stubber(client) as stub:
        stub.add_client_error(
            "list_multipart_uploads", service_error_code="NoSuchBucket", http_status_code=404
        )
        with pytest.raises(BucketNotFound):
            S3Store(client, BUCKET).list_multipart(PREFIX)
