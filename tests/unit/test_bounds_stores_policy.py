"""A custom endpoint needs a credentials Secret on every scheme (decide/storagepolicy.py).

gs:// used to be the exception: without a Secret its calls to a custom endpoint went unsigned,
but they still came from the operator's network position, to a host the tenant chose, and the
answers' text came back in the run's status (a probe with read-back). docs/operations.md says a
custom endpoint needs ``credentialsSecret``; now it does on s3://, gs:// and az:// alike, unless
the administrator lists the endpoint (an emulator, a PrivateLink endpoint).
"""

from __future__ import annotations

import pytest

from trainingrun.api import StorageSpec
from trainingrun.decide import reasons as R
from trainingrun.decide.storagepolicy import refusal

ENDPOINT = "http://10.0.0.5:4443"


@pytest.mark.parametrize("uri", ["s3://bkt/p", "gs://bkt/p", "az://acct/cont/p"])
def test_a_custom_endpoint_needs_a_secret_on_every_scheme(uri: str) -> None:
    bare = StorageSpec(uri=uri, endpoint=ENDPOINT)
    refused = refusal(bare, "ns", "run")
    assert refused is not None and refused.reason == R.STORAGE_NOT_ALLOWED
    assert "without credentialsSecret" in refused.message
    listed = refusal(bare, "ns", "run", allowed_endpoints=(ENDPOINT,))
    assert listed is None  # an emulator the administrator allows
    with_secret = StorageSpec(uri=uri, endpoint=ENDPOINT, credentials_secret="c")
    assert refusal(with_secret, "ns", "run") is None
    assert refusal(StorageSpec(uri=uri), "ns", "run") is None  # the cloud's own service
