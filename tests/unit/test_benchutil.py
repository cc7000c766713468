"""benchutil.write_section: a benchmark rewrites its own section of docs/benchmarks.md only;
benchutil.cpu_by_name: the CPU of the processes beside the one measured;
benchutil.page_reporting_held: the kernel's free page reporting held for a run, then put back.

Covers: a section replaced in place between its neighbours (which stay byte for byte), a
heading with a date in parentheses matched whatever the date, a new section appended, the
first section written to a missing file under a title; the CPU of a child process found by its
command name, and a name no process has left out; the reporting order raised during the block
and put back after it, also when the block fails, and a kernel without the setting left alone;
the free memory written once at the start, all but what is kept, in chunks.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchutil import (
    KEEP_FREE_BYTES,
    NO_REPORTING_ORDER,
    TOUCH_CHUNK_BYTES,
    cpu_by_name,
    cpu_seconds,
    free_bytes,
    page_reporting_held,
    touch_free_memory,
    write_section,
)

MiB = 1 << 20

DOC = """# Benchmarks

Intro.

## Alpha

alpha body

## Beta (2026-11-01)

old beta

## Gamma

gamma body
"""


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        pytest.param(
            "## Alpha\n\nnew alpha\n",
            DOC.replace("alpha body", "new alpha"),
            id="first-section-replaced",
        ),
        pytest.param(
            "## Beta (2026-11-23)\n\nnew beta\n",
            DOC.replace("## Beta (2026-11-01)\n\nold beta", "## Beta (2026-11-23)\n\nnew beta"),
            id="dated-heading-replaced",
        ),
        pytest.param(
            "## Gamma\n\nnew gamma\n",
            DOC.replace("gamma body", "new gamma"),
            id="last-section-replaced",
        ),
        pytest.param(
            "## Delta\n\ndelta body\n",
            DOC + "\n## Delta\n\ndelta body\n",
            id="new-section-appended",
        ),
    ],
)
def test_write_section_replaces_only_its_own(tmp_path: Path, section: str, expected: str) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)

    write_section(path, section)

    assert path.read_text() == expected


def test_write_section_to_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"

    write_section(path, "## Alpha\n\nbody\n")

    assert path.read_text() == "# Benchmarks\n\n## Alpha\n\nbody\n"


# Names itself, spins for 0.3 s of CPU, says so, and waits to be killed.
SPINNER = """
import sys, time
open("/proc/self/comm", "w").write(sys.argv[1])
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
print("spun", flush=True)
time.sleep(60)
"""


def test_cpu_by_name_sums_the_named_processes() -> None:
    name = "tr-bench-spin"
    child = subprocess.Popen(
        [sys.executable, "-c", SPINNER, name], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"

        found = cpu_by_name(frozenset({name, "no-such-process"}))

        assert set(found) == {name}
        # /proc counts CPU in clock ticks, sampled: a little under the 0.4 s spun, under load.
        assert found[name] >= 0.3
        assert found[name] == pytest.approx(cpu_seconds(child.pid), abs=0.05)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("fails", [False, True])
def test_page_reporting_held_during_the_block_and_put_back(tmp_path: Path, fails: bool) -> None:
    param = tmp_path / "page_reporting_order"
    param.write_text("9\n")
    meminfo = _meminfo(tmp_path, KEEP_FREE_BYTES + 512 * MiB)
    expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
    with expected, page_reporting_held(param, meminfo) as said:
        assert param.read_text().strip() == str(NO_REPORTING_ORDER)
        assert "page_reporting_order 9" in said
        assert "0.5 GiB of free memory written once" in said
        if fails:
            raise RuntimeError("a contender failed")
    assert param.read_text().strip() == "9"


def test_page_reporting_held_without_the_setting_changes_nothing(tmp_path: Path) -> None:
    with page_reporting_held(tmp_path / "absent") as said:
        assert "nothing to hold" in said
    assert not (tmp_path / "absent").exists()


def _meminfo(tmp_path: Path, free: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(
        f"MemTotal:       24576000 kB\nMemFree:        {free // 1024:>8} kB\n"
        "MemAvailable:   23000000 kB\n"
    )
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal: 100 kB\nMemFree:        12803740 kB\nCached: 5 kB\n", 12803740 * 1024),
        ("MemFree: 0 kB\n", 0),
    ],
)
def test_free_bytes_reads_memfree(text: str, expected: int) -> None:
    assert free_bytes(text) == expected


def test_free_bytes_without_memfree_says_so() -> None:
    with pytest.raises(ValueError, match="no MemFree line"):
        free_bytes("MemAvailable: 5 kB\n")


@pytest.mark.parametrize(
    ("free", "written"),
    [
        pytest.param(
            KEEP_FREE_BYTES + 3 * TOUCH_CHUNK_BYTES // 2,
            3 * TOUCH_CHUNK_BYTES // 2,
            id="a chunk and a half",
        ),
        pytest.param(KEEP_FREE_BYTES + MiB, MiB, id="less than a chunk"),
        pytest.param(KEEP_FREE_BYTES, 0, id="only what is kept"),
        pytest.param(KEEP_FREE_BYTES // 2, 0, id="less than what is kept"),
    ],
)
def test_touch_free_memory_writes_all_but_what_is_kept(
    tmp_path: Path, free: int, written: int
) -> None:
    assert touch_free_memory(_meminfo(tmp_path, free))[0] == written


def test_touch_free_memory_writes_every_page(tmp_path: Path) -> None:
    # Resident memory counts the pages written: an allocation left unwritten would not show.
    meminfo = _meminfo(tmp_path, KEEP_FREE_BYTES + 512 * MiB)
    code = (
        "import resource, sys; from pathlib import Path; "
        "from tests.benchutil import touch_free_memory; "
        "touch_free_memory(Path(sys.argv[1])); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(meminfo)], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) * 1024 >= 512 * MiB
