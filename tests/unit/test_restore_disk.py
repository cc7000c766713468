"""The restore and the disk: what it does when the checkpoint does not fit, and its other errors
(``trainingrun.agent.restore.main`` over an in-memory bucket and a real folder).

Covers:

- parse_size(): Kubernetes quantities (binary and decimal suffixes, plain numbers, decimals,
  exponents) in bytes, rounded up; anything else refused;
- the disk check before any download: a checkpoint larger than the folder's free space, or than
  ``TRAININGRUN_SIZE_LIMIT`` minus what the folder already holds, exits
  EXIT_INSUFFICIENT_DISK with a termination message that names the step, the bytes needed, the
  bytes free and the fix, and downloads nothing; one that fits is restored;
- the volume filling up during the download (ENOSPC, EDQUOT): the same exit code and message,
  the staging folder removed;
- files that cannot share one folder (a file ``a`` and a file ``a/b``, also through a layout's
  extra files) and names with ``..``: a bad checkpoint (EXIT_CHECKPOINT_BAD) naming the file;
- any other error (EACCES, a bug): exit 1 with a termination message naming the error type and
  its message, and never a credential of the environment.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest

from tests.unit.fakes import FakeBucket
from trainingrun.agent.restore import Metrics, RestoreSettings, main, stop_on_sigterm
from trainingrun.agent.room import parse_size
from trainingrun.checkpoint import local
from trainingrun.checkpoint.manifest import CHECKPOINT_MANIFEST, Layout, checkpoint_prefix
from trainingrun.contract import (
    EXIT_CHECKPOINT_BAD,
    EXIT_ERROR,
    EXIT_INSUFFICIENT_DISK,
    EXIT_OK,
    EXIT_STOPPED,
)
from trainingrun.storage.opener import Location, Store

RUN = Location("ckpt", "runs/ml/r1")
STEP = 120
GiB = 1 << 30
WEIGHTS = b"w" * 4000
FILES = {"model.safetensors": WEIGHTS, "trainer_state.json": b"{}"}
NEEDED = sum(len(data) for data in FILES.values())


class Usage(NamedTuple):
    total: int
    used: int
    free: int


@pytest.fixture
def committed_bucket() -> FakeBucket:
    """An in-memory bucket with checkpoint ``STEP`` of ``RUN`` committed (``FILES``)."""
    store = FakeBucket()
    store.commit(RUN, STEP, files=FILES)
    return store


def _restore(
    store: FakeBucket, tmp_path: Path, size_limit: int | None = None, tell_trainer: bool = False
) -> tuple[int, str, Path]:
    """(exit code, termination message, checkpoint folder) of the restore of STEP."""
    folder = tmp_path / "checkpoints"
    folder.mkdir(exist_ok=True)
    log = tmp_path / "termination-log"
    settings = RestoreSettings(
        checkpoint_dir=folder,
        run=RUN,
        step=STEP,
        termination_log=log,
        size_limit=size_limit,
        tell_trainer=tell_trainer,
    )
    code = main(cast(Store, store), settings, Metrics())
    return code, log.read_text() if log.exists() else "", folder


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: Usage(100 * GiB, 0, free))


def _downloaded(folder: Path) -> list[str]:
    """The files in the folder, relative to it."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    return [p.relative_to(folder).as_posix() for p in files]


# -- parse_size -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        pytest.param("50Gi", 50 * GiB, id="gibibytes"),
        pytest.param("1.5Ki", 1536, id="decimal-kibibytes"),
        pytest.param("512Mi", 512 << 20, id="mebibytes"),
        pytest.param("2Ti", 2 << 40, id="tebibytes"),
        pytest.param("1Pi", 1 << 50, id="pebibytes"),
        pytest.param("1Ei", 1 << 60, id="exbibytes"),
        pytest.param("1k", 1000, id="kilo-lower-case"),
        pytest.param("1K", 1000, id="kilo-upper-case"),
        pytest.param("500M", 500_000_000, id="mega"),
        pytest.param("2G", 2_000_000_000, id="giga"),
        pytest.param("1T", 10**12, id="tera"),
        pytest.param("1P", 10**15, id="peta"),
        pytest.param("1E", 10**18, id="exa-not-an-exponent"),
        pytest.param("123", 123, id="plain"),
        pytest.param("0", 0, id="zero"),
        pytest.param("1.5", 2, id="fraction-rounded-up"),
        pytest.param("0.5Gi", GiB // 2, id="decimal-gibibytes"),
        pytest.param("2e3", 2000, id="exponent"),
        pytest.param("2E3", 2000, id="exponent-upper-case"),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "-1Gi", "1.5.2", "1 Gi", "1m", "1ki", "1e", "1GiB", "lots", "nan", "1e-3"],
    ids=repr,
)
def test_parse_size_refuses_what_is_not_a_byte_quantity(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_size(text)


# -- the disk check ---------------------------------------------------------------------------


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_any_download(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, NEEDED - 1)

    code, message, folder = _restore(committed_bucket, tmp_path)

    assert code == EXIT_INSUFFICIENT_DISK
    assert f"checkpoint-{STEP}" in message
    assert f"{NEEDED} bytes" in message
    assert f"{NEEDED - 1} bytes" in message
    assert "spec.checkpoint.sizeLimit" in message and "more disk" in message
    assert _downloaded(folder) == []
    assert list(folder.iterdir()) == []


def test_a_checkpoint_that_just_fits_is_restored(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, NEEDED)

    code, message, folder = _restore(committed_bucket, tmp_path)

    assert (code, message) == (EXIT_OK, "")
    assert (folder / f"checkpoint-{STEP}" / "model.safetensors").read_bytes() == WEIGHTS


@pytest.mark.parametrize(
    ("held", "limit", "code"),
    [
        pytest.param(0, NEEDED - 1, EXIT_INSUFFICIENT_DISK, id="limit-below-the-checkpoint"),
        pytest.param(100, NEEDED + 99, EXIT_INSUFFICIENT_DISK, id="limit-less-what-is-held"),
        pytest.param(100, NEEDED + 100, EXIT_OK, id="limit-with-room-for-both"),
        pytest.param(0, NEEDED, EXIT_OK, id="limit-exactly-the-checkpoint"),
    ],
)
def test_the_size_limit_less_what_the_folder_holds_must_fit_the_checkpoint(
    committed_bucket: FakeBucket, tmp_path: Path, held: int, limit: int, code: int
) -> None:
    folder = tmp_path / "checkpoints"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "events.out").write_bytes(b"x" * held)

    got, message, _ = _restore(committed_bucket, tmp_path, size_limit=limit)

    assert got == code, message
    if code == EXIT_INSUFFICIENT_DISK:
        assert f"{NEEDED} bytes" in message
        assert f"{limit - held} bytes" in message
        assert "spec.checkpoint.sizeLimit" in message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=errno.errorcode.get)
def test_the_volume_filling_up_during_the_download_is_insufficient_disk(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "pwrite", full)

    got, message, folder = _restore(committed_bucket, tmp_path)

    assert got == EXIT_INSUFFICIENT_DISK
    assert f"checkpoint-{STEP}" in message and f"{NEEDED} bytes" in message
    assert "spec.checkpoint.sizeLimit" in message
    assert _downloaded(folder) == []


# -- names that cannot share one folder -------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "layout", "named"),
    [
        pytest.param({"a": b"1", "a/b": b"2"}, None, "'a'", id="file-and-folder"),
        pytest.param({"a/b/c": b"1", "a/b": b"2"}, None, "'a/b'", id="folder-listed-first"),
        pytest.param(
            {"global_step50/latest/x": b"1", "global_step50/y": b"2"},
            Layout(format="deepspeed", extras={"global_step50/latest": "global_step50"}),
            "'global_step50/latest'",
            id="extra-file-and-folder",
        ),
    ],
)
def test_files_that_cannot_share_one_folder_are_a_bad_checkpoint(
    tmp_path: Path, files: dict[str, bytes], layout: Layout | None, named: str
) -> None:
    store = FakeBucket()
    store.commit(RUN, STEP, files=files, layout=layout)

    code, message, folder = _restore(store, tmp_path)

    assert code == EXIT_CHECKPOINT_BAD
    assert f"checkpoint-{STEP}" in message and named in message
    assert _downloaded(folder) == []


def test_a_name_with_dot_dot_is_a_bad_checkpoint(
    committed_bucket: FakeBucket, tmp_path: Path
) -> None:
    key = RUN.key(checkpoint_prefix(STEP), CHECKPOINT_MANIFEST)
    part = json.loads(committed_bucket.objects[key])
    part["files"][0]["path"] = "../../model.safetensors"
    committed_bucket.objects[key] = json.dumps(part).encode()

    code, message, _ = _restore(committed_bucket, tmp_path)

    assert code == EXIT_CHECKPOINT_BAD
    assert "'../../model.safetensors'" in message


# -- other errors -----------------------------------------------------------------------------


def test_another_os_error_exits_1_naming_the_error(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")

    def refused(fd: int, data: bytes, offset: int) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "pwrite", refused)

    code, message, _ = _restore(committed_bucket, tmp_path)

    assert code == EXIT_ERROR
    assert "PermissionError" in message and "Permission denied" in message
    assert "s3cr3t-value" not in message


def test_an_unexpected_error_exits_1_naming_its_type(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr("trainingrun.checkpoint.local.share", broken)

    code, message, _ = _restore(committed_bucket, tmp_path)

    assert code == EXIT_ERROR
    assert "RuntimeError" in message and "something nobody expected" in message


# -- the outcome a trainer beside the restore waits for ---------------------------------------


@pytest.mark.parametrize(
    ("free", "code", "says"),
    [
        pytest.param(NEEDED, EXIT_OK, f"checkpoint-{STEP} restored and verified", id="restored"),
        pytest.param(NEEDED - 1, EXIT_INSUFFICIENT_DISK, "insufficient disk", id="no-room"),
    ],
)
def test_the_outcome_is_written_last_for_a_trainer_that_waits(
    committed_bucket: FakeBucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    free: int,
    code: int,
    says: str,
) -> None:
    _free(monkeypatch, free)

    got, message, folder = _restore(committed_bucket, tmp_path, tell_trainer=True)

    outcome = local.read_restored(folder)
    assert got == code
    assert outcome is not None and outcome.exit_code == code
    assert says in outcome.message
    if code == EXIT_OK:
        assert (folder / f"checkpoint-{STEP}" / "model.safetensors").read_bytes() == WEIGHTS
    else:
        assert outcome.message == message


def test_no_outcome_file_when_no_trainer_waits(
    committed_bucket: FakeBucket, tmp_path: Path
) -> None:
    got, _, folder = _restore(committed_bucket, tmp_path)

    assert got == EXIT_OK
    assert local.read_restored(folder) is None


def test_an_outcome_that_cannot_be_written_fails_the_restore(
    committed_bucket: FakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(folder: Path, outcome: local.Restored) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local, "write_restored", refused)

    got, _, _ = _restore(committed_bucket, tmp_path, tell_trainer=True)

    assert got == EXIT_ERROR


def test_sigterm_beside_the_trainer_says_stopped_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod is being deleted while the trainer waits for the restore: the outcome says so
    before the process ends, so the trainer stops waiting (not at the end of the grace)."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)

    stop_on_sigterm(tmp_path)(signal.SIGTERM, None)

    outcome = local.read_restored(tmp_path)
    assert exits == [EXIT_STOPPED]
    assert outcome is not None and outcome.exit_code == EXIT_STOPPED
    assert "stopped" in outcome.message
