"""Shared fixtures: the local environment (real control plane + SeaweedFS), API clients, and
per-test namespaces and kwok nodes.

Tests under tests/integration/ and tests/e2e/ are marked automatically and use the session
environment: one that is already up (``make cluster``) is reused and left running; one the session
starts itself is stopped at the end. The CRD and the operator are session fixtures here, so both
tiers share one operator process: two operators on one cluster would both act on every run.
The modules ``BESIDE_THE_CLUSTER`` need no cluster: they use a SeaweedFS of the session's own
(``seaweedfs``), and ``make test`` runs them in its second worker, beside the cluster tests.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from xdist.scheduler import LoadScopeScheduling

from tests import kueue as kueue_mod
from tests import localenv as localenv_mod
from tests.azurite import Azurite
from tests.fakegcs import FakeGcs
from tests.integration.agents import S3, PrivateSeaweedFS
from tests.integration.stores import Bucket
from tests.integration.support import OperatorProcess, Runs, wait_for
from tests.minio import Minio
from tests.podrunner import RunnerHandle, start_runner

REPO = Path(__file__).resolve().parents[1]

TIERS = ("integration", "e2e")

# The modules of those tiers that need no cluster: real processes, real trainers and a SeaweedFS
# of their own (the ``seaweedfs`` fixture), never the environment's. ``make test`` runs them
# beside the cluster tests; the collection refuses one that asks for the environment.
BESIDE_THE_CLUSTER = frozenset(
    {
        "tests/integration/test_bench_stores.py",
        "tests/integration/test_bench_transfer.py",
        "tests/integration/test_fenced_commits.py",
        "tests/integration/test_formats.py",
        "tests/integration/test_progress.py",
        "tests/integration/test_gang_shared_files.py",
        "tests/integration/test_storage_names.py",
        "tests/integration/test_stores.py",
        "tests/integration/test_sync_restore.py",
        "tests/integration/test_sync_startup.py",
        "tests/e2e/test_framework_callbacks.py",
        "tests/e2e/test_real_layouts.py",
        "tests/e2e/test_trainer_resume.py",
    }
)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        if _module(item.nodeid) in BESIDE_THE_CLUSTER and "localenv" in getattr(
            item, "fixturenames", ()
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the environment (the localenv fixture), but its module is "
                "in BESIDE_THE_CLUSTER (tests/conftest.py), which make test runs beside the "
                "cluster tests: use the seaweedfs fixture, or take the module off that list"
            )


class ClusterAndLocal(LoadScopeScheduling):  # type: ignore[misc]
    """Two work units: every test on the cluster (tests/integration, tests/e2e, but for the
    modules ``BESIDE_THE_CLUSTER``), and the rest."""

    def _split_scope(self, nodeid: str) -> str:
        module = _module(nodeid)
        tier = Path(module).parts[1:2]
        on_cluster = tier and tier[0] in TIERS and module not in BESIDE_THE_CLUSTER
        return "cluster" if on_cluster else "local"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n 2 --dist loadscope`` (``make test``): the tests on the cluster run in one
    worker and in order, as they share one environment and one operator; the others run in the
    second worker beside them. Other ``--dist`` modes are pytest-xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ClusterAndLocal(config, log)


@pytest.fixture(scope="session")
def localenv() -> Iterator[localenv_mod.LocalEnv]:
    env = localenv_mod.load()
    started_here = env is None
    if env is None:
        env = localenv_mod.up()
    yield env
    if started_here and not os.environ.get("TRAININGRUN_KEEP_ENV"):
        localenv_mod.down()


@pytest.fixture(autouse=True)
def _environment_runs(request: pytest.FixtureRequest) -> None:
    """A test on the environment fails at once, saying what is down and where its log is, when
    an earlier test left the environment's SeaweedFS or kube-apiserver down: not after waiting
    out each of its own timeouts."""
    if "localenv" not in request.fixturenames:
        return
    env: localenv_mod.LocalEnv = request.getfixturevalue("localenv")
    problem = localenv_mod.broken(env.name)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """fake-gcs-server on loopback, for the session (its objects are in memory)."""
    with FakeGcs(tmp_path_factory.mktemp("fake-gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service on loopback, for the session (its blobs are in memory)."""
    with Azurite(tmp_path_factory.mktemp("azurite"), debug=False) as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """A SeaweedFS of the session's own on loopback, apart from the environment's: the tests
    ``BESIDE_THE_CLUSTER`` use it."""
    server = PrivateSeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server.s3
    finally:
        server.stop(keep_data=False)


@pytest.fixture
def bucket_env(request: pytest.FixtureRequest) -> localenv_mod.LocalEnv:
    """The SeaweedFS of the ``bucket`` fixture's s3:// case and of ``s3``: the environment's,
    which the operator's tests need; for a module ``BESIDE_THE_CLUSTER``, the session's own
    (``seaweedfs``), so that the module never asks for the environment."""
    if _module(request.node.nodeid) in BESIDE_THE_CLUSTER:
        own: S3 = request.getfixturevalue("seaweedfs")
        return own.as_localenv()
    env: localenv_mod.LocalEnv = request.getfixturevalue("localenv")
    return env


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Minio]:
    """MinIO on loopback, for the session (its objects on a single drive in a temporary folder)."""
    with Minio(tmp_path_factory.mktemp("minio")) as server:
        yield server


@pytest.fixture(params=["s3", "minio", "gs", "az"])
def bucket(request: pytest.FixtureRequest) -> Bucket:
    """The bucket of each store in turn: SeaweedFS, MinIO, fake-gcs-server, Azurite."""
    if request.param == "minio":
        return Bucket.minio(request.getfixturevalue("minio"))
    if request.param == "gs":
        gcs: FakeGcs = request.getfixturevalue("fake_gcs")
        return Bucket.fake_gcs(gcs.endpoint, gcs.bucket)
    if request.param == "az":
        az: Azurite = request.getfixturevalue("azurite")
        return Bucket.azurite(az.endpoint, az.account, az.container, az.key)
    env: localenv_mod.LocalEnv = request.getfixturevalue("bucket_env")
    return Bucket.seaweedfs(env)


@pytest.fixture(scope="session")
def api_client(localenv: localenv_mod.LocalEnv) -> Any:
    return config.new_client_from_config(config_file=localenv.kubeconfig)


@pytest.fixture(scope="session")
def core_v1(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)


@pytest.fixture
def s3(bucket_env: localenv_mod.LocalEnv) -> Any:
    """A boto3 client of ``bucket_env``'s SeaweedFS."""
    return localenv_mod.s3_client(bucket_env)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary, built from its Go module by hack/build-tools.sh (cached)."""
    path = localenv_mod.build_tools() / "helm"
    assert path.exists(), f"{path} is missing: hack/build-tools.sh should have built it"
    return path


@pytest.fixture(scope="module")
def runner(localenv: localenv_mod.LocalEnv) -> Iterator[RunnerHandle]:
    """One local pod runner node for the module; its log's tail is printed when it stops."""
    handle = start_runner(localenv)
    yield handle
    handle.stop()
    print(f"--- runner log (last 3000 chars) ---\n{handle.runner_log()[-3000:]}")


@pytest.fixture
def namespace(core_v1: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core_v1.delete_namespace(name)


def create_kwok_node(core_v1: Any, labels: dict[str, str] | None = None) -> str:
    """A node that the kwok controller keeps Ready; returns its name."""
    name = f"kwok-{uuid.uuid4().hex[:8]}"
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={localenv_mod.KWOK_NODE_ANNOTATION: "fake"},
            labels={"type": "kwok", "kubernetes.io/hostname": name, **(labels or {})},
        )
    )
    core_v1.create_node(node)
    return name


@pytest.fixture
def kwok_node(core_v1: Any) -> Iterator[Callable[..., str]]:
    """Factory for nodes that the kwok controller keeps Ready; all are deleted afterwards."""
    created: list[str] = []

    def make(labels: dict[str, str] | None = None) -> str:
        name = create_kwok_node(core_v1, labels)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            core_v1.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="session")
def crd(localenv: localenv_mod.LocalEnv, api_client: Any) -> str:
    localenv.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    localenv.wait_established("trainingruns.trainingrun.dev")
    custom = client.CustomObjectsApi(api_client)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object("trainingrun.dev", "v1alpha1", "trainingruns")
        except client.ApiException:
            return False
        return True

    wait_for(served, 30, "trainingruns to be served")
    return "trainingruns.trainingrun.dev"


@pytest.fixture(scope="session")
def operator(
    localenv: localenv_mod.LocalEnv,
    crd: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    stopped = localenv_mod.stop_operator(localenv)
    if stopped:
        # `make demo` leaves its operator running on the environment the tests reuse.
        plugins = request.config.pluginmanager
        reporter = plugins.get_plugin("terminalreporter")
        capture = plugins.get_plugin("capturemanager")
        message = (
            f"stopped the operator that `make demo` started (pid {stopped}): the tests run "
            "their own, and two operators would both act on every run; `make demo` starts it "
            "again"
        )
        if reporter is not None and capture is not None:
            # Fixture setup runs with output captured: say it on the terminal itself.
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"\n[conftest] {message}")
    proc = OperatorProcess(
        localenv,
        tmp_path_factory.mktemp("operator") / "operator.log",
        metrics_port=localenv_mod.free_ports(1)[0],
    )
    proc.start()
    _session_operators.append(proc)
    yield proc
    _session_operators.remove(proc)
    proc.stop()
    log = proc.log_path.read_text(errors="replace")
    print(f"--- operator log (last 3000 chars) ---\n{log[-3000:]}")


_session_operators: list[OperatorProcess] = []


@contextlib.contextmanager
def paused_session_operators() -> Iterator[None]:
    """The session operator, if an earlier test started it, stopped meanwhile: for tests that
    run an operator of their own (two operators would both act on the test's runs)."""
    paused = [p for p in _session_operators if p.alive()]
    for proc in paused:
        proc.stop()
    try:
        yield
    finally:
        for proc in paused:
            proc.start()


@pytest.fixture
def session_operator_paused() -> Iterator[None]:
    """For a test that runs an operator of its own (``paused_session_operators``)."""
    with paused_session_operators():
        yield


@pytest.fixture(scope="module")
def kueue(localenv: localenv_mod.LocalEnv) -> Iterator[kueue_mod.Kueue]:
    """Kueue for the module that asks for it: one already running is reused and left running."""
    started_here = kueue_mod.load(localenv.name) is None
    running = kueue_mod.up(localenv)
    yield running
    if started_here and not os.environ.get("TRAININGRUN_KEEP_ENV"):
        kueue_mod.down(localenv.name)


@pytest.fixture
def queue(
    request: pytest.FixtureRequest,
    localenv: localenv_mod.LocalEnv,
    kueue: kueue_mod.Kueue,
    namespace: str,
) -> Iterator[str]:
    """A Kueue queue named after the test's namespace, as the test module's ``QUEUE_QUOTA``
    (a ``kueue.QueueQuota``) says; the cluster-scoped objects go afterwards."""
    quota: kueue_mod.QueueQuota = request.module.QUEUE_QUOTA
    with kueue_mod.queue_for_test(
        localenv, namespace, quota.cpu, quota.memory, quota.priorities
    ) as name:
        yield name


@pytest.fixture
def runs(api_client: Any, namespace: str, localenv: localenv_mod.LocalEnv) -> Runs:
    return Runs.with_credentials(api_client, namespace, localenv)


@pytest.fixture
def prefix() -> str:
    """A bucket prefix no other test uses."""
    return f"it-{uuid.uuid4().hex[:10]}"
