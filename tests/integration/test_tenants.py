"""A tenant with the built-in ``edit`` role in one namespace (issue 45, 6), on the real control
plane: the user is impersonated (``kubectl --as``), with the SpyreModel rights the chart
aggregates into ``edit`` (its ``rbac.aggregateToDefaultRoles`` ClusterRoles, rendered from the
chart), and the operator is the package's (every namespace, the default budgets).

What the tenant does with those rights, and what must hold:

* squatters: precompile-labelled Jobs (suspended) and serving-labelled Deployments (pods that
  never schedule) in its own namespace, more than the compile and rollout budgets: another
  namespace's new model still gets its precompile Job at once (budgets count only the
  operator's own work, control/budgets.py);
* a secret in ``serving.extraArgs`` (``--api-key``): refused at admission, and the refusal
  does not echo the value;
* reaching out: reading another namespace's SpyreModels, writing RBAC or a Job there, or
  granting itself more: forbidden by the API server;
* afterwards nothing the operator wrote (Events, status) nor its log carries the secret.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.unit.test_chart_lint import needs_helm, render

from .conftest import Kube, OperatorProcess
from .test_operator import spec

pytestmark = [pytest.mark.integration, needs_helm]

USER = "mallory@example.com"
SECRET = "hunter2-not-for-logs"
MANAGED = {"app.kubernetes.io/managed-by": "spyre-model-operator"}


@pytest.fixture
def tenant(control_plane: ControlPlane) -> Iterator[str]:
    """The tenant's namespace, USER bound to ``edit`` there, and the chart's aggregated
    SpyreModel rights."""
    ns = f"t-tenant-{uuid.uuid4().hex[:6]}"
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for doc in render("--set", "rbac.aggregateToDefaultRoles=true"):
        labels = doc["metadata"].get("labels") or {}
        if doc["kind"] == "ClusterRole" and any("aggregate-to-edit" in k for k in labels):
            control_plane.apply(doc)
    control_plane.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "tenant-edit", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    })  # fmt: skip
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _as_tenant(cp: ControlPlane, ns: str, *args: str, input: str | None = None) -> Any:
    return cp.kubectl(*args, "-n", ns, f"--as={USER}", check=False, input=input)


def _squatters(ns: str, n: int) -> list[dict[str, Any]]:
    """Jobs and Deployments with the operator's labels, made by the tenant."""
    labels = {**MANAGED, "app.kubernetes.io/component": "precompile"}
    pod = {"containers": [{"name": "c", "image": "registry.invalid/none:1"}],
           "restartPolicy": "Never"}  # fmt: skip
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": f"squat-{i}", "namespace": ns, "labels": labels},
                    "spec": {"suspend": True, "template": {"spec": pod}}})  # fmt: skip
        sel = {"squat": str(i)}
        out.append({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": f"squat-{i}", "namespace": ns,
                                 "labels": {**MANAGED, "app.kubernetes.io/component": "server"}},
                    "spec": {"replicas": 1, "progressDeadlineSeconds": 2147483647,
                             "selector": {"matchLabels": sel},
                             "template": {"metadata": {"labels": sel}, "spec": {
                                 **pod, "restartPolicy": "Always",
                                 "nodeSelector": {"nowhere": "true"}}}}})  # fmt: skip
    return out


def test_a_tenant_with_edit_stalls_no_other_namespace_and_reaches_nothing_outside_its_own(
    control_plane: ControlPlane, kube: Kube, operator: OperatorProcess, tenant: str,
) -> None:
    cp = control_plane
    # Squatters beyond both budgets (4 each by default), made with the tenant's own rights.
    for doc in _squatters(tenant, 6):
        r = _as_tenant(cp, tenant, "create", "-f", "-", input=json.dumps(doc))
        assert r.returncode == 0, r.stderr
    # Another namespace's new model gets its precompile Job at once.
    kube.apply_model("victim", spec())
    ready = kube.wait(lambda: (c := kube.condition("victim", "ArtifactReady"))
                      and c.get("reason") in ("Compiling", "WaitingForCompileSlot") and c,
                      60, "the victim's artifact pending")  # fmt: skip
    assert ready["reason"] == "Compiling", ready
    assert kube.items("jobs", "app.kubernetes.io/component=precompile"), "no precompile Job"

    # A secret in extraArgs: refused at admission, not echoed.
    model = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
             "metadata": {"name": "leaky", "namespace": tenant},
             "spec": {**spec(), "serving": {"extraArgs": [f"--api-key={SECRET}"]}}}  # fmt: skip
    r = _as_tenant(cp, tenant, "apply", "-f", "-", input=json.dumps(model))
    assert r.returncode != 0 and "apiKey" in r.stderr, r.stderr
    assert SECRET not in r.stderr + r.stdout
    # Its own models it may make (the aggregated rights), and nothing outside.
    ok = {**model, "metadata": {"name": "own", "namespace": tenant}, "spec": spec()}
    r = _as_tenant(cp, tenant, "apply", "-f", "-", input=json.dumps(ok))
    assert r.returncode == 0, r.stderr
    for args in (("get", "spyremodels", "-n", kube.ns),
                 ("create", "role", "x", "--verb=get", "--resource=pods", "-n", kube.ns),
                 ("create", "job", "x", "--image=busybox", "-n", kube.ns),
                 ("create", "rolebinding", "more", "--clusterrole=admin", f"--user={USER}"),
                 ("get", "secrets", "-n", kube.ns)):  # fmt: skip
        r = cp.kubectl(*args, f"--as={USER}", *(() if "-n" in args else ("-n", tenant)),
                       check=False)  # fmt: skip
        assert r.returncode != 0 and "forbidden" in r.stderr.lower(), (args, r.stderr)

    # Nothing the operator wrote or logged carries the secret.
    events = cp.kubectl("get", "events", "-A", "-o", "json").stdout
    assert SECRET not in events
    assert SECRET not in json.dumps(kube.model("victim"))
    assert SECRET not in operator.log_tail(100000)
