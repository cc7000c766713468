"""benchutil.write_section: a benchmark rewrites its own section of docs/benchmarks.md only;
benchutil.stamped: that section carries the date, commit and machine it was measured on;
benchutil.cpu_by_name: the CPU of the processes beside the one measured;
benchutil.page_reporting_held: the kernel's free page reporting held for a run, then put back.

Covers: a section replaced in place between its markers (everything outside them stays byte
for byte), found by its markers whatever its heading says, a name that starts like another's,
a section absent from the page created at its end, and written twice kept once, the first
section written to a missing file under a title; the stamp under the heading; every
benchmark's markers on docs/benchmarks.md once; the CPU of a child process found by its
command name, and a name no process has left out; the reporting order raised during the block
and put back after it, also when the block fails, and a kernel without the setting left alone;
the free memory written once at the start, all but what is kept, in chunks.
"""

from __future__ import annotations

import contextlib
import re
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
    markers,
    page_reporting_held,
    stamped,
    touch_free_memory,
    write_section,
)

# The names the benchmarks write under (tests/bench_*.py, tests/chaos, tests/e2e/test_gang.py)
BENCHMARKS = (
    "operator",
    "operator-progress",
    "operator-gang",
    "gang",
    "chaos",
    "transfer",
    "stores",
    "resume",
    "steptime",
    "protocol",
    "writes",
    "realnode",
)

MiB = 1 << 20

DOC = """# Benchmarks

Intro, with a [link](#alpha).

<!-- bench:alpha -->
## Alpha

alpha body
<!-- /bench:alpha -->

Words between two sections, nobody's.

<!-- bench:alpha-gang -->
## Alpha, in gangs

gang body
<!-- /bench:alpha-gang -->

## Written by hand

hand body
"""


@pytest.mark.parametrize(
    ("name", "section", "expected"),
    [
        pytest.param(
            "alpha",
            "## Alpha\n\nnew alpha\n",
            DOC.replace("alpha body", "new alpha"),
            id="its-section-replaced",
        ),
        pytest.param(
            "alpha",
            "## Alpha, renamed\n\nnew alpha\n",
            DOC.replace("## Alpha\n\nalpha body", "## Alpha, renamed\n\nnew alpha"),
            id="found-by-its-markers-not-its-heading",
        ),
        pytest.param(
            "alpha-gang",
            "## Alpha, in gangs\n\nnew gang\n\n",
            DOC.replace("gang body", "new gang"),
            id="a-name-that-starts-like-another",
        ),
        pytest.param(
            "beta",
            "## Beta\n\nbeta body\n",
            DOC + "\n<!-- bench:beta -->\n## Beta\n\nbeta body\n<!-- /bench:beta -->\n",
            id="absent-section-created-at-the-end",
        ),
    ],
)
def test_write_section_replaces_only_its_own(
    tmp_path: Path, name: str, section: str, expected: str
) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)

    write_section(path, name, section)

    assert path.read_text() == expected


def test_write_section_twice_keeps_one_copy(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)

    write_section(path, "beta", "## Beta\n\nfirst\n")
    write_section(path, "beta", "## Beta\n\nsecond\n")
    write_section(path, "alpha", "## Alpha\n\nagain\n")

    text = path.read_text()
    assert text.count("<!-- bench:beta -->") == 1
    assert "first" not in text
    assert "second" in text
    assert (
        text.replace("again", "alpha body").replace(
            "\n<!-- bench:beta -->\n## Beta\n\nsecond\n<!-- /bench:beta -->\n", ""
        )
        == DOC
    )


def test_write_section_to_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"

    write_section(path, "alpha", "## Alpha\n\nbody\n")

    assert path.read_text() == (
        "# Benchmarks\n\n<!-- bench:alpha -->\n## Alpha\n\nbody\n<!-- /bench:alpha -->\n"
    )


def test_a_section_is_stamped_under_its_heading() -> None:
    text = stamped("## Alpha\n\nCommand: `x`\n", "Local environment.")

    heading, blank, line, *rest = text.splitlines()
    assert (heading, blank) == ("## Alpha", "")
    assert re.fullmatch(
        r"Measured \d{4}-\d{2}-\d{2} at commit \S+( \(with uncommitted changes under "
        r"operator/\))? on \d+ cores, \d+ GiB of memory\. Local environment\.",
        line,
    ), line
    assert rest == ["", "Command: `x`"]


def test_the_page_names_each_benchmark_section_once() -> None:
    """Each benchmark that writes docs/benchmarks.md finds its markers there exactly once."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    for name in BENCHMARKS:
        begin, end = markers(name)
        assert page.count(begin + "\n") == 1, name
        assert page.count(end) == 1, name
        assert page.index(begin) < page.index(end), name


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
