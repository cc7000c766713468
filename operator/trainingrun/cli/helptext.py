"""What ``trainingrun --help`` and each subcommand's ``--help`` say, in words for the people who
type them; the package's docstrings stay for its developers.

Every text is a template for ``str.format`` with ``prog``: the command as typed, ``trainingrun``
or, through the plugin, ``kubectl trainingrun``, so that the examples read as the user runs them.
One ``Command`` per subcommand carries its one line (the overview lists it, under the group of
people who run it) and its own help; ``cli.main`` builds the parser from them.
"""

from __future__ import annotations

from dataclasses import dataclass

USERS = "For users (also as kubectl trainingrun ...):"
PODS = "Run inside every training pod (the operator adds them; not run by hand):"
OPERATOR = "Run by the operator's Deployment:"
DEVELOPERS = "For developers and administrators:"
GROUPS = (USERS, PODS, OPERATOR, DEVELOPERS)


@dataclass(frozen=True)
class Command:
    name: str  # as typed after the program's name: "checkpoints list"
    group: str  # one of GROUPS
    line: str  # what it is for, in one line of the overview
    description: str  # its own --help, above the options
    examples: str = ""  # its own --help, below the options

    @property
    def usage_name(self) -> str:
        """The name with its argument, as the overview shows it."""
        return f"{self.name} RUN" if self.group == USERS else self.name


RUN_ARGUMENT = "the TrainingRun's name"
NAMESPACE_OPTION = "the run's namespace (default: the current kubeconfig context's, or default)"
KUBECONFIG_OPTION = "kubeconfig file (default: $KUBECONFIG, or ~/.kube/config)"
VERBOSE_OPTION = "log every step (DEBUG)"

CHECKPOINTS_LIST = Command(
    name="checkpoints list",
    group=USERS,
    line="list a run's committed checkpoints, and whether each can be resumed from",
    description="""\
List the committed checkpoints of a TrainingRun, newest first: STEP, SIZE, COMMITTED (the
time of the commit), FILES and VERIFIED. VERIFIED is "yes" when every object of the checkpoint
is in the bucket with its recorded size, as the operator checks a checkpoint before it resumes
from it, and otherwise "no: " and why: an object is missing, or the step was marked bad
because a restore found it corrupt or a start found it incomplete.

The command reads the run from the cluster and the checkpoints from the bucket, with the run's
credentials Secret (your kubeconfig must be allowed to read it) or, when the run names none,
with your own credentials: the AWS credential chain, Google's application default credentials,
or the Azure identity chain (for example after az login).""",
    examples="""\
examples:
  {prog} checkpoints list my-run
  {prog} checkpoints list my-run -n team-a
  {prog} checkpoints list my-run -n team-a --kubeconfig ~/.kube/prod""",
)

STATUS = Command(
    name="status",
    group=USERS,
    line="show a run's state: phase, attempts, latest checkpoint, pods and conditions",
    description="""\
Show the state of a TrainingRun in one screen: its phase and why, the attempt, restarts and
preemptions, the pod of the current attempt, the step it resumed from, the latest committed
checkpoint, whether a save on preemption fits in the time the pod has, the checkpoints marked
bad, when the next attempt starts during a backoff, the pods of the current attempt and the
run's conditions.

The command reads the run and its pods from the cluster; it does not read the bucket.
kubectl get trainingrun RUN -o yaml shows the same status unformatted.""",
    examples="""\
examples:
  {prog} status my-run
  {prog} status my-run -n team-a
  {prog} status my-run -n team-a | head -20""",
)

SYNC = Command(
    name="sync",
    group=PODS,
    line="upload the trainer's checkpoints to the bucket and commit them (sidecar)",
    description="""\
The checkpoint sync sidecar. The operator adds it to every pod of a TrainingRun as the
container trainingrun-sync. It uploads each complete checkpoint the trainer writes to the run's
bucket, commits it to the run's manifest.json, and deletes the checkpoints beyond the newest
spec.checkpoint.keep. At SIGTERM it uploads and commits the newest complete checkpoint within
its drain time, then exits 0.

It takes no arguments: the operator sets its settings in the pod's environment (the run's
storage location, the checkpoint folder, the store's endpoint, region and credentials). The
tuning variables an agent image may set, such as TRAININGRUN_MAX_BANDWIDTH_MBPS, are listed in
docs/operations.md, "Agent settings".""",
    examples="""\
exit codes:
  0  stopped at SIGTERM after its last upload
  1  it cannot go on: the endpoint ignores If-Match, or the bucket keeps denying access;
     the kubelet restarts it
  2  a setting in the environment is missing or malformed; the message names it

its log in a running pod:
  kubectl logs POD -c trainingrun-sync""",
)

RESTORE = Command(
    name="restore",
    group=PODS,
    line="download and verify the checkpoint an attempt resumes from",
    description="""\
The restore container. When an attempt of a TrainingRun resumes, the operator adds it to the
pod as trainingrun-restore, by default as an init container. It downloads the checkpoint the
operator chose into the checkpoint folder, checks the size and checksum of every file, and only
then puts the checkpoint in place.

It takes no arguments: the operator sets its settings in the pod's environment (the run's
storage location, the step to restore, the checkpoint folder, the store's endpoint, region and
credentials).""",
    examples="""\
exit codes (the termination message, shown by kubectl describe pod, says why):
  0  restored and verified
  1  anything else: endpoint unreachable, access denied, missing bucket; the attempt fails
  2  a setting in the environment is missing or malformed
  3  the checkpoint is not usable; the operator marks it bad and resumes from an older one
  4  the checkpoint does not fit the checkpoint volume""",
)

OPERATOR_COMMAND = Command(
    name="operator",
    group=OPERATOR,
    line="run the operator: watch TrainingRuns and run their attempts",
    description="""\
Run the TrainingRun operator. It watches TrainingRuns, creates the pods of each attempt,
takes the run's fence in the bucket before each attempt, tells a preemption from a failure,
and resumes from the newest committed and verified checkpoint. The Helm chart runs it; its
settings are TRAININGRUN_* environment variables, described in docs/operations.md, "Operator
settings".""",
    examples="""\
examples:
  {prog} operator --namespace team-a --namespace team-b
  {prog} operator --leader-lease trainingrun-system/trainingrun
  {prog} operator --liveness http://0.0.0.0:8080/healthz --metrics-port 8000""",
)

CRD = Command(
    name="crd",
    group=DEVELOPERS,
    line="print the TrainingRun CustomResourceDefinition as YAML",
    description="""\
Print the TrainingRun CustomResourceDefinition, as YAML, to standard output. The Helm chart
installs the same definition.""",
    examples="""\
examples:
  {prog} crd > trainingrun-crd.yaml
  {prog} crd | kubectl apply --server-side -f -""",
)

COMMANDS = (CHECKPOINTS_LIST, STATUS, SYNC, RESTORE, OPERATOR_COMMAND, CRD)
CHECKPOINTS_GROUP = "Look at a run's checkpoints in its bucket."

DESCRIPTION = """\
Look at TrainingRuns, fine-tuning jobs that survive spot preemption and failures without losing
work, and run the programs of the TrainingRun operator."""

EPILOG = """\
examples:
  {prog} status my-run -n team-a
  {prog} checkpoints list my-run -n team-a

{prog} COMMAND --help shows a command's options and examples. The guides are in the
project's docs/ folder: quickstart.md, concepts.md, troubleshooting.md."""


def overview(prog: str) -> str:
    """The top-level description: what the program is, then every command under its group."""
    width = max(len(c.usage_name) for c in COMMANDS) + 2
    parts = [DESCRIPTION]
    for group in GROUPS:
        lines = [f"  {c.usage_name:<{width}}{c.line}" for c in COMMANDS if c.group == group]
        parts.append("\n".join([group, *lines]))
    return "\n\n".join(parts).format(prog=prog)
