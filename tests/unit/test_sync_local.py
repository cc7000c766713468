"""The sidecar's local side: the checkpoint folder, the downward API file, and transfer pacing.

Covers:

- local.scan() on real temporary folders: ``checkpoint-<step>/`` folders only (oldest step first,
  numerically), other folders, plain files and a symlinked checkpoint folder ignored, nested
  files as POSIX relative paths, the completion marker noticed but never listed as a file,
  symlinked files and folders inside a checkpoint not uploaded, ``trainer_state.json`` noticed
  only at the top, newest mtime, a missing folder;
- LocalCheckpoint.complete(now, quiet, trainer_gone): marked, trainer_state.json plus the quiet
  period (exact boundary), trainer gone, and never without either;
- read_annotation() on files in the downward API format (``key="value"`` lines as Go's %q
  writes them): escaped quotes and backslashes, ``\\n``, ``\\u`` escapes, raw UTF-8, an empty
  value, a key that only shares a prefix, a missing file or folder; hypothesis round-trip of
  values quoted the way Go quotes them;
- local.request_save / save_requested and write_progress / read_progress: round trips, the
  control folder created, atomic replace (no temporary left), garbage tolerated;
- local.prepare_control_dir and local.share: the control folder and a restored tree are
  writable by every container of the pod (whatever the umask or an earlier mode);
- NoticeRelay.check: a notice becomes one save request; one that cannot be written is counted
  and logged with the fix, and does not stop the sidecar;
- local.is_control and the folder watcher: control-file writes (progress at every step) do not
  wake the sync loop, a checkpoint file does (real inotify on a temporary folder);
- parts.Throttle with a fake clock: no rate never sleeps; the total sleep is (bytes before
  the last take) / rate; idle time gives no burst credit;
- transfer.format_bytes and Progress.line() / add(): units, percent, files, rate, and one log
  line per period.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trainingrun.agent import parts, transfer
from trainingrun.agent.parts import Throttle
from trainingrun.agent.sidecar import LayoutReport, Metrics, read_annotation
from trainingrun.agent.sidecar import watch as sync_watch
from trainingrun.agent.sync import Sync, SyncSettings
from trainingrun.agent.transfer import MiB, Progress
from trainingrun.checkpoint import local
from trainingrun.checkpoint.layouts import Found, Proof
from trainingrun.checkpoint.local import COMPLETE_MARKER, TRAINER_STATE, LocalCheckpoint, scan
from trainingrun.contract import ANNOTATION_NOTICE, format_bytes
from trainingrun.storage.opener import Location, Store


def _write(path: Path, data: bytes = b"x", mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


# -- scan -------------------------------------------------------------------------------


@pytest.fixture
def checkpoint_tree(tmp_path: Path) -> Path:
    """checkpoint-9 (marked), checkpoint-10 (trainer state), checkpoint-100 (neither), and
    things that are not checkpoints."""
    root = tmp_path / "checkpoints"
    _write(root / "checkpoint-9" / "model.bin", b"m" * 10, mtime=1000)
    _write(root / "checkpoint-9" / COMPLETE_MARKER, b"", mtime=1005)
    _write(root / "checkpoint-10" / TRAINER_STATE, b"{}", mtime=2000)
    _write(root / "checkpoint-10" / "sub" / "rank-0.pt", b"r" * 3, mtime=2001)
    _write(root / "checkpoint-100" / "model.bin", b"partial", mtime=3000)
    for other in (
        "checkpoint-abc",
        "tmp-checkpoint-5",
        "checkpoint-5.tmp",
        ".restore-checkpoint-5",
        "runs",
        ".trainingrun",
    ):
        _write(root / other / TRAINER_STATE, b"{}")
    _write(root / "checkpoint-7", b"a file, not a folder")
    (root / "checkpoint-8").symlink_to(root / "checkpoint-9", target_is_directory=True)
    return root


def test_scan_finds_checkpoint_folders_oldest_first(checkpoint_tree: Path) -> None:
    found = scan(checkpoint_tree)

    assert [c.step for c in found] == [9, 10, 100]
    assert [c.path for c in found] == [checkpoint_tree / f"checkpoint-{s}" for s in (9, 10, 100)]


def test_scan_reads_marker_state_files_and_mtime(checkpoint_tree: Path) -> None:
    by_step = {c.step: c for c in scan(checkpoint_tree)}

    nine, ten, hundred = by_step[9], by_step[10], by_step[100]
    assert (nine.found.proof, nine.files) == (Proof.COMPLETE, (("model.bin", 10),))
    assert nine.found.newest_mtime == 1005  # the marker counts as a change
    assert ten.found.proof is Proof.QUIET  # trainer_state.json, no marker
    assert ten.files == (("sub/rank-0.pt", 3), (TRAINER_STATE, 2))
    assert ten.found.newest_mtime == 2001
    assert hundred.found.proof is Proof.INCOMPLETE  # no trainer_state.json yet


def test_scan_does_not_upload_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    secret = _write(tmp_path / "outside" / "secret.txt", b"do not upload")
    ckpt = root / "checkpoint-1"
    _write(ckpt / "model.bin", b"12345")
    (ckpt / "link.txt").symlink_to(secret)
    (ckpt / "linked-dir").symlink_to(secret.parent, target_is_directory=True)
    (ckpt / "dangling").symlink_to(tmp_path / "nowhere")

    [found] = scan(root)

    assert found.files == (("model.bin", 5),)


def test_trainer_state_counts_only_at_the_top(tmp_path: Path) -> None:
    _write(tmp_path / "checkpoint-3" / "nested" / TRAINER_STATE, b"{}")

    [found] = scan(tmp_path)

    assert found.found.proof is Proof.INCOMPLETE
    assert found.files == ((f"nested/{TRAINER_STATE}", 2),)


def test_scan_of_a_missing_or_empty_folder(tmp_path: Path) -> None:
    assert scan(tmp_path / "not-yet") == []
    assert scan(tmp_path) == []


def _ckpt(marked: bool, has_state: bool, newest: float = 100.0) -> LocalCheckpoint:
    proof = Proof.COMPLETE if marked else Proof.QUIET if has_state else Proof.INCOMPLETE
    found = Found("hf", 1, "checkpoint-1", ("a",), "checkpoint-1", proof, newest)
    return LocalCheckpoint(found, Path("/c/checkpoint-1"), (("a", 1),))


@pytest.mark.parametrize(
    ("ckpt", "now", "trainer_gone", "complete"),
    [
        pytest.param(_ckpt(True, False), 100.0, False, True, id="marked-at-once"),
        pytest.param(_ckpt(False, True), 109.9, False, False, id="state-still-quiet-period"),
        pytest.param(_ckpt(False, True), 110.0, False, True, id="state-quiet-period-over"),
        pytest.param(_ckpt(False, True), 100.0, True, True, id="state-trainer-gone"),
        pytest.param(_ckpt(False, False), 10_000.0, False, False, id="no-state-never"),
        pytest.param(_ckpt(False, False), 10_000.0, True, False, id="no-state-trainer-gone"),
    ],
)
def test_complete(ckpt: LocalCheckpoint, now: float, trainer_gone: bool, complete: bool) -> None:
    assert ckpt.complete(now, quiet_seconds=10.0, trainer_gone=trainer_gone) is complete


def test_scanned_checkpoint_completes_after_the_quiet_period(checkpoint_tree: Path) -> None:
    by_step = {c.step: c for c in scan(checkpoint_tree)}

    assert by_step[9].complete(0.0, 10.0, False)
    assert not by_step[10].complete(2010.9, 10.0, False)
    assert by_step[10].complete(2011.0, 10.0, False)
    assert not by_step[100].complete(1e9, 10.0, True)


# -- the downward API annotations file ---------------------------------------------------

NOTICE = "trainingrun.dev/preemption-notice"


def _annotations(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "annotations"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            f'{NOTICE}="taint karpenter.sh/disrupted"', "taint karpenter.sh/disrupted", id="plain"
        ),
        pytest.param(f'{NOTICE}="said \\"now\\""', 'said "now"', id="escaped-quotes"),
        pytest.param(f'{NOTICE}="C:\\\\x"', "C:\\x", id="escaped-backslash"),
        pytest.param(f'{NOTICE}="a\\nb\\tc"', "a\nb\tc", id="newline-and-tab"),
        pytest.param(f'{NOTICE}="caf\\u00e9 \\U0001f600"', "café 😀", id="unicode-escapes"),
        pytest.param(f'{NOTICE}="nœud préempté"', "nœud préempté", id="raw-utf8"),
        pytest.param(f'{NOTICE}=""', "set", id="empty-value"),
    ],
)
def test_read_annotation(tmp_path: Path, line: str, expected: str) -> None:
    path = _annotations(
        tmp_path,
        'kubernetes.io/config.seen="2025-01-01T00:00:00Z"',
        line,
        'zz/other="x"',
    )

    assert read_annotation(path, NOTICE) == expected


def test_read_annotation_absent(tmp_path: Path) -> None:
    path = _annotations(tmp_path, f'{NOTICE}-not="x"', f'x{NOTICE}="y"', "no equals sign")

    assert read_annotation(path, NOTICE) is None
    assert read_annotation(tmp_path / "missing", NOTICE) is None
    assert read_annotation(path / "annotations", NOTICE) is None  # podinfo dir is a file


def _go_quote(value: str) -> str:
    """The way Go's %q writes a string: escapes for quotes, backslashes and unprintables,
    printable Unicode as is."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{ord(ch):02x}"))
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


@given(value=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=40))
def test_read_annotation_round_trips_go_quoting(
    value: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = _annotations(
        tmp_path_factory.mktemp("podinfo"), 'a/b="c"', f"{NOTICE}={_go_quote(value)}"
    )

    assert read_annotation(path, NOTICE) == value


# -- control files --------------------------------------------------------------------------


def test_save_request_round_trip(tmp_path: Path) -> None:
    assert local.save_requested(tmp_path) is None

    local.request_save(tmp_path, "preemption notice: taint x")

    assert (tmp_path / local.CONTROL_DIR).is_dir()
    assert local.save_requested(tmp_path) == "preemption notice: taint x"
    local.request_save(tmp_path, "SIGTERM")
    assert local.save_requested(tmp_path) == "SIGTERM"


def test_empty_save_request_still_counts(tmp_path: Path) -> None:
    _write(local.control_path(tmp_path, local.SAVE_NOW), b"\n")

    assert local.save_requested(tmp_path) == "requested"


@pytest.mark.parametrize(
    "progress",
    [local.Progress(120, 1000), local.Progress(0, None)],
    ids=["with-max-steps", "without-max-steps"],
)
def test_progress_round_trip(tmp_path: Path, progress: local.Progress) -> None:
    local.write_progress(tmp_path, local.Progress(1, 2))
    local.write_progress(tmp_path, progress)

    assert local.read_progress(tmp_path) == progress
    assert os.listdir(tmp_path / local.CONTROL_DIR) == [local.PROGRESS]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b'{"step": 1', id="half-written"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"[1, 2]", id="array"),
        pytest.param(b"null", id="null"),
        pytest.param(b'{"max_steps": 5}', id="no-step"),
        pytest.param(b'{"step": "twelve"}', id="step-not-a-number"),
        pytest.param(b'{"step": null}', id="step-null"),
        pytest.param(b'{"step": NaN}', id="step-nan"),
        pytest.param(b'{"step": Infinity}', id="step-infinite"),
        pytest.param(b'{"step": 1e999}', id="step-overflows"),
        pytest.param(b"[" * 100_000, id="deeply-nested"),
    ],
)
def test_garbage_progress_is_ignored(tmp_path: Path, data: bytes) -> None:
    _write(local.control_path(tmp_path, local.PROGRESS), data)

    assert local.read_progress(tmp_path) is None


def test_missing_progress_is_none(tmp_path: Path) -> None:
    assert local.read_progress(tmp_path) is None


@pytest.mark.parametrize(
    ("relative", "control"),
    [
        (".trainingrun", True),
        (".trainingrun/progress.json", True),
        (".trainingrun/.progress.json.tmp", True),
        (".", False),
        ("checkpoint-10", False),
        ("checkpoint-10/model.safetensors", False),
        ("checkpoint-10/.trainingrun", False),
        (".trainingrun-old/progress.json", False),
        ("trainingrun/progress.json", False),
    ],
)
def test_is_control(relative: str, control: bool) -> None:
    assert local.is_control(relative) is control


@pytest.fixture
def umask_022() -> Any:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("existing_mode", [None, 0o755, 0o700])
def test_control_dir_is_writable_by_every_container(
    tmp_path: Path, existing_mode: int | None
) -> None:
    if existing_mode is not None:
        (tmp_path / local.CONTROL_DIR).mkdir(mode=existing_mode)

    path = local.prepare_control_dir(tmp_path)

    assert path == tmp_path / local.CONTROL_DIR
    assert path.stat().st_mode & 0o777 == 0o777


@pytest.mark.usefixtures("umask_022")
def test_share_makes_a_restored_tree_writable_by_every_container(tmp_path: Path) -> None:
    _write(tmp_path / "checkpoint-5" / "model.bin")
    _write(tmp_path / "checkpoint-5" / "sub" / "part.bin")
    (tmp_path / "checkpoint-5" / "model.bin").chmod(0o600)

    local.share(tmp_path / "checkpoint-5")

    modes = {
        p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777
        for p in [tmp_path / "checkpoint-5", *(tmp_path / "checkpoint-5").rglob("*")]
    }
    assert modes == {
        "checkpoint-5": 0o777,
        "checkpoint-5/sub": 0o777,
        "checkpoint-5/model.bin": 0o666,
        "checkpoint-5/sub/part.bin": 0o666,
    }


def _sync_with_notice(tmp_path: Path) -> Sync:
    podinfo = tmp_path / "podinfo"
    _write(podinfo / "annotations", f'{ANNOTATION_NOTICE}="spot-itn"\n'.encode())
    settings = SyncSettings(
        checkpoint_dir=tmp_path / "ckpt", run=Location("bucket", "runs"), podinfo_dir=podinfo
    )
    (tmp_path / "ckpt").mkdir()
    return Sync(cast(Store, None), settings)


def test_notice_asks_the_trainer_to_save_once(tmp_path: Path) -> None:
    sync = _sync_with_notice(tmp_path)

    sync.notice.check()

    assert local.save_requested(tmp_path / "ckpt") == "preemption notice: spot-itn"
    assert sync.notice.sent


def test_notice_that_cannot_be_written_does_not_stop_the_sidecar(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sync = _sync_with_notice(tmp_path)
    _write(tmp_path / "ckpt" / local.CONTROL_DIR, b"not a folder")  # any OSError will do

    sync.notice.check()
    sync.notice.check()

    assert sync.notice.sent
    failed = sync.metrics.registry.get_sample_value(
        "trainingrun_sync_failures_total", {"reason": "SaveRequestFailed"}
    )
    assert failed == 1
    assert "runAsUser" in caplog.text


def test_watcher_wakes_for_checkpoint_files_not_for_progress(tmp_path: Path) -> None:
    wake = threading.Event()
    observer = sync_watch(tmp_path, wake)
    assert observer is not None
    try:
        # Creating the control folder changes the checkpoint folder itself: one wake-up, once.
        local.write_progress(tmp_path, local.Progress(1, 100))
        wake.wait(5.0)
        time.sleep(0.2)
        wake.clear()

        for step in range(2, 7):
            local.write_progress(tmp_path, local.Progress(step, 100))
        assert not wake.wait(0.5), "progress writes woke the sync loop"

        _write(tmp_path / "checkpoint-5" / "model.bin", b"weights")

        assert wake.wait(5.0), "a new checkpoint file did not wake the sync loop"
    finally:
        observer.stop()
        observer.join(5.0)


# -- throttle and progress lines ---------------------------------------------------------


class FakeClock:
    """Stands in for the ``time`` module of trainingrun.agent.parts and .transfer: sleep moves
    it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(parts, "time", fake)
    monkeypatch.setattr(transfer, "time", fake)
    return fake


def test_throttle_without_a_rate_never_waits(clock: FakeClock) -> None:
    throttle = Throttle(None)
    for _ in range(10):
        throttle.take(100 * MiB)

    assert clock.slept == []


@given(st.lists(st.integers(min_value=1, max_value=64 * MiB), min_size=1, max_size=20))
def test_throttle_total_sleep_is_bytes_over_rate(sizes: list[int]) -> None:
    clock = FakeClock()
    rate = 10 * MiB
    original = parts.time
    parts.time = clock  # type: ignore[assignment]
    try:
        throttle = Throttle(rate)
        for n in sizes:
            throttle.take(n)
    finally:
        parts.time = original

    # The first take goes at once; each later one waits for the bytes before it.
    assert sum(clock.slept) == pytest.approx(sum(sizes[:-1]) / rate)
    assert clock.now - 1000.0 == pytest.approx(sum(sizes[:-1]) / rate)


def test_throttle_gives_no_burst_credit_for_idle_time(clock: FakeClock) -> None:
    throttle = Throttle(1 * MiB)
    throttle.take(1 * MiB)
    clock.now += 60  # idle for a minute

    throttle.take(1 * MiB)
    throttle.take(1 * MiB)

    assert clock.slept == [pytest.approx(1.0)]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(0, "0 B", id="zero"),
        pytest.param(1023, "1023 B", id="bytes"),
        pytest.param(1024, "1.0 KiB", id="one-kib"),
        pytest.param(1536, "1.5 KiB", id="kib"),
        pytest.param(5 * MiB, "5.0 MiB", id="mib"),
        pytest.param(2.5 * 1024 * MiB, "2.5 GiB", id="gib"),
        pytest.param(3 * 1024 * 1024 * MiB, "3072.0 GiB", id="tib-stays-gib"),
    ],
)
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_progress_line(clock: FakeClock) -> None:
    progress = Progress("checkpoint-5", 3 * MiB, 4, started=clock.now, _last_log=clock.now)
    progress.done_bytes = 3 * MiB // 2
    progress.file_done()
    clock.now += 2

    assert progress.line() == ("checkpoint-5: 1.5 MiB / 3.0 MiB (50%), 1/4 files, 768.0 KiB/s")


def test_progress_line_of_an_empty_transfer(clock: FakeClock) -> None:
    progress = Progress("checkpoint-0", 0, 0, started=clock.now, _last_log=clock.now)

    assert progress.line() == "checkpoint-0: 0 B / 0 B (100%), 0/0 files, 0 B/s"


def test_progress_add_counts_and_logs_once_per_period(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    progress = Progress(
        "up", 100, 1, every=5.0, on_bytes=seen.append, started=clock.now, _last_log=clock.now
    )
    caplog.set_level(logging.INFO, logger="trainingrun.agent.transfer")

    for _ in range(10):  # 10 adds, one second apart: logs at 5 s and 10 s
        clock.now += 1
        progress.add(10)

    assert seen == [10] * 10
    assert progress.done_bytes == 100
    lines: list[Any] = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[-1].startswith("up: 100 B / 100 B (100%)")


def test_progress_file_written_as_json(tmp_path: Path) -> None:
    local.write_progress(tmp_path, local.Progress(7, 70))

    raw = json.loads(local.control_path(tmp_path, local.PROGRESS).read_text())

    assert raw == {"step": 7, "max_steps": 70}


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SURVEY_AS_NOBODY = """
import json, sys
sys.path.insert(0, "PKG")
from pathlib import Path
from trainingrun.checkpoint import local
print(json.dumps(list(local.survey(Path(sys.argv[1])).unreadable)))
"""


def test_a_folder_the_sidecar_may_not_list_is_reported() -> None:
    """A trainer running as another user that makes its folders private (MindFormers' rank
    folders are 0750): the survey, run as another user than the folder's owner, names it."""
    root = Path(tempfile.mkdtemp(prefix="trainingrun-perm-", dir="/tmp"))
    try:
        root.chmod(0o755)
        ckdir = root / "ck"
        private = ckdir / "checkpoint" / "rank_0"
        private.mkdir(parents=True)
        (private / "llama_rank_0-1_2.ckpt").write_bytes(b"w")
        private.chmod(0o750)
        (ckdir / "checkpoint").chmod(0o755)
        ckdir.chmod(0o755)
        # The other user may not read the clone (mktemp -d makes it 0700): it runs a copy of the
        # package (the survey needs only the standard library) with the base interpreter.
        package = Path(local.__file__).parents[1]
        shutil.copytree(
            package, root / "pkg" / package.name, ignore=shutil.ignore_patterns("*.pyc")
        )
        for folder in [root / "pkg", *(root / "pkg").rglob("*")]:
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        python = os.path.realpath(sys.executable)
        proc = subprocess.run(
            [
                *AS_NOBODY,
                python,
                "-I",
                "-c",
                SURVEY_AS_NOBODY.replace("PKG", str(root / "pkg")),
                str(ckdir),
            ],
            env={"PATH": os.environ.get("PATH", "")},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == ["checkpoint/rank_0"]
        assert local.survey(ckdir).unreadable == ()  # its owner lists it
    finally:
        shutil.rmtree(root)


def test_the_sidecar_warns_once_about_folders_it_may_not_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = LayoutReport(tmp_path, Metrics(CollectorRegistry()))
    unreadable = local.Survey([], (), (), ("checkpoint/rank_0",))
    with caplog.at_level(logging.WARNING, logger="trainingrun.agent.sync"):
        report.report(unreadable)
        report.report(unreadable)
    warned = [r.getMessage() for r in caplog.records if "cannot list" in r.getMessage()]
    assert len(warned) == 1
    assert "checkpoint/rank_0" in warned[0] and "runAsUser" in warned[0]
