"""Keys a tenant's bucket lists are read with bounded numbers: a key whose step, epoch or rank
has more digits than a 64-bit number is not a checkpoint's key (the committer neither sweeps
nor aborts it), rather than an error that stops the commit (Python refuses to convert more
than 4300 digits).

Covers ``protocol.key_owner``, ``sweepable`` and ``abortable`` on such keys.
"""

from __future__ import annotations

import pytest

from trainingrun.checkpoint.manifest import RunManifest
from trainingrun.checkpoint.protocol import abortable, key_owner, sweepable

HUGE = "9" * 5000


@pytest.mark.parametrize(
    "key",
    [
        f"checkpoints/checkpoint-{HUGE}/e1/r0/model.bin",
        f"checkpoints/checkpoint-7/e{HUGE}/r0/model.bin",
        f"checkpoints/checkpoint-7/e1/r{HUGE}/model.bin",
    ],
    ids=["step", "epoch", "rank"],
)
def test_a_key_with_a_huge_number_is_not_a_checkpoint_s(key: str) -> None:
    assert key_owner(key) is None
    assert sweepable([key], RunManifest(), 2, []) == []
    assert not abortable(key, 2, 0)


def test_the_largest_step_is_still_read() -> None:
    step = 2**63 - 1
    assert key_owner(f"checkpoints/checkpoint-{step}/e1/r0/x") == (step, 1, 0)
