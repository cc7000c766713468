"""``python -m tests.chaos``: one chaos run at the size asked, its report written as JSON (and
summarised in docs/benchmarks.md with --write); exit code 1 when an invariant broke."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from tests.benchutil import stamped, write_section
from tests.chaos.run import Config, log, run, save

SECTION = "## Chaos: every fault at once"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0, help="of faults (default 10)")
    p.add_argument("--runs", type=int, default=200, help="TrainingRuns on kwok nodes")
    p.add_argument("--real", type=int, default=6, help="runs of the real example trainer")
    p.add_argument("--max-steps", type=int, default=1200, help="of each real trainer")
    p.add_argument("--step-delay", type=float, default=0.5, help="seconds, per step")
    p.add_argument("--mean-gap", type=float, default=1.5, help="seconds between faults")
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--report", type=Path, default=Path("out/chaos-report.json"))
    p.add_argument("--write", type=Path, help="summarise in this markdown file")
    p.add_argument("--label", default="", help="a few words on the run, under the heading")
    return p.parse_args(argv)


def markdown(report: dict[str, Any], argv: list[str], label: str = "") -> str:
    cfg = report["config"]
    lines = [
        SECTION,
        "",
        *([f"Run: {label}.", ""] if label else []),
        f"Command: `python -m tests.chaos {' '.join(argv)}` (local kwok control "
        f"plane, SeaweedFS, two pod runner nodes). {cfg['runs']} runs on kwok nodes and "
        f"{cfg['real']} of examples/finetune.py ({cfg['max_steps']} steps), two operator "
        f"replicas; {cfg['fault_minutes']:g} minutes of faults (one every {cfg['mean_gap_s']} s "
        f"on average, each kind once first), then at least {cfg['settle_s']:.0f} s to settle. "
        f"Report: `{report.get('report', '')}`.",
        "",
        "| fault | injected | not injected (no target then, too soon after the last, API down) |",
        "|---|---|---|",
    ]
    kinds = sorted(set(report["faults_injected"]) | set(report["faults_missed"]))
    for kind in kinds:
        lines.append(
            f"| {kind} | {report['faults_injected'].get(kind, 0)} | "
            f"{report['faults_missed'].get(kind, 0)} |"
        )
    lines += ["", "| invariant | breaks |", "|---|---|"]
    for name, text in report["invariants"].items():
        lines.append(f"| {name}: {text} | {report['breaks_by_invariant'][name]} |")
    checks = ", ".join(f"{k} {v}" for k, v in sorted(report["checks"].items()))
    memory = report["memory"]
    watches = "; ".join(
        f"{name} reconnected {w['reconnects']} times ({w['gaps']} after a 410, "
        f"{w.get('vanished', 0)} deleted meanwhile)"
        for name, w in report["watches"].items()
    )
    rss = ", ".join(
        f"{t // 60:.0f}:{t % 60:02.0f} {v:.0f}" for t, v in report["leader_rss_mb_by_30s"]
    )
    lines += [
        "",
        f"- Checked: {checks}.",
        f"- Runs at the end: {report['phases']}; the real trainers: {report['real']}.",
        f"- Leader RSS (MB, the highest sample per 30 s, minute:second from the start): {rss}. "
        f"Final leader: first settled minute {memory.get('first_minute_mb')} MB, last minute "
        f"{memory.get('last_minute_mb')} MB.",
        f"- The test's watches: {watches}. After an API server restart a watch resumed from its "
        "last resource version gets 410 (the new server's cache starts at the current one), "
        "so it lists again: what happened between the restart and that list is seen as the "
        "list's state, not event by event. The checks at the end do not depend on the events.",
        f"- Control plane components started again after they exited (they exit on losing "
        f"their leader election while the API server is down; a node's supervisor restarts "
        f"them): {report.get('control_plane_restarts', {})}.",
        "",
    ]
    return "\n".join(lines)


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}: tearing the fleet down")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cfg = Config(
        runs=args.runs,
        real=args.real,
        fault_minutes=args.minutes,
        mean_gap_s=args.mean_gap,
        max_steps=args.max_steps,
        step_delay=args.step_delay,
        seed=args.seed,
    )
    report = run(cfg)
    report["report"] = str(args.report)
    save(report, args.report)
    for b in report["breaks"]:
        log(f"BROKEN {b['invariant']} at {b['at']} s: {b['detail']}")
    log(f"faults injected {report['faults_injected']}; breaks {report['breaks_by_invariant']}")
    log(f"report: {args.report}")
    if args.write:
        write_section(args.write, "chaos", stamped(markdown(report, argv, args.label)))
    return 1 if report["breaks"] else 0


if __name__ == "__main__":
    sys.exit(main())
