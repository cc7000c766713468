"""The HuggingFace Trainer callback's logic with transformers' real TrainerControl, TrainerState
and TrainingArguments, no training: SIGTERM and the save-now request become a save and a stop at
the next step end; the SIGTERM handler lives only between train begin and train end (and is put
back when training raises); completion markers after a save, by each node's local process zero;
a single process makes no collective call; progress; the resume folder; the exit code of an early
stop. Also: the example manifests (one pod, and a 2-node torchrun gang) are valid TrainingRuns of
the example. The multi-process behaviour is in test_hf_distributed.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml
from transformers import TrainerControl, TrainerState, TrainingArguments

from trainingrun.api import TrainingRunSpec
from trainingrun.checkpoint import local
from trainingrun.integrations import hf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def args(tmp_path: Path) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)


@pytest.fixture
def ckdir(tmp_path: Path) -> Path:
    return tmp_path / "ck"


@pytest.fixture
def sentinel_handler() -> Iterator[Any]:
    """A SIGTERM handler of the test's own, in place before training begins."""
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, before)


def state(
    step: int, max_steps: int = 60, world_zero: bool = True, local_zero: bool = True
) -> TrainerState:
    s = TrainerState(global_step=step, max_steps=max_steps)
    s.is_world_process_zero = world_zero
    s.is_local_process_zero = local_zero
    return s


class Run:
    """Drives a callback through the events the Trainer sends, step by step."""

    def __init__(self, args: TrainingArguments, ckdir: Path, max_steps: int = 60) -> None:
        self.args, self.max_steps = args, max_steps
        self.callback = hf.TrainingRunCallback(ckdir)
        self.control = TrainerControl()

    def begin(self, step: int = 0) -> Run:
        self.callback.on_train_begin(self.args, state(step, self.max_steps), self.control)
        return self

    def step_end(self, step: int) -> TrainerControl:
        self.control = TrainerControl()
        return self.callback.on_step_end(self.args, state(step, self.max_steps), self.control)

    def end(self, step: int) -> None:
        self.callback.on_train_end(self.args, state(step, self.max_steps), self.control)


def test_step_end_without_request_leaves_control_alone(
    args: TrainingArguments, ckdir: Path
) -> None:
    run = Run(args, ckdir).begin()
    control = run.step_end(1)
    assert (control.should_save, control.should_training_stop) == (False, False)
    run.end(60)
    assert run.callback.exit_code == 0


def test_sigterm_saves_and_stops_at_next_step_end(
    args: TrainingArguments, ckdir: Path, sentinel_handler: Any
) -> None:
    run = Run(args, ckdir).begin()
    assert signal.getsignal(signal.SIGTERM) != sentinel_handler
    assert not run.step_end(5).should_save
    signal.raise_signal(signal.SIGTERM)  # lands during step 6
    control = run.step_end(6)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert run.callback.stop_reason == "SIGTERM"
    run.end(6)
    assert run.callback.stopped_early
    assert run.callback.exit_code == hf.EXIT_STOPPED == 143
    assert signal.getsignal(signal.SIGTERM) is sentinel_handler


def test_save_now_request_saves_and_stops_with_its_reason(
    args: TrainingArguments, ckdir: Path
) -> None:
    run = Run(args, ckdir).begin()
    assert not run.step_end(11).should_training_stop
    local.request_save(ckdir, "preemption notice: spot-itn")
    control = run.step_end(12)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert run.callback.stop_reason == "preemption notice: spot-itn"
    run.end(12)
    assert run.callback.exit_code == hf.EXIT_STOPPED


def test_request_on_the_last_step_is_a_finished_run(args: TrainingArguments, ckdir: Path) -> None:
    run = Run(args, ckdir, max_steps=20).begin()
    local.request_save(ckdir, "notice")
    assert run.step_end(20).should_save
    run.end(20)
    assert not run.callback.stopped_early
    assert run.callback.exit_code == 0


def test_progress_is_written_at_train_begin_and_every_step_end(
    args: TrainingArguments, ckdir: Path
) -> None:
    run = Run(args, ckdir, max_steps=60).begin(step=30)  # a resumed run starts at its checkpoint
    assert local.read_progress(ckdir) == local.Progress(30, 60, save_seconds=0.0)
    run.step_end(31)
    run.step_end(32)
    progress = local.read_progress(ckdir)
    assert progress is not None
    assert (progress.step, progress.max_steps) == (32, 60)
    # Two steps of train_batch_size x accumulation since the process began, over their time.
    assert progress.samples_per_second is not None and progress.samples_per_second > 0


def test_progress_only_from_the_main_process(args: TrainingArguments, ckdir: Path) -> None:
    callback = hf.TrainingRunCallback(ckdir)
    callback.on_step_end(args, state(3, world_zero=False), TrainerControl())
    assert local.read_progress(ckdir) is None


def test_checkpoint_dir_defaults_to_env_then_output_dir(
    args: TrainingArguments, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAININGRUN_CHECKPOINT_DIR", str(tmp_path / "env"))
    hf.TrainingRunCallback().on_step_end(args, state(4), TrainerControl())
    assert local.read_progress(tmp_path / "env") == local.Progress(4, 60, save_seconds=0.0)
    monkeypatch.delenv("TRAININGRUN_CHECKPOINT_DIR")
    hf.TrainingRunCallback().on_step_end(args, state(5), TrainerControl())
    assert local.read_progress(Path(str(args.output_dir))) == local.Progress(
        5, 60, save_seconds=0.0
    )


def test_on_save_marks_the_saved_checkpoint_complete(args: TrainingArguments, ckdir: Path) -> None:
    folder = Path(str(args.output_dir)) / "checkpoint-40"
    folder.mkdir(parents=True)
    (folder / local.TRAINER_STATE).write_text("{}")
    other = Path(str(args.output_dir)) / "checkpoint-30"
    other.mkdir()
    hf.TrainingRunCallback(ckdir).on_save(args, state(40), TrainerControl())
    assert (folder / local.COMPLETE_MARKER).exists()
    assert not (other / local.COMPLETE_MARKER).exists()


def test_the_time_between_a_step_end_and_its_save_is_the_save_time(
    args: TrainingArguments, ckdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(hf.time, "monotonic", lambda: now[0])
    callback = hf.TrainingRunCallback(ckdir)
    callback.on_step_end(args, state(10), TrainerControl())
    now[0] += 4.0  # the Trainer saves checkpoint-10
    callback.on_save(args, state(10), TrainerControl())
    progress = local.read_progress(ckdir)
    assert progress is not None and progress.save_seconds == 4.0  # written at the save too
    now[0] += 1.0
    callback.on_step_end(args, state(11), TrainerControl())  # no save: no stall added
    now[0] += 1.0
    callback.on_step_end(args, state(12), TrainerControl())
    now[0] += 2.5
    callback.on_save(args, state(12), TrainerControl())
    progress = local.read_progress(ckdir)
    assert progress is not None and (progress.step, progress.save_seconds) == (12, 6.5)


def test_on_save_marks_another_nodes_folder_too(args: TrainingArguments, ckdir: Path) -> None:
    """Node 1's process: local process zero of its node, not world process zero."""
    folder = Path(str(args.output_dir)) / "checkpoint-7"
    folder.mkdir(parents=True)
    hf.TrainingRunCallback(ckdir).on_save(args, state(7, world_zero=False), TrainerControl())
    assert (folder / local.COMPLETE_MARKER).exists()


@pytest.mark.parametrize(
    ("exists", "local_zero"),
    [(False, True), (True, False)],
    ids=["folder-missing", "not-local-process-zero"],
)
def test_on_save_marks_nothing(
    args: TrainingArguments, ckdir: Path, exists: bool, local_zero: bool
) -> None:
    folder = Path(str(args.output_dir)) / "checkpoint-7"
    if exists:
        folder.mkdir(parents=True)
    callback = hf.TrainingRunCallback(ckdir)
    callback.on_save(args, state(7, world_zero=local_zero, local_zero=local_zero), TrainerControl())
    assert not (folder / local.COMPLETE_MARKER).exists()
    assert folder.exists() == exists  # a missing folder is not created either


def test_a_single_process_makes_no_collective_call(
    args: TrainingArguments, ckdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch.distributed (or with one process) nothing waits for other ranks."""

    def collective(*a: Any, **kw: Any) -> None:
        raise AssertionError("collective call in a single process")

    monkeypatch.setattr(hf, "any_rank", collective)
    monkeypatch.setattr(hf.dist, "barrier", collective)
    assert hf.world_size() == 1
    run = Run(args, ckdir).begin()
    local.request_save(ckdir, "notice")
    assert run.step_end(3).should_training_stop
    folder = Path(str(args.output_dir)) / "checkpoint-3"
    folder.mkdir(parents=True)
    run.callback.on_save(args, state(3), run.control)
    assert (folder / local.COMPLETE_MARKER).exists()


def test_resume_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAININGRUN_RESUME_FROM", raising=False)
    assert hf.resume_checkpoint() is None
    monkeypatch.setenv("TRAININGRUN_RESUME_FROM", "")
    assert hf.resume_checkpoint() is None
    restored = tmp_path / "checkpoint-30"
    restored.mkdir()
    monkeypatch.setenv("TRAININGRUN_RESUME_FROM", str(restored))
    assert hf.resume_checkpoint() == str(restored)
    monkeypatch.setenv("TRAININGRUN_RESUME_FROM", str(tmp_path / "checkpoint-40"))
    with pytest.raises(FileNotFoundError, match=r"checkpoint-40.*mounts the checkpoint volume"):
        hf.resume_checkpoint()


class FakeTrainer:
    """Stands in for transformers.Trainer: keeps callbacks and records the resume argument."""

    def __init__(self, args: TrainingArguments, fail: bool = False, stop_at: int = 0) -> None:
        self.args, self.fail, self.stop_at = args, fail, stop_at
        self.callbacks: list[Any] = []
        self.resumed_from: Any = "not called"

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def train(self, resume_from_checkpoint: Any = None) -> None:
        self.resumed_from = resume_from_checkpoint
        control = TrainerControl()
        for cb in self.callbacks:
            cb.on_train_begin(self.args, state(0, 10), control)
        if self.fail:
            raise RuntimeError("out of memory")
        for step in range(1, 11):
            if step == self.stop_at:
                signal.raise_signal(signal.SIGTERM)
            for cb in self.callbacks:
                control = cb.on_step_end(self.args, state(step, 10), control)
            if control.should_training_stop:
                break
        for cb in self.callbacks:
            cb.on_train_end(self.args, state(step, 10), control)


def test_train_resumes_from_env_and_returns_the_exit_code(
    args: TrainingArguments, ckdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored = tmp_path / "checkpoint-3"
    restored.mkdir()
    monkeypatch.setenv("TRAININGRUN_RESUME_FROM", str(restored))
    trainer = FakeTrainer(args, stop_at=4)
    assert hf.train(trainer, ckdir) == hf.EXIT_STOPPED
    assert trainer.resumed_from == str(restored)
    progress = local.read_progress(ckdir)
    assert progress is not None
    assert (progress.step, progress.max_steps) == (4, 10)  # signalled in step 4: its end

    monkeypatch.delenv("TRAININGRUN_RESUME_FROM")
    trainer = FakeTrainer(args)
    assert hf.train(trainer, ckdir) == 0
    assert trainer.resumed_from is None


def test_train_puts_the_handler_back_when_training_raises(
    args: TrainingArguments, ckdir: Path, sentinel_handler: Any
) -> None:
    with pytest.raises(RuntimeError, match="out of memory"):
        hf.train(FakeTrainer(args, fail=True), ckdir)
    assert signal.getsignal(signal.SIGTERM) is sentinel_handler


def test_attach_adds_one_callback(args: TrainingArguments) -> None:
    trainer = FakeTrainer(args)
    callback = hf.attach(trainer)
    assert trainer.callbacks == [callback]
    assert isinstance(callback, hf.TrainingRunCallback)


def test_sigterm_after_training_ends_the_process_again(tmp_path: Path) -> None:
    """Once training ended, SIGTERM has its default effect again: the process dies of it."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from transformers import TrainerControl, TrainerState, TrainingArguments
        from trainingrun.integrations import hf
        args = TrainingArguments(output_dir={str(tmp_path)!r}, report_to=[], use_cpu=True)
        cb = hf.TrainingRunCallback({str(tmp_path)!r})
        s = TrainerState(global_step=0, max_steps=5)
        cb.on_train_begin(args, s, TrainerControl())
        os.kill(os.getpid(), signal.SIGTERM)       # caught: training is on
        assert cb.on_step_end(args, s, TrainerControl()).should_training_stop
        cb.on_train_end(args, s, TrainerControl())
        print("survived while training", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)       # default again: ends the process
        print("survived after training", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["survived while training"]


def test_multinode_manifest_runs_the_example_under_torchrun() -> None:
    """Two pods, torchrun with no node arguments (the operator sets PET_*), the gang defaults
    its comments state, a grace period above torchrun's shutdown timeout."""
    manifest = yaml.safe_load((REPO / "examples" / "trainingrun-multinode.yaml").read_text())
    spec = TrainingRunSpec.model_validate(manifest["spec"])
    assert spec.replicas == 2
    assert (spec.gang.master_port, spec.gang.start_timeout_seconds) == (29500, 600)
    assert manifest["spec"]["gang"] == {"masterPort": 29500, "startTimeoutSeconds": 600}
    (trainer,) = spec.template["spec"]["containers"]
    command = [*trainer["command"], *trainer["args"]]
    assert command[0] == "torchrun"
    assert "examples/finetune.py" in command
    assert (REPO / "examples" / "finetune.py").is_file()
    node_options = ("--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master-port")
    assert not [a for a in command if a.startswith(node_options)]
    shutdown = next(int(a.split("=")[1]) for a in command if a.startswith("--shutdown-timeout="))
    assert shutdown < spec.preemption.termination_grace_period_seconds


def test_example_manifest_runs_the_example_script() -> None:
    manifest = yaml.safe_load((REPO / "examples" / "trainingrun-finetune.yaml").read_text())
    spec = TrainingRunSpec.model_validate(manifest["spec"])
    (trainer,) = spec.template["spec"]["containers"]
    assert trainer["name"] == "trainer"
    assert trainer["command"] == ["python", "examples/finetune.py"]
    assert (REPO / trainer["command"][1]).is_file()
    assert spec.checkpoint.local_path == "/checkpoints"
