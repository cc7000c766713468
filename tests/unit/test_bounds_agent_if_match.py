"""Half-conditional stores: an endpoint that honours If-None-Match and ignores If-Match
(``commit.detect_capabilities`` and the sync sidecar's start, over moto's S3 with the If-Match
header dropped on the way).

Covers:

- the probe: If-Match found honoured on moto, ignored where the header is dropped, and unusable
  where the endpoint refuses it; not probed where If-None-Match is ignored too (the commits then
  write plainly and read back); the probe's objects removed; ``describe`` says what it found;
- the sidecar of an old attempt on a half-conditional endpoint, with the operator taking the
  fence for the next attempt between the sidecar's read of ``manifest.json`` and its
  compare-and-swap: it refuses to commit at its start (exit 1, a termination message naming the
  endpoint's fault and the fix), and the fence stays the new attempt's. (Before, it committed
  over the fence and set it back to its own epoch.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import BUCKET
from trainingrun.agent.sidecar import SyncSettings
from trainingrun.agent.sync import Sync
from trainingrun.checkpoint import commit, local
from trainingrun.checkpoint.lookup import read_run_manifest
from trainingrun.checkpoint.manifest import RUN_MANIFEST
from trainingrun.contract import EXIT_ERROR, checkpoint_dirname
from trainingrun.storage.checksum import CRC64NVME
from trainingrun.storage.opener import Location, S3Store, StorageRejected, Store

RUN = Location(BUCKET, "runs/ml/r1")
STEP = 10


class HalfConditional(S3Store):
    """An endpoint that honours If-None-Match and ignores If-Match (the header never reaches
    moto); ``before_cas`` runs once, before the first compare-and-swap of manifest.json."""

    def __init__(self, client: Any, before_cas: Callable[[], object] | None = None) -> None:
        super().__init__(client, BUCKET)
        self.before_cas = before_cas

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        if kwargs.pop("if_match", None) is not None and key == RUN.key(RUN_MANIFEST):
            hook, self.before_cas = self.before_cas, None
            if hook is not None:
                hook()
        return super().put(key, data, **kwargs)


class RefusesIfMatch(S3Store):
    """An endpoint that answers the If-Match header with an error (501 NotImplemented)."""

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        if kwargs.get("if_match") is not None:
            raise StorageRejected(f"{key}: NotImplemented")
        return super().put(key, data, **kwargs)


class IgnoresBoth(S3Store):
    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        kwargs.pop("if_match", None)
        kwargs.pop("if_none_match", None)
        return super().put(key, data, **kwargs)


def _keys(client: Any) -> set[str]:
    return {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents") or []}


# -- the probe --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "conditional", "if_match", "says"),
    [
        pytest.param(S3Store, True, True, "conditional writes yes", id="honours-both"),
        pytest.param(HalfConditional, True, False, "If-Match ignored", id="ignores-if-match"),
        pytest.param(RefusesIfMatch, True, False, "If-Match ignored", id="refuses-if-match"),
        pytest.param(IgnoresBoth, False, False, "conditional writes no", id="ignores-both"),
    ],
)
def test_the_probe_finds_out_whether_if_match_is_honoured(
    client: Any, kind: type[S3Store], conditional: bool, if_match: bool, says: str
) -> None:
    before = _keys(client)

    caps = commit.detect_capabilities(kind(client, BUCKET), RUN)

    assert (caps.conditional_writes, caps.if_match) == (conditional, if_match)
    assert caps.algorithm is CRC64NVME
    assert says in caps.describe()
    assert _keys(client) == before


# -- the sidecar ------------------------------------------------------------------------------


def _saved(root: Path) -> None:
    """A complete checkpoint of STEP, as the HF Trainer leaves it."""
    folder = root / checkpoint_dirname(STEP)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 5000)
    (folder / local.TRAINER_STATE).write_text('{"global_step": 10}')
    local.mark_complete(folder)


def test_an_old_attempt_on_a_half_conditional_endpoint_never_commits_over_the_fence(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = S3Store(client, BUCKET)
    _, epoch = commit.take_fence(honest, RUN, "uid", 1)
    operator = HalfConditional(client)

    def the_next_attempt_starts() -> None:
        commit.take_fence(operator, RUN, "uid", 2, None, commit.IfMatch())

    endpoint: Store = HalfConditional(client, before_cas=the_next_attempt_starts)
    _saved(tmp_path / "checkpoints")
    settings = SyncSettings(
        checkpoint_dir=tmp_path / "checkpoints",
        run=RUN,
        epoch=epoch,
        attempt=1,
        quiet_seconds=0,
        termination_log=tmp_path / "termination-log",
    )
    sync = Sync(endpoint, settings)
    # One pass, then the pod stops (instead of watching the folder).
    monkeypatch.setattr(sync, "wait_for_changes", sync.stopping.set)

    code = sync.run()

    manifest = read_run_manifest(honest, RUN)
    assert manifest is not None
    assert [e.step for e in manifest.entries] == []
    assert (manifest.fence, manifest.fence_holder) == (epoch, "uid/1")  # no newer attempt yet
    assert code == EXIT_ERROR
    message = (tmp_path / "termination-log").read_text()
    assert "checkpoints are not being committed" in message
    assert "ignores If-Match" in message and "docs/storage.md" in message
