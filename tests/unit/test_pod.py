"""build_pod(): the pod of one attempt, as a plain dict.

Covers:

- name ``<run>-<attempt>``, namespace, owner reference (controller and blockOwnerDeletion true),
  run and attempt labels next to the template's labels, the resume-step annotation only when
  resuming, template annotations kept; the template's ``trainingrun.dev/*`` labels and
  annotations (and those of its subdomains) dropped, the operator's own set as always, look-alike
  keys kept; owned_by(): only a controller reference of the kind
  TrainingRun with the run's UID makes a pod the run's (not a deleted run's of the same name);
- ``restartPolicy: Never`` even when the template says otherwise, grace period from
  ``spec.preemption``;
- the restore init container only when resuming, after the user's init containers and before
  the sync sidecar; the sync sidecar with ``restartPolicy: Always``; with ``restoreMode:
  AlongsideTrainer`` the restore is a container beside the trainer, whose env says to wait;
- the checkpoint volume (emptyDir) mounted at ``localPath`` in trainer, restore and sync;
- TRAININGRUN_* values: RESUME_FROM empty on a fresh start and ``<localPath>/checkpoint-<step>``
  when resuming (also with a trailing slash), RESUME_URI under the run's prefix, ATTEMPT, KEEP,
  RESTORE_STEP, STORAGE_URI, endpoint and region;
- credentials only by ``secretKeyRef``, never as literal values, and none without a Secret;
- user env (ours win on a name clash), user volumes and mounts, other containers and pod spec
  fields kept; the run's template is not mutated.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.builders import BUCKET_URI, NAMESPACE, RunBuilder, make_run
from trainingrun.api import GROUP, KIND, VERSION
from trainingrun.contract import (
    ANNOTATION_NOTICE,
    ANNOTATION_RESUME_STEP,
    ANNOTATION_STOP,
    CHECKPOINT_VOLUME,
    CREDENTIAL_KEYS,
    ENV_RESUME_WAIT,
    LABEL_ATTEMPT,
    LABEL_RANK,
    LABEL_RUN,
    PODINFO_DIR,
    PODINFO_VOLUME,
    RESTORE_CONTAINER,
    STOP_SUSPEND,
    SYNC_CONTAINER,
    TRAINER_CONTAINER,
)
from trainingrun.decide.naming import RunRef, owned_by
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of

SETTINGS = AgentSettings(image="registry.example/agent:9")
SECRET_LIKE = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SECRET", "PASSWORD", "TOKEN")


def _pod(
    builder: RunBuilder | None = None, attempt: int = 1, step: int | None = None
) -> dict[str, Any]:
    ref = (builder or make_run("r1")).ref()
    return build_pod(ref, attempt, resume_of(ref, step), SETTINGS, epoch=attempt)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    for c in [*spec["initContainers"], *spec["containers"]]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in the pod")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    """Env entries by name; fails when a name appears twice."""
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), f"duplicate env names in {container['name']}: {names}"
    return {e["name"]: e for e in container["env"]}


def _value(container: dict[str, Any], name: str) -> str:
    value: str = _env(container)[name]["value"]
    return value


def _init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"]["initContainers"]]


# -- identity -----------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 17], ids=lambda n: f"attempt-{n}")
def test_name_is_run_dash_attempt(attempt: int) -> None:
    pod = _pod(make_run("llama-ft"), attempt=attempt)

    assert pod["metadata"]["name"] == f"llama-ft-{attempt}"
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")


def test_owner_reference_makes_the_run_the_controller() -> None:
    run = make_run("r1")

    pod = _pod(run)

    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": "r1",
            "uid": run.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _owner(**fields: Any) -> dict[str, Any]:
    ref = {"kind": KIND, "name": "r1", "uid": "uid-1", "controller": True}
    return {**ref, **fields}


@pytest.mark.parametrize(
    ("refs", "owned"),
    [
        pytest.param([_owner()], True, id="the-run-is-the-controller"),
        pytest.param([{"kind": "ReplicaSet", "uid": "x"}, _owner()], True, id="among-others"),
        pytest.param([_owner(uid="uid-0")], False, id="a-deleted-run-of-the-same-name"),
        pytest.param([_owner(controller=False)], False, id="owner-but-not-controller"),
        pytest.param([_owner(kind="Job")], False, id="same-uid-other-kind"),
        pytest.param([], False, id="no-owner"),
        pytest.param(None, False, id="owner-references-absent"),
    ],
)
def test_owned_by(refs: list[dict[str, Any]] | None, owned: bool) -> None:
    meta: dict[str, Any] = {"name": "r1-1"}
    if refs is not None:
        meta["ownerReferences"] = refs

    assert owned_by({"metadata": meta}, "uid-1") is owned


def test_built_pod_is_owned_by_its_run() -> None:
    run = make_run("r1")

    assert owned_by(_pod(run), run.uid)
    assert not owned_by(_pod(run), "another-uid")


def test_labels_name_run_and_attempt_and_keep_template_labels() -> None:
    pod = _pod(make_run("r1"), attempt=4)

    assert pod["metadata"]["labels"] == {"team": "nlp", LABEL_RUN: "r1", LABEL_ATTEMPT: "4"}


def test_resume_annotation_only_when_resuming() -> None:
    fresh = _pod(step=None)
    resumed = _pod(step=120)

    assert ANNOTATION_RESUME_STEP not in fresh["metadata"]["annotations"]
    assert resumed["metadata"]["annotations"][ANNOTATION_RESUME_STEP] == "120"
    assert resumed["metadata"]["annotations"]["owner"] == "alice"


def _with_template_metadata(where: str, key: str, value: str) -> RunRef:
    """The default run, its template's ``where`` (labels or annotations) also holding key."""
    ref = make_run("r1").ref()
    template = ref.spec.template
    meta = template["metadata"]
    template = {**template, "metadata": {**meta, where: {**meta[where], key: value}}}
    spec = ref.spec.model_copy(update={"template": template})
    return RunRef(name=ref.name, namespace=ref.namespace, uid=ref.uid, spec=spec)


# A template key under the operator's domain fakes one of its signals; the pod never gets it.
RESERVED = [
    pytest.param("annotations", ANNOTATION_NOTICE, "fake", None, id="notice-annotation"),
    pytest.param("annotations", ANNOTATION_RESUME_STEP, "7", None, id="resume-step-fresh-start"),
    pytest.param("annotations", ANNOTATION_STOP, STOP_SUSPEND, 120, id="stop-annotation"),
    pytest.param("annotations", "trainingrun.dev/future-signal", "x", 120, id="any-annotation"),
    pytest.param("annotations", "sync.trainingrun.dev/x", "x", None, id="subdomain-annotation"),
    pytest.param("annotations", "TrainingRun.dev/Notice", "x", None, id="upper-case-annotation"),
    pytest.param("labels", LABEL_RANK, "3", None, id="rank-label-of-a-single-pod"),
    pytest.param("labels", "trainingrun.dev/custom", "x", 120, id="any-label"),
    pytest.param("labels", "a.b.trainingrun.dev/custom", "x", None, id="subdomain-label"),
]


@pytest.mark.parametrize(("where", "key", "value", "step"), RESERVED)
def test_template_keys_of_the_operators_domain_are_dropped(
    where: str, key: str, value: str, step: int | None
) -> None:
    ref = _with_template_metadata(where, key, value)

    pod = build_pod(ref, 2, resume_of(ref, step), SETTINGS, epoch=2)

    meta = pod["metadata"]
    assert key not in meta[where], f"the template's {key} reached the pod's {where}"
    assert (meta["labels"]["team"], meta["annotations"]["owner"]) == ("nlp", "alice")
    assert (meta["labels"][LABEL_RUN], meta["labels"][LABEL_ATTEMPT]) == ("r1", "2")
    if step is not None:
        assert meta["annotations"][ANNOTATION_RESUME_STEP] == str(step)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        pytest.param("annotations", "nottrainingrun.dev/x", id="suffix-without-a-dot"),
        pytest.param("annotations", "trainingrun.dev.example.com/x", id="longer-domain"),
        pytest.param("annotations", "example.com/trainingrun.dev", id="name-not-prefix"),
        pytest.param("labels", "app.kubernetes.io/name", id="other-domain-label"),
        pytest.param("labels", "kueue.x-k8s.io/queue-name", id="kueue-queue-label"),
    ],
)
def test_look_alike_template_keys_are_kept(where: str, key: str) -> None:
    ref = _with_template_metadata(where, key, "v")

    pod = build_pod(ref, 1, None, SETTINGS, epoch=1)

    assert pod["metadata"][where][key] == "v"


def test_resume_step_of_the_template_never_overrides_the_operators() -> None:
    ref = _with_template_metadata("annotations", ANNOTATION_RESUME_STEP, "999")

    pod = build_pod(ref, 2, resume_of(ref, 120), SETTINGS, epoch=2)

    assert pod["metadata"]["annotations"][ANNOTATION_RESUME_STEP] == "120"


# -- pod spec -----------------------------------------------------------------------------


def test_restart_policy_is_never_even_when_template_says_otherwise() -> None:
    pod = _pod(make_run().with_pod_spec(restartPolicy="OnFailure"))

    assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("seconds", [1, 120, 3600], ids=lambda s: f"grace-{s}s")
def test_grace_period_comes_from_spec_preemption(seconds: int) -> None:
    pod = _pod(make_run().with_grace_period(seconds).with_pod_spec(terminationGracePeriodSeconds=5))

    assert pod["spec"]["terminationGracePeriodSeconds"] == seconds


def test_default_grace_period_is_the_api_default() -> None:
    assert _pod()["spec"]["terminationGracePeriodSeconds"] == 120


def test_other_pod_spec_fields_are_kept() -> None:
    run = make_run().with_pod_spec(
        nodeSelector={"gpu": "a100"},
        tolerations=[{"key": "spot", "operator": "Exists"}],
        priorityClassName="training",
    )

    spec = _pod(run)["spec"]

    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert spec["priorityClassName"] == "training"


# -- injected containers ------------------------------------------------------------------


def test_fresh_start_has_no_restore_container() -> None:
    pod = _pod(step=None)

    assert _init_names(pod) == [SYNC_CONTAINER]


def test_resume_runs_restore_before_the_sync_sidecar() -> None:
    pod = _pod(step=120)

    assert _init_names(pod) == [RESTORE_CONTAINER, SYNC_CONTAINER]


def test_user_init_containers_run_first() -> None:
    run = make_run().with_init_container({"name": "fetch-data", "image": "busybox"})

    assert _init_names(_pod(run, step=120)) == ["fetch-data", RESTORE_CONTAINER, SYNC_CONTAINER]
    assert _init_names(_pod(run, step=None)) == ["fetch-data", SYNC_CONTAINER]


def test_sync_is_a_native_sidecar_and_restore_is_not() -> None:
    pod = _pod(step=120)

    assert _container(pod, SYNC_CONTAINER)["restartPolicy"] == "Always"
    assert "restartPolicy" not in _container(pod, RESTORE_CONTAINER)


@pytest.mark.parametrize(
    ("mode", "step", "init", "main", "waits"),
    [
        ("BeforeTrainer", 120, [RESTORE_CONTAINER, SYNC_CONTAINER], [TRAINER_CONTAINER], False),
        (
            "AlongsideTrainer",
            120,
            [SYNC_CONTAINER],
            [TRAINER_CONTAINER, RESTORE_CONTAINER],
            True,
        ),
        ("BeforeTrainer", None, [SYNC_CONTAINER], [TRAINER_CONTAINER], False),
        ("AlongsideTrainer", None, [SYNC_CONTAINER], [TRAINER_CONTAINER], False),
    ],
    ids=["before-resuming", "alongside-resuming", "before-fresh", "alongside-fresh"],
)
def test_restore_mode_places_the_restore_and_tells_the_trainer_to_wait(
    mode: str, step: int | None, init: list[str], main: list[str], waits: bool
) -> None:
    pod = _pod(make_run("r1").with_checkpoint_fields(restoreMode=mode), step=step)

    assert _init_names(pod) == init
    assert [c["name"] for c in pod["spec"]["containers"]] == main
    trainer_env = _env(_container(pod, TRAINER_CONTAINER))
    assert (ENV_RESUME_WAIT in trainer_env) is waits
    if step is not None and not waits:
        assert ENV_RESUME_WAIT not in _env(_container(pod, RESTORE_CONTAINER))
    if waits:
        assert trainer_env[ENV_RESUME_WAIT]["value"] == "1"
        restore = _container(pod, RESTORE_CONTAINER)
        assert "restartPolicy" not in restore
        assert _value(restore, "TRAININGRUN_RESTORE_STEP") == "120"
        assert _value(restore, ENV_RESUME_WAIT) == "1"
        assert {m["name"] for m in restore["volumeMounts"]} >= {CHECKPOINT_VOLUME}


def test_agent_containers_use_the_agent_settings() -> None:
    pod = _pod(step=120)

    commands = {}
    for name in (SYNC_CONTAINER, RESTORE_CONTAINER):
        c = _container(pod, name)
        commands[name] = c["command"]
        assert c["image"] == "registry.example/agent:9"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert commands == {
        SYNC_CONTAINER: ["trainingrun", "sync"],
        RESTORE_CONTAINER: ["trainingrun", "restore"],
    }


@pytest.mark.parametrize("local_path", ["/checkpoints", "/mnt/ckpt"], ids=lambda p: p)
def test_checkpoint_volume_mounted_at_local_path_in_all_three(local_path: str) -> None:
    pod = _pod(make_run().with_local_path(local_path), step=120)

    assert {"name": CHECKPOINT_VOLUME, "emptyDir": {}} in pod["spec"]["volumes"]
    for name in (TRAINER_CONTAINER, RESTORE_CONTAINER, SYNC_CONTAINER):
        mounts = _container(pod, name)["volumeMounts"]
        assert {"name": CHECKPOINT_VOLUME, "mountPath": local_path} in mounts, name


def test_checkpoint_volume_appears_once() -> None:
    pod = _pod(make_run().with_volume({"name": CHECKPOINT_VOLUME, "hostPath": {}}, "/old"))

    ours = [v for v in pod["spec"]["volumes"] if v["name"] == CHECKPOINT_VOLUME]
    trainer_mounts = [
        m
        for m in _container(pod, TRAINER_CONTAINER)["volumeMounts"]
        if m["name"] == CHECKPOINT_VOLUME
    ]
    assert ours == [{"name": CHECKPOINT_VOLUME, "emptyDir": {}}]
    assert trainer_mounts == [{"name": CHECKPOINT_VOLUME, "mountPath": "/checkpoints"}]


def test_sync_sees_the_pod_annotations_through_the_downward_api() -> None:
    pod = _pod(step=40)

    (podinfo,) = [v for v in pod["spec"]["volumes"] if v["name"] == PODINFO_VOLUME]
    assert podinfo["downwardAPI"]["items"] == [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    ]
    sync = _container(pod, SYNC_CONTAINER)
    assert {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True} in sync[
        "volumeMounts"
    ]
    assert _value(sync, "TRAININGRUN_PODINFO_DIR") == PODINFO_DIR
    for name in (TRAINER_CONTAINER, RESTORE_CONTAINER):
        assert all(m["name"] != PODINFO_VOLUME for m in _container(pod, name)["volumeMounts"])


@pytest.mark.parametrize("seconds", [30, 300], ids=lambda s: f"grace-{s}s")
def test_sync_drain_budget_is_the_grace_period(seconds: int) -> None:
    pod = _pod(make_run().with_grace_period(seconds))

    assert _value(_container(pod, SYNC_CONTAINER), "TRAININGRUN_DRAIN_SECONDS") == str(seconds)


# -- environment --------------------------------------------------------------------------


def test_trainer_env_on_a_fresh_start() -> None:
    trainer = _container(_pod(make_run("r1"), attempt=1, step=None), TRAINER_CONTAINER)

    assert _value(trainer, "TRAININGRUN_NAME") == "r1"
    assert _value(trainer, "TRAININGRUN_ATTEMPT") == "1"
    assert _value(trainer, "TRAININGRUN_CHECKPOINT_DIR") == "/checkpoints"
    assert _value(trainer, "TRAININGRUN_RESUME_FROM") == ""
    assert _value(trainer, "TRAININGRUN_RESUME_STEP") == ""
    assert _value(trainer, "TRAININGRUN_RESUME_URI") == ""


@pytest.mark.parametrize(
    ("local_path", "resume_from"),
    [
        pytest.param("/checkpoints", "/checkpoints/checkpoint-120", id="plain-path"),
        pytest.param("/mnt/ckpt/", "/mnt/ckpt/checkpoint-120", id="trailing-slash"),
    ],
)
def test_trainer_env_when_resuming(local_path: str, resume_from: str) -> None:
    run = make_run("r1").with_local_path(local_path)

    trainer = _container(_pod(run, attempt=3, step=120), TRAINER_CONTAINER)

    assert _value(trainer, "TRAININGRUN_ATTEMPT") == "3"
    assert _value(trainer, "TRAININGRUN_RESUME_FROM") == resume_from
    assert _value(trainer, "TRAININGRUN_RESUME_STEP") == "120"
    assert _value(trainer, "TRAININGRUN_RESUME_URI") == (
        f"{BUCKET_URI}/{NAMESPACE}/r1/checkpoints/checkpoint-120/"
    )


@pytest.mark.parametrize(
    ("path", "resume_from"),
    [
        pytest.param("ds", "/checkpoints/ds", id="deepspeed-save-folder"),
        pytest.param(
            "logs/epoch=0-step=50.ckpt", "/checkpoints/logs/epoch=0-step=50.ckpt", id="file"
        ),
        pytest.param("", "/checkpoints", id="the-folder-itself"),
    ],
)
def test_trainer_resumes_from_what_the_layout_recorded(path: str, resume_from: str) -> None:
    ref = make_run("r1").ref()

    pod = build_pod(ref, 2, resume_of(ref, 50, path), SETTINGS, epoch=2)

    assert _value(_container(pod, TRAINER_CONTAINER), "TRAININGRUN_RESUME_FROM") == resume_from


def test_sync_gets_the_format_only_when_not_auto() -> None:
    plain = _env(_container(_pod(make_run("r1")), SYNC_CONTAINER))
    run = make_run("r1").with_checkpoint_fields(
        format="pattern", pattern={"glob": "out/step_*", "marker": "DONE"}
    )
    named = _env(_container(_pod(run), SYNC_CONTAINER))

    assert "TRAININGRUN_CHECKPOINT_FORMAT" not in plain
    assert named["TRAININGRUN_CHECKPOINT_FORMAT"]["value"] == "pattern"
    pattern = json.loads(named["TRAININGRUN_CHECKPOINT_PATTERN"]["value"])
    assert pattern == {"glob": "out/step_*", "marker": "DONE", "step": r"(\d+)(?!.*\d)"}


def test_agent_env_names_the_bucket_keep_and_restore_step() -> None:
    run = (
        make_run("r1")
        .with_keep(5)
        .with_storage(endpoint="http://seaweedfs.storage:8333", region="eu-west-1")
    )

    pod = _pod(run, attempt=2, step=80)
    sync, restore = _container(pod, SYNC_CONTAINER), _container(pod, RESTORE_CONTAINER)

    for c in (sync, restore):
        assert _value(c, "TRAININGRUN_STORAGE_URI") == f"{BUCKET_URI}/{NAMESPACE}/r1"
        assert _value(c, "AWS_ENDPOINT_URL") == "http://seaweedfs.storage:8333"
        assert _value(c, "AWS_REGION") == "eu-west-1"
        assert _value(c, "TRAININGRUN_CHECKPOINT_DIR") == "/checkpoints"
    assert _value(sync, "TRAININGRUN_KEEP") == "5"
    assert _value(sync, "TRAININGRUN_ATTEMPT") == "2"
    assert _value(restore, "TRAININGRUN_RESTORE_STEP") == "80"


def test_credentials_only_by_secret_key_ref() -> None:
    pod = _pod(make_run().with_storage(credentials_secret="s3-creds"), step=120)

    for name in (SYNC_CONTAINER, RESTORE_CONTAINER):
        env = _env(_container(pod, name))
        for key in CREDENTIAL_KEYS:
            assert env[key] == {
                "name": key,
                "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key}},
            }


def test_no_literal_value_carries_a_credential() -> None:
    pod = _pod(make_run().with_storage(credentials_secret="s3-creds"), step=120)

    containers = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    literal = [
        (c["name"], e["name"])
        for c in containers
        for e in c.get("env") or []
        if "value" in e and any(word in f"{e['name']} {e['value']}".upper() for word in SECRET_LIKE)
    ]
    assert literal == []


def test_no_credentials_without_a_secret() -> None:
    pod = _pod(step=120)

    for name in (SYNC_CONTAINER, RESTORE_CONTAINER):
        assert not set(CREDENTIAL_KEYS) & set(_env(_container(pod, name)))


def test_user_env_kept_and_ours_win_on_a_clash() -> None:
    run = (
        make_run("r1")
        .with_trainer_env("HF_HOME", "/cache/hf")
        .with_trainer_env("TRAININGRUN_ATTEMPT", "999")
    )

    env = _env(_container(_pod(run, attempt=2), TRAINER_CONTAINER))

    assert env["HF_HOME"] == {"name": "HF_HOME", "value": "/cache/hf"}
    assert env["TRAININGRUN_ATTEMPT"]["value"] == "2"


def test_user_volumes_mounts_and_containers_kept() -> None:
    run = (
        make_run()
        .with_volume({"name": "data", "persistentVolumeClaim": {"claimName": "ds"}}, "/data")
        .with_container({"name": "metrics", "image": "prom/exporter"})
    )

    pod = _pod(run)

    assert {"name": "data", "persistentVolumeClaim": {"claimName": "ds"}} in pod["spec"]["volumes"]
    assert {"name": "data", "mountPath": "/data"} in _container(pod, TRAINER_CONTAINER)[
        "volumeMounts"
    ]
    assert [c["name"] for c in pod["spec"]["containers"]] == [TRAINER_CONTAINER, "metrics"]
    assert "env" not in _container(pod, "metrics")


def test_template_is_not_mutated() -> None:
    run = (
        make_run()
        .with_trainer_env("HF_HOME", "/cache/hf")
        .with_volume({"name": "data", "emptyDir": {}}, "/data")
        .with_init_container({"name": "fetch-data", "image": "busybox"})
    )
    ref = run.ref()
    before = ref.spec.model_dump()

    pod = build_pod(ref, 2, resume_of(ref, 120), SETTINGS, epoch=2)
    # Changing the pod afterwards must not reach the spec either (no shared nested objects).
    pod["spec"]["containers"][0]["command"].append("--later")
    pod["spec"]["initContainers"][0]["image"] = "later"
    pod["spec"]["volumes"][0]["emptyDir"]["medium"] = "Memory"
    pod["metadata"]["labels"]["later"] = "x"

    assert ref.spec.model_dump() == before
    assert ref.spec.template == run.template()
