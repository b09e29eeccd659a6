"""handlers.login: in a pod, the API server's Service IP, not a DNS name (no DNS needed)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from spyre_operator import handlers


def test_in_cluster_server_from_the_environment() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert handlers.in_cluster_server(env) == "https://10.0.0.1:443"
    v6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert handlers.in_cluster_server(v6) == "https://[fd00::1]:6443"
    assert handlers.in_cluster_server({}) is None


def test_login_in_a_pod_uses_the_service_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    sa = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t",
                             ca_path="/ca.crt", default_namespace="ns")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = handlers.login(settings=None)
    assert info is not None and info.server == "https://10.96.0.1:443"
    assert info.token == "t" and info.ca_path == "/ca.crt"


def test_login_outside_a_pod_uses_the_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = kopf.ConnectionInfo(server="https://127.0.0.1:6443")
    calls: list[Any] = []
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    monkeypatch.setattr(kopf, "login_with_kubeconfig", lambda **kw: calls.append(kw) or kube)
    assert handlers.login(settings=None) is kube and calls
