"""Where the Kubernetes API is, how to sign in to it, and the small JSON-over-HTTPS client that
every call of the operator, its leader election and the user CLI goes through.

The kubernetes client library is not used: the operator makes about fifteen kinds of call, all
on the API's own JSON, and the library's generated models took 50 MB of the operator's memory
once imported (docs/benchmarks.md, "Operator memory (2026-11-27)").

Sign-in, as kubectl finds it:

- a kubeconfig given by name (the CLI's ``--kubeconfig``);
- in a pod: the service account's token, CA and namespace under ``SERVICE_ACCOUNT``, the server
  from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT; the token is read again every
  minute, as the kubelet rotates it;
- else the kubeconfig files of KUBECONFIG (merged, the first to name a thing wins) or
  ~/.kube/config: the current context's cluster (server, certificate-authority[-data],
  insecure-skip-tls-verify, an http:// or https:// proxy-url) and user
  (client-certificate[-data] and client-key[-data], token, tokenFile, or an exec credential
  plugin such as ``aws eks get-token``). Relative paths are relative to the file that names
  them.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_SECONDS = 60.0
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
# No call of the operator's takes long on a healthy API server: a hung one fails the call (and
# the pass is retried) instead of holding a worker for ever.
DEFAULT_TIMEOUT = urllib3.Timeout(connect=10.0, read=60.0)


class KubeConfigError(Exception):
    """No usable sign-in: the message names what is missing and where to fix it."""


class HttpError(Exception):
    """The API server answered with an error status; ``message`` is its Status's message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


@dataclass
class Bearer:
    """A bearer token: fixed, read from a file (again every ``TOKEN_REREAD_SECONDS``), or given
    by an exec credential plugin (run again when its token expires)."""

    token: str | None = None
    file: str | None = None
    plugin: ExecPlugin | None = None
    monotonic: Callable[[], float] = time.monotonic
    _expires: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def current(self) -> str:
        """The token, read again (or asked for again) when due."""
        with self._lock:
            if (self.file or self.plugin) and self.monotonic() >= self._expires:
                self._refresh()
            return self.token or ""

    def _refresh(self) -> None:
        if self.file:
            try:
                self.token = Path(self.file).read_text().strip()
            except OSError as e:
                raise KubeConfigError(f"cannot read the token file {self.file}: {e}") from None
            self._expires = self.monotonic() + TOKEN_REREAD_SECONDS
        elif self.plugin:
            status = self.plugin.run()
            self.token = status.get("token")
            if not self.token:
                raise KubeConfigError(
                    f"the credential plugin {self.plugin.command!r} gave no token"
                )
            self._expires = self.monotonic() + _seconds_left(status.get("expirationTimestamp"))


def _seconds_left(stamp: str | None) -> float:
    """Seconds until an RFC 3339 expiry, 30 s early; a long time without one."""
    if not stamp:
        return 365 * 24 * 3600.0
    expires = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return max(0.0, (expires - datetime.now(UTC)).total_seconds() - 30.0)


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig user's ``exec``: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"

    def run(self) -> dict[str, Any]:
        info = {
            "apiVersion": self.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        env = {**os.environ, **dict(self.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            done = subprocess.run(
                [self.command, *self.args], env=env, capture_output=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KubeConfigError(
                f"the credential plugin {self.command!r} did not run: {e}; install it or fix "
                "the kubeconfig user's exec.command"
            ) from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-500:]
            raise KubeConfigError(
                f"the credential plugin {self.command!r} failed ({done.returncode}): {said}"
            )
        try:
            status: dict[str, Any] = json.loads(done.stdout)["status"]
        except (ValueError, KeyError, TypeError):
            raise KubeConfigError(
                f"the credential plugin {self.command!r} printed no ExecCredential status"
            ) from None
        return status


@dataclass(frozen=True)
class Connection:
    """One API server and this client's credentials. PEM texts, or files that hold them."""

    server: str
    ca_pem: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    bearer: Bearer | None = None
    namespace: str | None = None  # the context's (or the service account's) namespace
    proxy: str | None = None  # the cluster's proxy-url: an http:// or https:// proxy

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        elif self.cert_pem and self.key_pem:
            _load_cert_pem(ctx, self.cert_pem, self.key_pem)
        return ctx


def _load_cert_pem(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """The ssl module loads a client certificate from files only: a private folder (0700)
    holds them for the call and is gone after it."""
    with tempfile.TemporaryDirectory(prefix="trainingrun-kube-") as d:
        paths = []
        for name, pem in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(d, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(pem)
            paths.append(path)
        ctx.load_cert_chain(*paths)


def in_cluster(
    account: str = SERVICE_ACCOUNT, env: Mapping[str, str] = os.environ
) -> Connection | None:
    """The pod's service account, or None outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token = os.path.join(account, "token")
    if not (host and port and os.path.exists(token)):
        return None
    ca = os.path.join(account, "ca.crt")
    ns = os.path.join(account, "namespace")
    return Connection(
        server=f"https://{f'[{host}]' if ':' in host else host}:{port}",
        ca_pem=Path(ca).read_text() if os.path.exists(ca) else None,
        bearer=Bearer(file=token),
        namespace=Path(ns).read_text().strip() if os.path.exists(ns) else None,
    )


def kubeconfig_paths(kubeconfig: str | None, env: Mapping[str, str] = os.environ) -> list[str]:
    if kubeconfig:
        return [os.path.expanduser(kubeconfig)]
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [os.path.expanduser(p) for p in listed] or [os.path.expanduser("~/.kube/config")]


@dataclass
class _Merged:
    """The kubeconfig files merged; each entry with the folder of the file that named it."""

    current: str | None = None
    contexts: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    clusters: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    users: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)

    def add(self, path: str) -> None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            return  # a listed file that does not exist is skipped, as kubectl does
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise KubeConfigError(f"kubeconfig {path} is not YAML: {e}") from None
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path} is not a kubeconfig (no mapping)")
        folder = os.path.dirname(os.path.abspath(path))
        self.current = self.current or doc.get("current-context")
        named = (("contexts", self.contexts), ("clusters", self.clusters), ("users", self.users))
        for kind, into in named:
            for item in doc.get(kind) or []:
                if isinstance(item, dict) and item.get("name") not in into:
                    into[str(item.get("name"))] = (item.get(kind[:-1]) or {}, folder)

    def pick(self, kind: str, name: str, into: dict[str, tuple[dict[str, Any], str]]) -> Any:
        if name not in into:
            raise KubeConfigError(
                f"kubeconfig: the current context names {kind} {name!r}, which no kubeconfig "
                "file defines"
            )
        return into[name]


def from_kubeconfig(
    kubeconfig: str | None = None, env: Mapping[str, str] = os.environ
) -> Connection:
    """The current context of the kubeconfig (``kubeconfig``, else KUBECONFIG, else
    ~/.kube/config)."""
    paths = kubeconfig_paths(kubeconfig, env)
    merged = _Merged()
    for path in paths:
        merged.add(path)
    if not merged.current:
        raise KubeConfigError(
            f"no current context in {os.pathsep.join(paths)}: run in a pod, or point "
            "KUBECONFIG (or --kubeconfig) at a kubeconfig with one (kubectl config use-context)"
        )
    context, _ = merged.pick("context", merged.current, merged.contexts)
    cluster, cdir = merged.pick("cluster", str(context.get("cluster")), merged.clusters)
    user, udir = merged.pick("user", str(context.get("user")), merged.users)
    if not cluster.get("server"):
        raise KubeConfigError(f"kubeconfig: cluster {context.get('cluster')!r} has no server")
    return Connection(
        server=str(cluster["server"]),
        ca_pem=_pem(cluster, "certificate-authority", cdir),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=_path(user.get("client-certificate"), udir),
        key_file=_path(user.get("client-key"), udir),
        cert_pem=_data(user.get("client-certificate-data")),
        key_pem=_data(user.get("client-key-data")),
        bearer=_bearer(user, udir, str(context.get("user"))),
        namespace=context.get("namespace"),
        proxy=_proxy(cluster.get("proxy-url"), str(context.get("cluster"))),
    )


def _proxy(url: Any, cluster: str) -> str | None:
    if not url:
        return None
    if urllib.parse.urlsplit(str(url)).scheme not in ("http", "https"):
        raise KubeConfigError(
            f"kubeconfig: cluster {cluster!r} has proxy-url {url!r}: only http:// and https:// "
            "proxies are supported; use one, or reach the API server without the proxy"
        )
    return str(url)


def _path(value: Any, folder: str) -> str | None:
    return os.path.join(folder, os.path.expanduser(str(value))) if value else None


def _data(value: Any) -> str | None:
    return base64.b64decode(str(value)).decode() if value else None


def _pem(entry: dict[str, Any], key: str, folder: str) -> str | None:
    if entry.get(f"{key}-data"):
        return _data(entry[f"{key}-data"])
    path = _path(entry.get(key), folder)
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise KubeConfigError(f"kubeconfig: cannot read {key} {path}: {e}") from None


def _bearer(user: dict[str, Any], folder: str, name: str) -> Bearer | None:
    if user.get("token"):
        return Bearer(token=str(user["token"]))
    if user.get("tokenFile"):
        return Bearer(file=_path(user["tokenFile"], folder))
    if isinstance(user.get("exec"), dict):
        spec = user["exec"]
        command = str(spec.get("command") or "")
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(folder, command)
        pairs = tuple((str(e["name"]), str(e["value"])) for e in spec.get("env") or [])
        args = tuple(str(a) for a in spec.get("args") or ())
        version = str(spec.get("apiVersion") or ExecPlugin.api_version)
        return Bearer(plugin=ExecPlugin(command, args, pairs, version))
    if user.get("auth-provider") or user.get("username"):
        raise KubeConfigError(
            f"kubeconfig user {name!r} signs in with an auth-provider or a password, which "
            "Kubernetes no longer supports: use a token, a client certificate or an exec "
            "credential plugin"
        )
    return None


def load(kubeconfig: str | None = None) -> Connection:
    """The named kubeconfig; else the pod's service account; else the kubeconfig files."""
    if not kubeconfig:
        pod = in_cluster()
        if pod is not None:
            return pod
    return from_kubeconfig(kubeconfig)


class RestClient:
    """JSON calls to one API server over a pool of kept-alive connections. ``on_call(verb,
    template)`` is told of every request: the path's template with a custom resource's plural
    filled in (``/apis/{group}/{version}/namespaces/{namespace}/trainingruns/{name}``), a bounded
    set of labels for the operator's API calls metric."""

    def __init__(
        self,
        conn: Connection,
        pool_size: int = 32,
        timeout: urllib3.Timeout = DEFAULT_TIMEOUT,
        retries: urllib3.Retry | bool | None = None,
    ) -> None:
        """``retries``: the pool's retries of a call with no answer (None: urllib3's default,
        3 retries, each with the full ``timeout``; False: none)."""
        self.conn = conn
        self.on_call: Callable[[str, str], None] | None = None
        url = urllib.parse.urlsplit(conn.server)
        self._prefix = url.path.rstrip("/")  # a server behind a path (a proxy's)
        tls: dict[str, Any] = {}
        if url.scheme == "https":
            tls = {"ssl_context": conn.ssl_context()}
            if conn.insecure:
                tls.update(cert_reqs="CERT_NONE", assert_hostname=False)
        # As large as the worker pool: a smaller pool makes every extra worker open (and
        # TLS-handshake) a new connection per call.
        pool = {"maxsize": pool_size, "block": False, "timeout": timeout, **tls}
        if retries is not None:
            pool["retries"] = retries
        self._origin = f"{url.scheme}://{url.netloc}"
        self.pool: urllib3.PoolManager = (
            urllib3.ProxyManager(conn.proxy, num_pools=1, **pool)
            if conn.proxy
            else urllib3.PoolManager(num_pools=1, **pool)
        )

    def close(self) -> None:
        self.pool.clear()

    def call(
        self,
        method: str,
        template: str,
        body: Any = None,
        content_type: str = JSON,
        **params: str | urllib3.Retry | urllib3.Timeout | bool,
    ) -> dict[str, Any]:
        """The answer's JSON; HttpError for an error status; urllib3's errors when there is no
        answer. ``params`` fill the template's fields (a query's too), each URL-quoted, except
        ``retries`` and ``timeout``: this call's own (urllib3's), instead of the pool's."""
        own = {k: params.pop(k) for k in ("retries", "timeout") if k in params}
        fields = {k: str(v) for k, v in params.items()}
        if self.on_call is not None:
            plural = fields.get("plural")
            self.on_call(method, template.replace("{plural}", plural) if plural else template)
        path = self._prefix + template.format(
            **{k: urllib.parse.quote(v, safe="") for k, v in fields.items()}
        )
        headers = {"Accept": JSON, "User-Agent": "trainingrun"}
        if self.conn.bearer is not None:
            headers["Authorization"] = f"Bearer {self.conn.bearer.current()}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self.pool.urlopen(
            method, self._origin + path, body=data, headers=headers, redirect=False, **own
        )
        if response.status >= 400:
            raise _error(response.status, response.reason or "", response.data)
        return json.loads(response.data) if response.data else {}


def _error(status: int, reason: str, raw: bytes) -> HttpError:
    try:
        message = str(json.loads(raw).get("message") or reason)
    except (ValueError, AttributeError):
        message = raw[:200].decode(errors="replace") or reason
    return HttpError(status, reason, message)
