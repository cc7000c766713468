"""Shared by the benchmark scripts: a process's CPU time (or that of every process with a given
name), the contenders' order in a round, holding the kernel's free page reporting, and writing a
benchmark's own section of docs/benchmarks.md in place, stamped with the date, commit and
machine it was measured on."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def shuffled(names: list[str], *key: object) -> list[str]:
    """The contenders' order in one round: a permutation seeded by ``key`` (the round, and what
    else the benchmark varies, such as the shape and the direction), so a rerun repeats it. Not a
    rotation: in a rotation each contender always runs right after the same one, and on this
    machine a restore right after an s5cmd download ran slower than one right after a restore
    (docs/benchmarks.md, "Where the time goes")."""
    seed = "/".join(str(k) for k in key)
    return random.Random(seed).sample(names, len(names))


# Free page reporting: a guest kernel hands free memory back to its hypervisor in blocks of
# 2^order pages. Set above the largest free block there is (order 10 on x86-64), no block
# qualifies and nothing is reported.
PAGE_REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
NO_REPORTING_ORDER = 11
# Memory reported before the run is still the host's until written again. Holding reporting
# first writes the free memory once, all but KEEP_FREE_BYTES, left for what else runs meanwhile.
MEMINFO = Path("/proc/meminfo")
KEEP_FREE_BYTES = 2 << 30
TOUCH_CHUNK_BYTES = 256 << 20
_MEM_FREE = re.compile(r"^MemFree:\s+(\d+) kB$", re.MULTILINE)


def free_bytes(meminfo: str) -> int:
    """``MemFree`` of a /proc/meminfo text, in bytes."""
    found = _MEM_FREE.search(meminfo)
    if found is None:
        raise ValueError("no MemFree line in /proc/meminfo")
    return int(found.group(1)) * 1024


def touch_free_memory(meminfo: Path = MEMINFO, keep: int = KEEP_FREE_BYTES) -> tuple[int, float]:
    """Writes all but ``keep`` bytes of the free memory once, then frees it: (bytes, seconds).

    On this machine 10 GiB of memory reported to the host took 8.45 s to write the first time
    (8.17 s of it system time: a fault in the host per page) and 0.72-0.77 s the next times,
    reporting held between them. A contender that fills the page cache with such memory pays
    that; written here, before any contender runs, it is paid by none."""
    target = max(free_bytes(meminfo.read_text()) - keep, 0)
    start = time.monotonic()
    held: list[bytes] = []
    while (done := len(held) * TOUCH_CHUNK_BYTES) < target:
        held.append(b"\x01" * min(TOUCH_CHUNK_BYTES, target - done))  # memset: every page
    written = sum(len(chunk) for chunk in held)
    held.clear()
    return written, time.monotonic() - start


@contextmanager
def page_reporting_held(
    param: Path = PAGE_REPORTING_ORDER, meminfo: Path = MEMINFO
) -> Iterator[str]:
    """Holds the kernel's free page reporting for the block and gives, in words, what it did.

    On a virtual machine whose kernel reports free pages, memory freed (a deleted download's
    page cache) goes back to the host, and whoever takes it next pays the host's fault on each
    page: on this machine the sharded restore right after an s5cmd download ran at a median of
    636 MiB/s with reporting on and 1111 with it held (docs/benchmarks.md, "Where the time
    goes"). Which contender pays depends on the order, not on the client. Memory reported
    before the block is written once at its start (``touch_free_memory``). The old setting is
    put back at the end."""
    if not param.exists():
        yield "this kernel reports no free pages: nothing to hold"
        return
    old = param.read_text().strip()
    try:
        param.write_text(f"{NO_REPORTING_ORDER}\n")
    except OSError as e:
        sys.exit(
            f"cannot hold free page reporting ({param}: {e.strerror}): run as root, or leave "
            "out --hold-page-reporting"
        )
    try:
        written, seconds = touch_free_memory(meminfo)
        yield (
            f"free page reporting held for the run (page_reporting_order {old} set to "
            f"{NO_REPORTING_ORDER}, then back), and {written / (1 << 30):.1f} GiB of free "
            f"memory written once before it ({seconds:.1f} s), so that none of it is still the "
            "host's"
        )
    finally:
        param.write_text(f"{old}\n")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a running process so far (and of its waited-for children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = fields[11:15] if children else fields[11:13]
    return sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK")


def cpu_by_name(names: frozenset[str]) -> dict[str, float]:
    """CPU seconds so far of the running processes whose command name (``/proc/<pid>/comm``,
    cut at 15 characters) is in ``names``, summed by name: the load beside the one measured."""
    totals: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            if comm in names:
                totals[comm] = totals.get(comm, 0.0) + cpu_seconds(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return totals


def markers(name: str) -> tuple[str, str]:
    """The two HTML comments around benchmark ``name``'s section of docs/benchmarks.md: the
    section is found by them, not by its heading, so a heading can be reworded (and its
    anchor, which other pages link to, stays free of dates)."""
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def write_section(path: Path, name: str, section: str) -> None:
    """Puts ``section`` (markdown starting with its ``## `` heading) between the markers of
    ``name`` in ``path``, replacing what was there; where there is no such section, it goes at
    the end, markers included, and a missing file starts with a title. Every byte outside the
    markers is kept."""
    begin, end = markers(name)
    block = f"{begin}\n{section.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(begin + "\n")
    stop = text.find(end, start + 1) if start >= 0 else -1
    if start >= 0 and stop >= 0:
        text = text[:start] + block + text[stop + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def _memory_gib(meminfo: Path = MEMINFO) -> float:
    found = re.search(r"^MemTotal:\s+(\d+) kB$", meminfo.read_text(), re.MULTILINE)
    return int(found.group(1)) / (1 << 20) if found else float("nan")


def provenance(repo: Path | None = None) -> str:
    """One line for the top of a section: the date (UTC), the commit measured (and whether the
    tree differed from it) and the machine's cores and memory."""
    repo = repo or Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", "operator"):
        commit += " (with uncommitted changes under operator/)"
    date = time.strftime("%Y-%m-%d", time.gmtime())
    return (
        f"Measured {date} at commit {commit} on {os.cpu_count()} cores, "
        f"{_memory_gib():.0f} GiB of memory."
    )


def stamped(section: str, where: str | None = None) -> str:
    """``section`` with the provenance line (and ``where``, a few words on the machine's set-up)
    right under its heading."""
    heading, _, body = section.strip().partition("\n")
    line = provenance() + (f" {where}" if where else "")
    return f"{heading}\n\n{line}\n\n{body.strip()}\n"


def publish(name: str, text: str, path: Path | None) -> None:
    """Prints a benchmark's report and, given a markdown file, puts it in ``name``'s section
    there, stamped with its date, commit and machine."""
    print(text)
    if path:
        write_section(path, name, stamped(text))
