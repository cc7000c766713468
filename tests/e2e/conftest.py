"""End-to-end fixtures: two local pod runner nodes on which the attempts' pods run as real
processes, and the frameworks' uninterrupted reference runs. The operator and the CRD are the
session fixtures of tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.example import CHAIN_STEPS, uninterrupted
from tests.e2e.frameworks import References, Stack, reference_stack
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle, start_runner


@pytest.fixture
def runner_nodes(localenv: LocalEnv) -> Iterator[list[RunnerHandle]]:
    """Two pod runner nodes (label ``type=local``), stopped and removed afterwards."""
    handles = [start_runner(localenv), start_runner(localenv)]
    yield handles
    for handle in handles:
        handle.stop()


@pytest.fixture(scope="session")
def chain_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[int, float]]:
    """The uninterrupted run of the example as test_full_chain, test_suspend and test_kueue
    run it (tests/e2e/test_full_chain.py ``finetune_run``), as a plain local process, once per
    session: its final weights and its loss at every step."""
    work = tmp_path_factory.mktemp("chain-reference")
    return uninterrupted(work, CHAIN_STEPS.max_steps, CHAIN_STEPS.save_steps)


@pytest.fixture(scope="session")
def reference_stacks(tmp_path_factory: pytest.TempPathFactory) -> References:
    """Per framework, once per session: its python and its uninterrupted run
    (tests/e2e/frameworks.py ``reference_stack``), which test_frameworks and
    test_framework_callbacks both compare against; nothing may write into its folder."""
    cache: dict[str, Stack] = {}

    def get(framework: str) -> Stack:
        if framework not in cache:
            work = tmp_path_factory.mktemp(f"reference-{framework}")
            cache[framework] = reference_stack(framework, work)
        return cache[framework]

    return get
