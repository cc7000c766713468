"""What Store's reads make of absence, against moto's in-memory S3 (no network).

Covers:

- get(), get_with_etag() and head() of a missing key give None, also when the word "bucket" is
  in the bucket's name (``my-bucket``) or in the key (``bucket-runs/``): a regression, absence
  used to be told from a missing bucket by that word in the error text;
- the same reads in a bucket that does not exist raise BucketNotFound, a NotFound.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fakes import BUCKET, NAMED_BUCKET
from trainingrun.storage.opener import BucketNotFound, NotFound, S3Store

# "bucket" in the bucket's name or in the key: a missing key must still read as a missing key.
PLAIN_BUCKET = BUCKET  # both are buckets of ``moto_client``
BUCKET_KEY, PLAIN_KEY = "bucket-runs/ml/r1/manifest.json", "runs/ml/r1/manifest.json"
READS = ["get", "get_with_etag", "head"]


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize(
    ("bucket", "key"),
    [
        pytest.param(NAMED_BUCKET, PLAIN_KEY, id="bucket-in-bucket-name"),
        pytest.param(PLAIN_BUCKET, BUCKET_KEY, id="bucket-in-key"),
        pytest.param(NAMED_BUCKET, BUCKET_KEY, id="bucket-in-both"),
    ],
)
def test_a_missing_key_is_none_whatever_the_names(
    moto_client: Any, bucket: str, key: str, read: str
) -> None:
    assert getattr(S3Store(moto_client, bucket), read)(key) is None


@pytest.mark.parametrize("read", READS)
def test_a_missing_bucket_raises(moto_client: Any, read: str) -> None:
    # moto names the code even on HEAD; real S3 answers HEAD with a bare 404, which reads as a
    # missing key (no body to tell them apart).
    with pytest.raises(BucketNotFound, match="'no-such-bucket' does not exist") as raised:
        getattr(S3Store(moto_client, "no-such-bucket"), read)(PLAIN_KEY)
    assert isinstance(raised.value, NotFound)  # what callers catch
