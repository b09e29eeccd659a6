"""The README's install guide, run command by command on the real API server (kwok plays the
pods).

The commands and the values file are read from README.md itself: the ``spyre-values.yaml``
block, the ``helm install`` / ``rollout status`` block, the first model's YAML and its ``kubectl
apply`` / ``get`` / ``wait`` block, the endpoint and ``kubectl get spyremodels`` output shown,
``helm upgrade``, ``helm uninstall`` and the clean-up of models and cache PVCs. What is changed
to run them here, and only that: the namespaces get unique names, file names become paths, a
watch (``-w``) is listed once, and ``-A`` and the current-namespace commands are scoped to the
test's namespace (other tests' models share this cluster), and the release's registry
(``registry.example.com/spyre``) is the cluster's own on loopback, where the session made a
release (conftest ``released``; plain HTTP: ``--plain-http`` for ``oci://``). What is not run:
``make release`` and ``make mirror`` (the session's release, and test_chart_pod's mirror, ran
them), ``port-forward`` + ``curl`` (kwok's pods serve
nothing: the real-node demo and tests/realpods send requests through the Service), and
``kubectl delete crd`` (every other test uses the CRD).

kwok runs the chart's operator pod in name only; the package's operator process reconciles the
model, as the chart's pod would.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import REPO_ROOT, ControlPlane
from tests.realpods.support import helm_env

from .conftest import Kube, OperatorProcess

# 3600 s: on a cold machine the release (conftest ``released``) may build images first
pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

README = REPO_ROOT / "README.md"
CRD = "spyremodels.serving.spyre.dev"
RELEASE = "spyre-model-operator"
#: Commands of the guide not run here, with why (module docstring).
NOT_RUN = ("buildah ", "kubectl port-forward", "curl ", "kubectl delete crd")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and output dropped
    (a console block's commands start with ``$ ``)."""
    lines = block.replace("\\\n", " ").splitlines()
    console = any(ln.startswith("$ ") for ln in lines)
    out = []
    for ln in lines:
        if console:
            if not ln.startswith("$ "):
                continue
            ln = ln[2:]
        ln = re.sub(r"\s+#.*$", "", ln).strip()
        if ln and not ln.startswith("#") and re.match(r"^(kubectl|helm|curl|buildah|\w+=)", ln):
            out.append(ln)
    return out


def guide() -> dict[str, object]:
    text = README.read_text()
    blocks = fenced_blocks(text)
    values = next(body for lang, body in blocks
                  if lang == "yaml" and body.startswith("# spyre-values.yaml"))
    model = next(body for lang, body in blocks
                 if lang == "yaml" and body.startswith("apiVersion: serving.spyre.dev/v1alpha1")
                 and "name: granite\nspec:\n  model:\n    uri:" in body
                 and body.count("\n") < 10)
    shell = [c for lang, body in blocks if lang in ("sh", "bash", "console")
             for c in commands(body)]
    return {"values": values, "model": model, "shell": shell, "text": text}


@pytest.fixture
def second_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-readme-b-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_the_install_guide_runs_as_written(
    control_plane: ControlPlane, kube: Kube, operator: OperatorProcess, namespace: str,
    second_namespace: str, tmp_path: Path, released: dict[str, Any],
) -> None:
    g = guide()
    release_ns = f"t-readme-sys-{uuid.uuid4().hex[:6]}"
    registry = released["registry"]
    values = (str(g["values"]).replace("team-a", namespace).replace("team-b", second_namespace)
              .replace("registry.example.com/spyre", registry))
    (tmp_path / "spyre-values.yaml").write_text(values)
    (tmp_path / "granite.yaml").write_text(g["model"])  # type: ignore[arg-type]
    subst = [("spyre-system", release_ns), ("team-a", namespace), ("team-b", second_namespace),
             ("registry.example.com/spyre", registry), ("--version 0.1.0",
                                                         f"--version {released['version']}"),
             # a bare chart path (not the release's oci://.../charts/spyre-model-operator)
             (" charts/spyre-model-operator", f" {REPO_ROOT / 'charts/spyre-model-operator'}"),
             ("-f spyre-values.yaml", f"-f {tmp_path / 'spyre-values.yaml'}"),
             ("-f granite.yaml", f"-f {tmp_path / 'granite.yaml'}"),
             ("spyremodels --all -A", f"spyremodels --all -n {namespace}"),
             # the console lines run in the model's namespace (the README's current context)
             ("kubectl get spyremodels", f"kubectl get spyremodels -n {namespace}"),
             ("kubectl describe spyremodel granite",
              f"kubectl describe spyremodel granite -n {namespace}"),
             ("get pvc -A", f"get pvc -n {namespace}")]
    assert yaml.safe_load(g["values"])["watch"]["namespaces"] == ["team-a", "team-b"]
    env = helm_env(control_plane)
    # The CRD exists (every test uses it): let this release adopt it, as on a fresh cluster
    # it would create it (crds.keep: uninstall leaves it).
    control_plane.kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    control_plane.kubectl("annotate", "crd", CRD, f"meta.helm.sh/release-name={RELEASE}",
                          f"meta.helm.sh/release-namespace={release_ns}", "--overwrite")
    ran: list[list[str]] = []
    outputs: dict[str, str] = {}
    try:
        for cmd in g["shell"]:  # type: ignore[attr-defined]
            if cmd.startswith(("make ", "REG=", "VERSION=")) or cmd.startswith(NOT_RUN):
                continue
            for a, b in subst:
                cmd = cmd.replace(a, b)
            argv = [a for a in shlex.split(cmd) if a not in ("-w", "&")]
            if any(a.startswith("oci://") for a in argv):
                argv.append("--plain-http")
            res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
            assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
            ran.append(argv)
            if "{.status.endpoint}" in cmd:
                outputs["endpoint"] = res.stdout
            elif argv[:3] == ["kubectl", "get", "spyremodels"]:
                outputs["get"] = res.stdout
            elif argv[:3] == ["kubectl", "get", "pvc"]:
                outputs["pvcs"] = res.stdout
    finally:
        subprocess.run(["helm", "uninstall", RELEASE, "-n", release_ns], env=env,
                       capture_output=True, timeout=120)
        control_plane.kubectl("delete", "namespace", release_ns, "--wait=false", check=False)
        control_plane.kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by-", check=False)
        control_plane.kubectl("annotate", "crd", CRD, "meta.helm.sh/release-name-",
                              "meta.helm.sh/release-namespace-", "helm.sh/resource-policy-",
                              check=False)
    # Every kind of step of the guide that can run here did.
    steps = [" ".join(a[:2]) for a in ran]
    # ... from the release's chart in the registry, installed and upgraded.
    for verb in ("install", "upgrade"):
        assert any(a[:2] == ["helm", verb] and any(x.startswith(f"oci://{registry}/")
                                                   for x in a) for a in ran), (verb, ran)
    for want in ("helm install", "kubectl -n", "kubectl apply", "kubectl wait", "kubectl get",
                 "kubectl describe", "helm upgrade", "helm uninstall", "kubectl delete"):
        assert want in steps, (want, steps)
    # What the README shows is what the cluster answered.
    text = str(g["text"])
    shown = re.search(r"jsonpath='\{\.status\.endpoint\}'\n#\s+(\S+)", text)
    assert shown is not None and shown[1] == "http://granite.team-a.svc:8000/v1", shown
    assert outputs["endpoint"].strip() == shown[1].replace("team-a", namespace)
    header = re.search(r"\$ kubectl get spyremodels\n(NAME.*)\n", text)
    assert header is not None
    assert outputs["get"].splitlines()[0].split() == header[1].split(), outputs["get"]
    # the clean-up left nothing of the model and deleted the cache PVC it listed
    assert "spyre-compile-cache" in outputs["pvcs"], outputs["pvcs"]
    assert kube.get("spyremodel", "granite") is None
