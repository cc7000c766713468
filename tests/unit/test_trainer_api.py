"""trainingrun.integrations.trainer, the framework-neutral side of a TrainingRun for any training
loop: the
stop request (SIGTERM or save-now), completion markers, the resume path, progress."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from trainingrun.checkpoint import local
from trainingrun.contract import ENV_CHECKPOINT_DIR, ENV_RESUME_FROM, ENV_RESUME_WAIT
from trainingrun.integrations import trainer


@pytest.fixture
def checkpoint_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder, which the environment names as the sidecar's checkpoint folder."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(ckdir))
    return ckdir


def test_checkpoint_dir_is_the_sidecars_folder_else_the_default(
    checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert trainer.checkpoint_dir() == checkpoint_dir
    monkeypatch.delenv(ENV_CHECKPOINT_DIR)
    assert trainer.checkpoint_dir("out") == Path("out")


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_resume_from_is_the_restored_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    path = tmp_path / ("checkpoint-20" if kind == "folder" else "epoch=0-step=20.ckpt")
    path.mkdir() if kind == "folder" else path.write_bytes(b"w")
    monkeypatch.setenv(ENV_RESUME_FROM, str(path))
    assert trainer.resume_from() == path


@pytest.mark.parametrize("value", [None, ""])
def test_resume_from_is_none_on_a_fresh_start(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(ENV_RESUME_FROM, raising=False)
    else:
        monkeypatch.setenv(ENV_RESUME_FROM, value)
    assert trainer.resume_from() is None


def test_resume_from_a_missing_path_names_the_volume_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_RESUME_FROM, str(tmp_path / "gone.pt"))
    with pytest.raises(FileNotFoundError, match=r"gone\.pt does not exist.*spec\.checkpoint"):
        trainer.resume_from()


@pytest.mark.parametrize(
    ("outcome", "returns"),
    [
        (local.Restored(0, "checkpoint-20 restored and verified"), True),
        (local.Restored(3, "checkpoint bad: model.safetensors: checksum mismatch"), False),
    ],
    ids=["restored", "checkpoint-bad"],
)
def test_resume_from_waits_for_the_restore_beside_the_trainer(
    checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch, outcome: local.Restored, returns: bool
) -> None:
    path = checkpoint_dir / "checkpoint-20"
    monkeypatch.setenv(ENV_RESUME_FROM, str(path))
    monkeypatch.setenv(ENV_RESUME_WAIT, "1")
    result: list[Path | BaseException | None] = []

    def resume() -> None:
        try:
            result.append(trainer.resume_from(folder=True))
        except BaseException as e:
            result.append(e)

    waiter = threading.Thread(target=resume)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and result == [], "resume_from returned before the restore ended"
    if returns:
        path.mkdir()
    local.write_restored(checkpoint_dir, outcome)
    waiter.join(10)

    assert not waiter.is_alive()
    if returns:
        assert result == [path]
    else:
        assert isinstance(result[0], trainer.RestoreFailed)
        assert "exited 3" in str(result[0]) and "checksum mismatch" in str(result[0])


def test_resume_from_does_not_wait_when_the_restore_ran_first(
    checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = checkpoint_dir / "checkpoint-20"
    path.mkdir()
    monkeypatch.setenv(ENV_RESUME_FROM, str(path))
    monkeypatch.delenv(ENV_RESUME_WAIT, raising=False)

    assert trainer.resume_from(folder=True) == path
    assert local.read_restored(checkpoint_dir) is None


@pytest.mark.parametrize(
    ("name", "marker"),
    [
        ("checkpoint-10", "checkpoint-10/.trainingrun-complete"),
        ("epoch=0-step=10.ckpt", "epoch=0-step=10.ckpt.trainingrun-complete"),
    ],
)
def test_mark_complete_marks_a_folder_or_a_file(
    checkpoint_dir: Path, name: str, marker: str
) -> None:
    path = checkpoint_dir / name
    if name.endswith(".ckpt"):
        path.write_bytes(b"weights")
    else:
        path.mkdir()
        (path / "model.bin").write_bytes(b"weights")
    trainer.mark_complete(str(path))
    assert (checkpoint_dir / marker).exists()
    assert [c.marked for c in local.scan(checkpoint_dir)] == [True]


def test_mark_complete_of_a_missing_path_is_an_error(checkpoint_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trainer.mark_complete(checkpoint_dir / "step_5")
    assert list(checkpoint_dir.iterdir()) == []


def test_report_progress_is_what_the_sidecar_reads(checkpoint_dir: Path) -> None:
    trainer.report_progress(7, 40)
    assert local.read_progress(checkpoint_dir) == local.Progress(7, 40)
    trainer.report_progress(8, None, samples_per_second=12.5, tokens_per_second=3e4)
    assert local.read_progress(checkpoint_dir) == local.Progress(8, None, 12.5, 3e4)


def test_throughput_is_the_rate_since_the_first_count() -> None:
    now = [100.0]
    rate = trainer.Throughput(clock=lambda: now[0])
    assert rate.rate(640) is None  # the first count: no rate yet
    now[0] += 10
    assert rate.rate(1280) == 64.0
    now[0] += 10
    assert rate.rate(2560) == 96.0  # since the first count, not the last step
    assert rate.rate(0) is None  # a count going back starts again


def test_stop_request_sees_sigterm_and_puts_the_old_handler_back(checkpoint_dir: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with trainer.StopRequest() as stop:
        assert stop.reason() is None
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the main thread is here
        assert stop.reason() == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_request_sees_the_sidecars_save_now_request(checkpoint_dir: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = trainer.StopRequest(install=False)
    assert stop.reason() is None
    local.request_save(checkpoint_dir, "preemption notice: node is being reclaimed")
    assert stop.reason() == "preemption notice: node is being reclaimed"
    assert signal.getsignal(signal.SIGTERM) is before  # install=False: no handler of its own


def test_stop_request_installs_nothing_outside_the_main_thread(checkpoint_dir: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    made: list[trainer.StopRequest] = []
    thread = threading.Thread(target=lambda: made.append(trainer.StopRequest()))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before
    local.request_save(checkpoint_dir, "notice")
    assert made[0].reason() == "notice"
