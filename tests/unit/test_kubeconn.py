"""Signing in to the API server (trainingrun.operator.kubeconn) and its JSON client.

Covers:

- kubeconfig: the current context's cluster and user; relative paths from the file that names
  them; ``-data`` fields; merged KUBECONFIG files (the first to name a thing wins, a listed file
  that is missing is skipped); a token, a tokenFile, an exec credential plugin (a real script:
  its token, its environment, run again once its token expires); clear errors for no current
  context, a context naming an unknown cluster, a cluster without server, an auth-provider;
- in a pod: the service account's files and KUBERNETES_SERVICE_HOST/PORT (IPv6 too); none
  outside a pod; the token file read again after a minute, not before;
- the client, against a loopback API server on 127.0.0.1: path fields URL-quoted, a server
  behind a path prefix, the bearer token sent, the Status message of an error in ``HttpError``;
  a cluster's proxy-url carries the calls (a loopback proxy), a SOCKS one is refused by name;
- the operator process (``trainingrun operator``'s imports) loads no kubernetes client library.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from tests.unit.fakes import answer_json, loopback_server
from trainingrun.operator.kubeconn import (
    TOKEN_REREAD_SECONDS,
    Bearer,
    Connection,
    HttpError,
    KubeConfigError,
    RestClient,
    from_kubeconfig,
    in_cluster,
)

CA = "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig(
    path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None, **context: Any
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", **context}}],
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_client_certificate_and_ca_by_relative_path(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_text(CA)
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority": "pki/ca.crt"}
    user = {"client-certificate": "pki/u.crt", "client-key": "pki/u.key"}
    conn = from_kubeconfig(str(kubeconfig(tmp_path / "config", user, cluster, namespace="ml")))

    assert conn.server == "https://10.0.0.1:6443"
    assert conn.ca_pem == CA
    assert (conn.cert_file, conn.key_file) == (
        str(tmp_path / "pki" / "u.crt"),
        str(tmp_path / "pki" / "u.key"),
    )
    assert conn.namespace == "ml" and conn.bearer is None


def test_data_fields_and_a_token(tmp_path: Path) -> None:
    cluster = {
        "server": "https://api.example:443",
        "certificate-authority-data": b64(CA),
        "insecure-skip-tls-verify": True,
    }
    user = {"client-certificate-data": b64("CERT"), "client-key-data": b64("KEY"), "token": "t1"}
    conn = from_kubeconfig(str(kubeconfig(tmp_path / "config", user, cluster)))

    assert (conn.ca_pem, conn.insecure, conn.cert_pem, conn.key_pem) == (CA, True, "CERT", "KEY")
    assert conn.bearer is not None and conn.bearer.current() == "t1"
    assert conn.namespace is None


def test_kubeconfig_files_merge_the_first_wins_and_a_missing_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(tmp_path / "a", {"token": "from-a"})
    second = kubeconfig(tmp_path / "b", {"token": "from-b"}, {"server": "https://b:1"})
    paths = [str(tmp_path / "missing"), str(first), str(second)]
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(paths))

    conn = from_kubeconfig()

    assert conn.server == "https://10.0.0.1:6443"
    assert conn.bearer is not None and conn.bearer.current() == "from-a"


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    now = [0.0]
    bearer = Bearer(file=str(token), monotonic=lambda: now[0])

    assert bearer.current() == "one"
    token.write_text("two")
    now[0] = TOKEN_REREAD_SECONDS - 1
    assert bearer.current() == "one"
    now[0] = TOKEN_REREAD_SECONDS
    assert bearer.current() == "two"


def plugin(tmp_path: Path, expires: str | None) -> Path:
    """A credential plugin that counts its runs and prints a token naming the run and the
    environment variable the kubeconfig gives it."""
    count = tmp_path / "runs"
    script = tmp_path / "get-token"
    status: dict[str, Any] = {"token": "TOKEN"}
    if expires:
        status["expirationTimestamp"] = expires
    credential = json.dumps({"kind": "ExecCredential", "status": status})
    script.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{count}"\n'
        'n=$(wc -l < "' + str(count) + '" | tr -d " ")\n'
        f"echo '{credential}' | sed \"s/TOKEN/tok-$n-$TR_REGION-$1/\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize(
    ("expires", "second"),
    [("2099-01-01T00:00:00Z", "tok-1-eu-x"), ("2000-01-01T00:00:00Z", "tok-2-eu-x")],
    ids=["valid-token-kept", "expired-token-asked-again"],
)
def test_an_exec_plugin_gives_the_token(tmp_path: Path, expires: str, second: str) -> None:
    script = plugin(tmp_path, expires)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": f"./{script.name}",  # relative to the kubeconfig's folder
            "args": ["x"],
            "env": [{"name": "TR_REGION", "value": "eu"}],
        }
    }
    conn = from_kubeconfig(str(kubeconfig(tmp_path / "config", user)))

    assert conn.bearer is not None
    assert conn.bearer.current() == "tok-1-eu-x"
    assert conn.bearer.current() == second


def test_an_exec_plugin_that_fails_says_so(tmp_path: Path) -> None:
    user = {"exec": {"command": str(tmp_path / "no-such-plugin")}}
    conn = from_kubeconfig(str(kubeconfig(tmp_path / "config", user)))
    assert conn.bearer is not None
    with pytest.raises(KubeConfigError, match=r"no-such-plugin.*did not run"):
        conn.bearer.current()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"current-context": None}, "no current context"),
        ({"contexts": [{"name": "c", "context": {"cluster": "nope", "user": "u"}}]}, "'nope'"),
        ({"clusters": [{"name": "k", "cluster": {}}]}, "has no server"),
        ({"users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}]}, "exec"),
    ],
    ids=["no-current-context", "unknown-cluster", "no-server", "auth-provider"],
)
def test_a_kubeconfig_that_cannot_sign_in_names_the_problem(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = kubeconfig(tmp_path / "config", {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc.update(change)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=message):
        from_kubeconfig(str(path))


@pytest.mark.parametrize(
    ("host", "server"),
    [("10.96.0.1", "https://10.96.0.1:443"), ("fd00::1", "https://[fd00::1]:443")],
)
def test_in_a_pod_the_service_account_signs_in(tmp_path: Path, host: str, server: str) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text(CA)
    (tmp_path / "namespace").write_text("ops\n")
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}

    conn = in_cluster(str(tmp_path), env)

    assert conn is not None
    assert (conn.server, conn.ca_pem, conn.namespace) == (server, CA, "ops")
    assert conn.bearer is not None and conn.bearer.current() == "sa-token"


def test_outside_a_pod_there_is_no_service_account(tmp_path: Path) -> None:
    assert in_cluster(str(tmp_path), {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None
    (tmp_path / "token").write_text("t")
    assert in_cluster(str(tmp_path), {}) is None


class _Echo(BaseHTTPRequestHandler):
    """Answers every GET with its path and Authorization header; 403 with a Status to a path
    under /forbidden."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:  # the http.server hook's name
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if "/forbidden" in self.path:
            code, body = 403, {"kind": "Status", "code": 403, "message": "pods is forbidden: no"}
        else:
            code, body = 200, {"path": self.path}
        answer_json(self, code, body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


def test_the_client_quotes_fields_sends_the_token_and_keeps_a_prefix() -> None:
    _Echo.seen = []
    with loopback_server(_Echo) as url:
        rest = RestClient(Connection(server=url + "/proxy/", bearer=Bearer(token="t0")))
        template = "/api/v1/namespaces/{namespace}/pods?labelSelector={s}"
        got = rest.call("GET", template, namespace="a b", s="run=r1,attempt=2")
        with pytest.raises(HttpError, match="pods is forbidden: no") as refused:
            rest.call("GET", "/forbidden/{name}", name="x")
        rest.close()

    assert got == {
        "path": "/proxy/api/v1/namespaces/a%20b/pods?labelSelector=run%3Dr1%2Cattempt%3D2"
    }
    assert _Echo.seen[0][1] == "Bearer t0"
    assert refused.value.status == 403


def test_the_operator_process_never_loads_the_kubernetes_client_library() -> None:
    code = (
        "import sys\n"
        "from trainingrun import cli\n"
        "cli._keep_out_the_kubernetes_client()\n"
        "from trainingrun.operator import handlers\n"
        "print([m for m, v in sys.modules.items() if m.startswith('kubernetes') and v])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself with the absolute URL it was asked."""

    def do_GET(self) -> None:  # the http.server hook's name
        answer_json(self, 200, {"asked": self.path})

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


def test_a_clusters_proxy_url_carries_the_calls(tmp_path: Path) -> None:
    with loopback_server(_Proxy) as proxy:
        cluster = {"server": "http://10.255.255.1:8080", "proxy-url": proxy}
        conn = from_kubeconfig(str(kubeconfig(tmp_path / "config", {"token": "t"}, cluster)))
        rest = RestClient(conn)
        got = rest.call("GET", "/api/v1/nodes/{name}", name="n1")
        rest.close()

    assert conn.proxy == proxy
    assert got == {"asked": "http://10.255.255.1:8080/api/v1/nodes/n1"}


def test_a_socks_proxy_url_is_refused_by_name(tmp_path: Path) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "proxy-url": "socks5://127.0.0.1:1080"}
    path = kubeconfig(tmp_path / "config", {"token": "t"}, cluster)
    with pytest.raises(KubeConfigError, match="only http:// and https:// proxies"):
        from_kubeconfig(str(path))
