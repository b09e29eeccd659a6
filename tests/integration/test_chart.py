"""The Helm chart on the local control plane (issue 5).

* Every rendered combination passes a server-side dry run (schemas, admission, and Pod
  Security: the release namespaces enforce the `restricted` level, so a warning that the
  operator pod "would violate PodSecurity" fails the test).
* End to end with the real `helm`: install, then run the operator locally with a token of
  the chart's ServiceAccount (TokenRequest API), so only the chart's RBAC is in play; a
  SpyreModel reaches Ready; `helm upgrade` with a changed CRD updates it; `helm uninstall`
  removes the operator's objects and keeps the CRD (helm.sh/resource-policy: keep).
* Monitoring with the Prometheus Operator's own CRDs (tests/cluster/crds.sh): without them the
  install succeeds and its notes say no PodMonitor was made; with them the models' PodMonitor
  is created. The InferencePool CRD is installed during the end-to-end run, so the chart's RBAC
  is exercised for a routed model too.

The chart's own Deployment is installed too: kwok plays its pods (they become Ready without
running anything, which exercises scheduling, Pod Security admission and `helm --wait`), and
the operator process that does the work is the local one, started with exactly the arguments
the chart gives the container.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.desired import names

from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.thirdparty import (
    INFERENCE_POOL_CRD,
    POD_MONITOR_CRD,
    SERVICE_MONITOR_CRD,
    installed_crd,
    remove_crd,
)
from tests.operator_log import refusals
from tests.realpods.support import bind_metrics_reader, unbind_metrics_reader

from .conftest import Kube, OperatorProcess, assert_no_host_operator

# The operator under test (the chart's RBAC) runs alone: see no_host_operator.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_host_operator")]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spyre-model-operator"
CRD_FILE = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"
CRD_NAME = "spyremodels.serving.spyre.dev"
RELEASE = "spyre-model-operator"  # the ServiceAccount and Deployment get this name

#: Helm 3 (tests/cluster/helm3-deps.sh builds it; idempotent): many sites, OpenShift's console
#: among them, still install charts with it.
HELM3_DEPS = Path(__file__).resolve().parents[1] / "cluster" / "helm3-deps.sh"


def helm3_binary() -> Path:
    out = subprocess.run([str(HELM3_DEPS)], capture_output=True, text=True, check=True,
                         timeout=1800)  # fmt: skip
    return Path(out.stdout.strip())


class Helm:
    """The pinned helm binary (Helm 4, or ``binary``), with its caches in a temp dir and the
    admin kubeconfig."""

    def __init__(self, cp: ControlPlane, home: Path, binary: Path | None = None) -> None:
        self.bin = binary or cp.bin_dir / "helm"
        version = subprocess.run([str(self.bin), "version", "--template={{.Version}}"],
                                 capture_output=True, text=True, check=True).stdout
        self.major = int(version.lstrip("v").split(".")[0])
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(self.bin), *args], capture_output=True, text=True,
                             env=self.env, timeout=180)
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return res


@pytest.fixture
def helm(control_plane: ControlPlane, tmp_path: Path) -> Helm:
    return Helm(control_plane, tmp_path / "helm")


@pytest.fixture(params=[4, 3], ids=["helm4", "helm3"])
def any_helm(control_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Helm:
    """Helm 4 (the cluster's) and Helm 3."""
    binary = helm3_binary() if request.param == 3 else None
    h = Helm(control_plane, tmp_path / "helm", binary)
    assert h.major == request.param
    return h


def _ns_manifest(name: str) -> dict[str, Any]:
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    labels["spyre.dev/test-namespace"] = "true"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
def models_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """A second namespace, for the SpyreModels (the release lives in ``namespace``)."""
    name = f"{namespace[:50]}-models"
    control_plane.apply(_ns_manifest(name))
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                          check=False)


def _restore_crd(cp: ControlPlane) -> None:
    """Put the shared CRD back as the session's `crd` fixture applies it, minus Helm's marks."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    cp.kubectl("annotate", "crd", CRD_NAME, "meta.helm.sh/release-name-",
               "meta.helm.sh/release-namespace-", "helm.sh/resource-policy-", check=False)
    cp.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by-", check=False)


def _adopt_crd(cp: ControlPlane, namespace: str) -> None:
    """Let this release take over a CRD that other tests applied with kubectl (the documented
    way to move an existing install under Helm)."""
    if cp.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0:
        return
    cp.kubectl("annotate", "--overwrite", "crd", CRD_NAME,
               f"meta.helm.sh/release-name={RELEASE}",
               f"meta.helm.sh/release-namespace={namespace}")
    cp.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")


# ---------------------------------------------------------------------------- dry runs


def _value_sets(namespace: str, second: str) -> dict[str, list[str]]:
    return {
        "default": [],
        "namespaced": ["--set", "watch.allNamespaces=false",
                       "--set", f"watch.namespaces={{{namespace},{second}}}"],
        "replicas-2": ["--set", "replicaCount=2"],
        "monitoring": ["--set", "monitoring.enabled=true",
                       "--api-versions", "monitoring.coreos.com/v1"],
        "network-policy": ["--set", "networkPolicy.egress=true"],
    }


@pytest.fixture
def monitoring_crds(control_plane: ControlPlane) -> Iterator[None]:
    """The Prometheus Operator's own ServiceMonitor and PodMonitor CRDs (its release's Go
    module, tests/cluster/crds.sh): the API server checks the chart's objects against the
    real schemas."""
    with installed_crd(control_plane, SERVICE_MONITOR_CRD), \
            installed_crd(control_plane, POD_MONITOR_CRD):
        yield


@pytest.mark.parametrize("name", ["default", "namespaced", "replicas-2", "monitoring",
                                  "network-policy"])
def test_rendered_chart_passes_server_side_dry_run(
    control_plane: ControlPlane, helm: Helm, namespace: str, name: str,
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    if name == "monitoring":
        request.getfixturevalue("monitoring_crds")
    values = _value_sets(namespace, "default")[name]
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace, *values).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(manifest) if d}
    if name == "monitoring":
        assert {"ServiceMonitor", "PodMonitor"} <= kinds
    res = control_plane.kubectl(
        "apply", "--dry-run=server", "--server-side", "--force-conflicts",
        "--field-manager=chart-dry-run", "-f", "-", input=manifest, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "PodSecurity" not in res.stderr, res.stderr
    assert "deployment.apps/spyre-model-operator serverside-applied (server dry run)" in res.stdout
    # Helm 3 renders the same objects. Offline, it takes Kubernetes to be v1.20 (Helm 4: a
    # current one), which the chart's kubeVersion refuses: `--kube-version` (what Argo CD
    # passes; install and upgrade ask the cluster).
    helm3 = Helm(control_plane, tmp_path / "helm3", helm3_binary())
    same = helm3("template", RELEASE, str(CHART), "--namespace", namespace, *values,
                 "--kube-version", "1.30").stdout
    assert [d for d in yaml.safe_load_all(same) if d] == [
        d for d in yaml.safe_load_all(manifest) if d], "Helm 3 renders other objects"


# ---------------------------------------------------------------------------- end to end


def _chart_args(helm: Helm, namespace: str) -> list[str]:
    """The operator arguments of the installed release's Deployment, minus the ports the
    local process chooses itself."""
    manifest = helm("get", "manifest", RELEASE, "--namespace", namespace).stdout
    (dep,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "run"
    return [a for a in args[1:] if not a.startswith(("--liveness=", "--metrics-port="))]


def _metrics_need_a_reader(cp: ControlPlane, op: OperatorProcess, namespace: str) -> None:
    """Issue 45, 4: /metrics (``operator.metricsAuth``, on by default) answers a token whose
    user the release's metrics-reader ClusterRole lets get it, and nobody else; the operator
    asks the API server with the chart's RBAC (the reviews it grants). A decision is cached: a
    second scrape with the same token asks nothing."""
    reader = bind_metrics_reader(cp, namespace)
    try:
        own = cp.kubectl("create", "token", RELEASE, "-n", namespace).stdout.strip()
        assert op.scrape(None)[0] == 401
        assert op.scrape("not-a-token")[0] == 401
        assert op.scrape(reader[:-4] + "AAAA")[0] == 401  # a signature that does not match
        status, body = op.scrape(own)  # the operator's own account has no get on /metrics
        assert status == 403 and f"system:serviceaccount:{namespace}:{RELEASE}" in body, body
        status, body = op.scrape(reader)
        assert status == 200 and "spyre_operator_" in body, body[:500]
        op.metrics_token = reader

        def reviews() -> float:
            return sum(v for k, v in op.metrics().items() if k.startswith(
                "spyre_operator_api_requests_total{") and 'resource="tokenreviews"' in k)

        asked = reviews()
        assert asked >= 4  # the refusals above were asked too (not the malformed one)
        for _ in range(3):
            assert op.scrape(reader)[0] == 200
        assert reviews() == asked
    finally:
        unbind_metrics_reader(cp, namespace)


def _changed_chart(tmp: Path) -> Path:
    """A copy of the chart whose CRD has one more printer column."""
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    crd = chart / "files" / "crd-spyremodels.yaml"
    text = crd.read_text()
    extra = ("    additionalPrinterColumns:\n"
             "    - name: Served\n      type: string\n"
             "      jsonPath: .status.servingArtifactKey\n      priority: 1\n"
             "      description: Artifact key being served (added by the upgrade test)\n")
    assert text.count("    additionalPrinterColumns:\n") == 1
    crd.write_text(text.replace("    additionalPrinterColumns:\n", extra))
    return chart


def test_install_serve_upgrade_uninstall(
    control_plane: ControlPlane, any_helm: Helm, namespace: str, models_namespace: str,
    tmp_path: Path,
) -> None:
    """With Helm 4 and Helm 3: install, serve with the chart's RBAC, upgrade (the CRD too),
    uninstall (the CRD and the models stay)."""
    cp, helm = control_plane, any_helm
    values = ["--set", "watch.allNamespaces=false",
              "--set", f"watch.namespaces={{{models_namespace}}}",
              "--set", "replicaCount=2",  # also turns on leader election: the Lease RBAC
              "--set", "image.repository=example.invalid/spyre-model-operator"]
    _adopt_crd(cp, namespace)
    op: OperatorProcess | None = None
    # The Inference Extension's CRD, so the chart's RBAC is exercised for InferencePools too.
    pool_crd = installed_crd(cp, INFERENCE_POOL_CRD)
    pool_crd.__enter__()
    try:
        helm("install", RELEASE, str(CHART), "--namespace", namespace, *values,
             "--wait", "--timeout=90s")
        crd = cp.kubectl_json("get", "crd", CRD_NAME)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

        # The operator with the chart's ServiceAccount and the chart's arguments.
        kc = cp.token_kubeconfig(namespace, RELEASE, tmp_path / "operator.kubeconfig")
        args = _chart_args(helm, namespace)
        assert f"--namespace={models_namespace}" in args and "--leader-elect" in args
        op = OperatorProcess(kc, cp.root / ".cluster" / "logs", args=args,
                             env={"POD_NAMESPACE": namespace, "POD_NAME": "local-operator"})
        op.start()
        _metrics_need_a_reader(cp, op, namespace)

        kube = Kube(cp, models_namespace)
        kube.apply_model("granite", {
            "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
            "compile": {"maxModelLen": 2048, "requireKnownConfiguration": False},  # not listed
            "replicas": 2,  # a PodDisruptionBudget too
            "routing": {"inferencePool": {"endpointPicker": {"name": "granite-epp"}}},
        })
        kube.wait_condition("granite", "Ready", timeout=90)
        assert kube.get("poddisruptionbudget", "granite") is not None
        kube.wait_condition("granite", "RoutingReady", "False", reason="InferencePoolPending")
        assert kube.get("inferencepool", "granite") is not None
        lease = cp.kubectl_json("get", "lease", "spyre-model-operator", "-n", namespace)
        assert lease["spec"]["holderIdentity"] == "local-operator"
        events = kube.items("events")
        assert any(e["involvedObject"]["name"] == "granite"
                   and e.get("reportingComponent") == "serving.spyre.dev/spyre-model-operator"
                   for e in events)
        assert not refusals(op.log_path.read_text() if op.log_path else ""), op.log_tail()
        # ... and it wrote every child itself, with the chart's RBAC (no other operator ran)
        assert_no_host_operator()
        assert op.namespace_writes(models_namespace) > 0, op.metrics()
        wrote = {re.search(r'kind="([^"]*)"', k)[1]  # type: ignore[index]
                 for k, v in op.metrics().items()
                 if k.startswith("spyre_operator_writes_total") and v > 0}
        assert {"Deployment", "Service", "PodDisruptionBudget", "InferencePool",
                "PersistentVolumeClaim", "Job", "SpyreModel/status", "Event"} <= wrote, wrote

        # The operator's ServiceAccount can do nothing outside the watched namespace.
        sa = f"system:serviceaccount:{namespace}:{RELEASE}"
        for verb, res, ns in [("list", "spyremodels", "default"), ("get", "secrets", namespace),
                              ("list", "secrets", models_namespace),
                              ("patch", "spyremodels", models_namespace)]:
            r = cp.kubectl("auth", "can-i", verb, res, "-n", ns, f"--as={sa}", check=False)
            assert r.stdout.strip() == "no", (verb, res, ns)

        # helm upgrade with a changed CRD updates the CRD in the cluster. The session applied
        # the CRD before with `kubectl apply --server-side` (another field manager), as a user
        # who installed the CRD by hand would have: Helm 4's server-side apply then needs
        # --force-conflicts to take the fields over (documented in the chart README); Helm 3
        # patches client-side and has no such flag.
        force = ["--force-conflicts"] if helm.major >= 4 else []
        helm("upgrade", RELEASE, str(_changed_chart(tmp_path)), "--namespace", namespace,
             *values, *force, "--wait", "--timeout=90s")
        cols = cp.kubectl_json("get", "crd", CRD_NAME)["spec"]["versions"][0][
            "additionalPrinterColumns"]
        assert "Served" in [c["name"] for c in cols]
        kube.wait_condition("granite", "Ready", timeout=30)  # models untouched
        op.stop()

        # helm uninstall removes the operator's objects; the CRD and the models stay.
        helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=90s")
        for kind, ns in [("deployment", namespace), ("serviceaccount", namespace),
                         ("role", namespace), ("rolebinding", namespace),
                         ("role", models_namespace), ("rolebinding", models_namespace)]:
            left = [o["metadata"]["name"] for o in Kube(cp, ns).items(kind)
                    if o["metadata"]["name"].startswith(RELEASE)]
            assert not left, f"{kind} left in {ns}: {left}"
        crs = cp.kubectl("get", "clusterroles", "-o", "name").stdout
        assert f"{namespace}-{RELEASE}" not in crs
        assert cp.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
        assert kube.get("spyremodel", "granite") is not None
    finally:
        if op is not None:
            op.stop()
        helm("uninstall", RELEASE, "--namespace", namespace, check=False)
        _restore_crd(cp)
        pool_crd.__exit__(None, None, None)


@pytest.mark.usefixtures("crd")  # can-i answers "no" on a resource the server does not have
def test_cluster_scope_rbac(control_plane: ControlPlane, helm: Helm, namespace: str) -> None:
    """The ClusterRole grants the same rights in any namespace, and nothing on Secrets."""
    cp = control_plane
    name = f"scope-{uuid.uuid4().hex[:6]}"
    helm("install", name, str(CHART), "--namespace", namespace, "--set", "crds.install=false")
    try:
        sa = f"system:serviceaccount:{namespace}:{name}-{RELEASE}"
        for verb, res in [("list", "spyremodels.serving.spyre.dev"),
                          ("patch", "spyremodels.serving.spyre.dev --subresource=status"),
                          ("create", "deployments.apps"), ("delete", "jobs.batch"),
                          # a canary Deployment, when its canary ends; the operator's writer
                          # refuses to delete any other (test_canary.py)
                          ("delete", "deployments.apps"),
                          ("list", "pods"), ("create", "events")]:
            r = cp.kubectl("auth", "can-i", verb, *res.split(), "-n", "default", f"--as={sa}",
                           check=False)
            assert r.stdout.strip() == "yes", (verb, res)
        for verb, res in [("get", "secrets"), ("create", "leases.coordination.k8s.io"),
                          ("get", "pods")]:
            r = cp.kubectl("auth", "can-i", verb, res, "-n", "default", f"--as={sa}",
                           check=False)
            assert r.stdout.strip() == "no", (verb, res)
        info = json.loads(helm("status", name, "--namespace", namespace, "-o", "json").stdout)
        assert info["info"]["status"] == "deployed"
    finally:
        helm("uninstall", name, "--namespace", namespace, check=False)
    wait_until(lambda: cp.kubectl("get", "clusterrole", f"{namespace}-{name}-{RELEASE}",
                                  check=False).returncode != 0, 30, "ClusterRole removed")


def _operator_objects(namespace: str) -> dict[str, dict[str, Any]]:
    """What the operator's builders write that RBAC alone cannot confine: a serving and a
    canary Deployment, a precompile and a GC Job, the GC pod's ServiceAccount, Role and
    RoleBinding (of the "generate" sample, with the settings a site sets most)."""
    from spyre_operator.api import SpyreModelSpec
    from spyre_operator.desired.deployment import build_canary_deployment, build_deployment
    from spyre_operator.desired.gcjob import build_gc_access, build_gc_job
    from spyre_operator.desired.job import build_precompile_job
    from spyre_operator.desired.plan import plan_model

    from tests.golden.test_builders import CANARY
    from tests.unit.samples import ALL

    doc = {**ALL["generate"], "serving": {**(ALL["generate"].get("serving") or {}),
                                          "canary": CANARY}}  # fmt: skip
    plan = plan_model("confined", namespace, "uid-confined", SpyreModelSpec.model_validate(doc))
    account, role, binding = build_gc_access(namespace, [plan.owner])
    objs = {"deployment": build_deployment(plan, plan.key),
            "canary": build_canary_deployment(plan, plan.key),
            "job": build_precompile_job(plan, [plan.owner]),
            "gc-job": build_gc_job(plan, [plan.key], [plan.owner]),
            "serviceaccount": account, "role": role, "rolebinding": binding}  # fmt: skip
    out = {k: v.to_dict() for k, v in objs.items()}
    for d in out.values():  # no SpyreModel of that uid: nothing for the garbage collector
        d["metadata"].pop("ownerReferences", None)
    return out


def _refused_variants(objs: dict[str, dict[str, Any]], clusterrole: str
                      ) -> dict[str, dict[str, Any]]:
    """Each of the operator's objects bent once into what a leaked token would write."""
    import copy

    def bent(kind: str, change: Any) -> dict[str, Any]:
        d = copy.deepcopy(objs[kind])
        change(d)
        return d

    def pod(d: dict[str, Any]) -> dict[str, Any]:
        return d["spec"]["template"]["spec"]  # type: ignore[no-any-return]

    def container(d: dict[str, Any]) -> dict[str, Any]:
        return pod(d)["containers"][0]  # type: ignore[no-any-return]

    return {
        "a token in a serving pod": bent("deployment", lambda d: pod(d).update(
            automountServiceAccountToken=True, serviceAccountName="builder")),
        "a token in a precompile pod": bent("job", lambda d: pod(d).pop(
            "automountServiceAccountToken")),
        "the GC account on another Job": bent("job", lambda d: pod(d).update(
            serviceAccountName="spyre-gc", automountServiceAccountToken=True)),
        "a projected token": bent("canary", lambda d: pod(d).setdefault("volumes", []).append(
            {"name": "t", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}]}})),
        "a hostPath": bent("deployment", lambda d: pod(d).setdefault("volumes", []).append(
            {"name": "root", "hostPath": {"path": "/"}})),
        "the host's network": bent("gc-job", lambda d: pod(d).update(hostNetwork=True)),
        "a privileged container": bent("deployment", lambda d: container(d)[
            "securityContext"].update(privileged=True, allowPrivilegeEscalation=True)),
        "an added capability": bent("job", lambda d: container(d)["securityContext"][
            "capabilities"].update(add=["SYS_ADMIN"])),
        "another ServiceAccount": bent("serviceaccount", lambda d: d["metadata"].update(
            name="builder")),
        "a Role that creates Deployments": bent("role", lambda d: d["rules"].append(
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]})),
        "a binding of the operator's own rights": bent("rolebinding", lambda d: d.update(
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": clusterrole})),
        "a binding to another subject": bent("rolebinding", lambda d: d["subjects"].append(
            {"kind": "ServiceAccount", "name": "default", "namespace": d["metadata"][
                "namespace"]})),
    }


def test_a_leaked_operator_token_writes_only_what_the_operator_makes(
    control_plane: ControlPlane, helm: Helm, namespace: str
) -> None:
    """Issue 45, 3: RBAC lets the operator create Deployments, Jobs, ServiceAccounts, Roles and
    RoleBindings; rbac.confineWrites' admission policies hold its ServiceAccount to what its
    builders make. Each builder's object passes as that account (a server-side dry run, so
    the policies and the chart's RBAC both decide); each bent variant is refused, naming the
    rule, and the same variant from another user (the admin) is not the policies' business."""
    cp = control_plane
    name = f"confine-{uuid.uuid4().hex[:6]}"
    helm("install", name, str(CHART), "--namespace", namespace, "--set", "crds.install=false")
    sa = f"system:serviceaccount:{namespace}:{name}-{RELEASE}"
    clusterrole = f"{namespace}-{name}-{RELEASE}"

    def dry_run(doc: dict[str, Any], *who: str, real: bool = False
                ) -> subprocess.CompletedProcess[str]:
        return cp.kubectl("apply", *([] if real else ["--dry-run=server"]), "--server-side",
                          "--field-manager=spyre-model-operator", "-f", "-", *who,
                          input=json.dumps(doc), check=False)  # fmt: skip

    try:
        ours = _operator_objects(namespace)
        bad = _refused_variants(ours, clusterrole)
        # the policies take effect once the API server has loaded them
        first = next(iter(bad.values()))
        wait_until(lambda: dry_run(first, f"--as={sa}").returncode != 0, 60,
                   "the chart's admission policies in effect")  # fmt: skip
        for kind, doc in ours.items():
            # the RoleBinding's escalation check reads its Role: that one is created (as the
            # operator does, in this order), as is its ServiceAccount
            res = dry_run(doc, f"--as={sa}", real=kind in ("serviceaccount", "role"))
            assert res.returncode == 0, (kind, res.stderr)
        for what, doc in bad.items():
            res = dry_run(doc, f"--as={sa}")
            assert res.returncode != 0 and "ValidatingAdmissionPolicy" in res.stderr \
                and f"{clusterrole}-" in res.stderr, (what, res.stdout, res.stderr)
            assert dry_run(doc).returncode == 0, (what, "refused to the admin too")
    finally:
        helm("uninstall", name, "--namespace", namespace, check=False)


def test_models_pod_monitor_only_where_the_prometheus_operator_is(
    control_plane: ControlPlane, helm: Helm, namespace: str, models_namespace: str
) -> None:
    """monitoring.enabled: without the Prometheus Operator's CRDs the install succeeds and
    says in its notes that no PodMonitor was made; with them (the real CRDs) the models'
    PodMonitor is created, selecting the serving pods' `http` port (`metrics` where
    serving.metricsPort is set) in the watched namespace.
    The dashboard ConfigMap is there in both cases."""
    cp = control_plane
    values = ["--set", "crds.install=false", "--set", "monitoring.enabled=true",
              "--set", "watch.allNamespaces=false",
              "--set", f"watch.namespaces={{{models_namespace}}}",
              "--set", "image.repository=example.invalid/spyre-model-operator"]
    remove_crd(cp, POD_MONITOR_CRD)
    remove_crd(cp, SERVICE_MONITOR_CRD)
    try:
        out = helm("install", RELEASE, str(CHART), "--namespace", namespace, *values).stdout
        assert "does not serve monitoring.coreos.com/v1" in out, out
        assert "no PodMonitor/ServiceMonitor was created" in out
        dash = Kube(cp, namespace).get("configmap", f"{RELEASE}-dashboard-spyre-models")
        assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = (CHART / "dashboards" / "spyre-models.json").read_text()
        assert json.loads(dash["data"]["spyre-models.json"]) == json.loads(shipped)

        with installed_crd(cp, SERVICE_MONITOR_CRD), installed_crd(cp, POD_MONITOR_CRD):
            out = helm("upgrade", RELEASE, str(CHART), "--namespace", namespace,
                       *values).stdout
            assert "does not serve monitoring.coreos.com/v1" not in out
            pm = Kube(cp, namespace).get("podmonitor", f"{RELEASE}-models")
            assert pm is not None
            assert pm["spec"]["selector"]["matchLabels"] == {
                "app.kubernetes.io/managed-by": "spyre-model-operator",
                "app.kubernetes.io/component": "server"}
            assert pm["spec"]["namespaceSelector"] == {"matchNames": [models_namespace]}
            http, metrics = pm["spec"]["podMetricsEndpoints"]
            assert (http["port"], http["path"]) == ("http", "/metrics")
            # not on http where serving.metricsPort moved them (the operator's annotation)
            (drop,) = http["relabelings"]
            assert drop["action"] == "drop" and drop["sourceLabels"] == [
                "__meta_kubernetes_pod_annotation_" + re.sub(
                    "[^a-zA-Z0-9_]", "_", names.METRICS_PORT_ANNOTATION)]
            assert (metrics["port"], metrics["path"]) == ("metrics", "/metrics")
            assert pm["spec"]["podTargetLabels"] == ["serving.spyre.dev/model",
                                                     "serving.spyre.dev/artifact"]
            helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=60s")
    finally:
        helm("uninstall", RELEASE, "--namespace", namespace, check=False)
