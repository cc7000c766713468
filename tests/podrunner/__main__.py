"""``python -m tests.podrunner --node NAME``: see the package docstring."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tests import localenv
from tests.podrunner import __doc__ as DOC
from tests.podrunner import default_state_dir
from tests.podrunner.runner import Runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.podrunner",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node", required=True, help="name of the node to register and run")
    parser.add_argument("--state-dir", type=Path, help="pod folders, logs, pid files")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the local environment's")
    parser.add_argument(
        "--env", help="environment whose pod networks this runner shares (default: this checkout's)"
    )
    parser.add_argument("--cpu", default="32", help="allocatable cpu (scheduling only)")
    parser.add_argument("--memory", default="64Gi", help="allocatable memory (scheduling only)")
    parser.add_argument("--pods", default="110", help="allocatable pods")
    parser.add_argument("--no-taint", action="store_true", help="let any pod be scheduled here")
    parser.add_argument(
        "--shutdown-grace", type=float, default=30, help="seconds for the pods on SIGTERM"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    env_name = args.env or localenv.env_name()
    if not kubeconfig:
        env = localenv.load()
        if env is None:
            print(
                "no --kubeconfig, no $KUBECONFIG and the local environment is not up: "
                "run 'make cluster' first",
                file=sys.stderr,
            )
            return 2
        kubeconfig, env_name = env.kubeconfig, args.env or env.name
    if os.geteuid() != 0:
        print(
            "the pod runner needs root: it bind-mounts volumes in private mount namespaces and "
            "gives pods network namespaces",
            file=sys.stderr,
        )
        return 2
    runner = Runner(
        kubeconfig=kubeconfig,
        node=args.node,
        state_dir=args.state_dir or default_state_dir(env_name, args.node),
        capacity={"cpu": args.cpu, "memory": args.memory, "pods": args.pods},
        taint=not args.no_taint,
        shutdown_grace_s=args.shutdown_grace,
        env_name=env_name,
    )
    runner.install_signals()
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
