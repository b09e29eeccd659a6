"""The Helm chart, rendered offline: lint, RBAC shape, pod security, CRD bytes, scopes.

Needs the pinned `helm` binary from tests/cluster/build.sh (`make binaries`); without it these
tests skip with that hint (the server-side dry runs are in tests/integration/test_chart.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spyre-model-operator"
CRD_FILE = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"
HELM = ControlPlane().bin_dir / "helm"
MONITORING = "monitoring.coreos.com/v1"

#: Combinations the integration test also dry-runs against the API server.
VALUE_SETS: dict[str, list[str]] = {
    "default": [],
    "namespaced": ["--set", "watch.allNamespaces=false",
                   "--set", "watch.namespaces={team-a,team-b}"],
    "replicas-2": ["--set", "replicaCount=2"],
    "monitoring": ["--set", "monitoring.enabled=true", "--api-versions", MONITORING],
    "network-policy": ["--set", "networkPolicy.egress=true",
                       "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}"],
    "site-defaults": [
        "--set", "defaults.engineImage=registry.example.com/spyre/spyre-engine:1.0",
        "--set", "defaults.imagePullSecrets={registry-pull,mirror-pull}",
        "--set", "defaults.serviceAccountName=spyre-engine",
        "--set", "defaults.cardResource=ibm.com/spyre_pf",
        "--set", "defaults.deviceClassName=spyre-standard-vf",
        "--set", "defaults.schedulerName=",
        "--set", "defaults.serving.nodeSelector.pool=spyre",
        "--set", "defaults.serving.tolerations[0].key=ibm.com/spyre",
        "--set", "defaults.serving.tolerations[0].operator=Exists",
        "--set", "defaults.serving.tolerations[0].effect=NoSchedule",
        "--set", "defaults.precompile.nodeSelector.pool=cpu",
        "--set", "defaults.precompile.tolerations[0].key=cpu-only",
        "--set", "defaults.precompile.tolerations[0].operator=Exists",
        "--set", "defaults.storageClassName=nfs-rwx",
        "--set", "allowedEngineImages={registry.example.com/spyre/*}",
    ],
}

needs_helm = pytest.mark.skipif(
    not HELM.exists(), reason=f"helm not built at {HELM}: run `make binaries`"
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{res.stderr}")
    return res


def render(*values: str, namespace: str = "spyre-system") -> list[dict[str, Any]]:
    out = helm("template", "spyre", str(CHART), "--namespace", namespace, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = by_kind(docs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


@needs_helm
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint(name: str) -> None:
    values = [v for v in VALUE_SETS[name] if v != "--api-versions" and v != MONITORING]
    res = helm("lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in res.stdout, res.stdout


@needs_helm
def test_crd_is_the_committed_file_plus_keep() -> None:
    (crd,) = by_kind(render(), "CustomResourceDefinition")
    want = yaml.safe_load(CRD_FILE.read_text())
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == want


@needs_helm
def test_crd_toggles() -> None:
    assert not by_kind(render("--set", "crds.install=false"), "CustomResourceDefinition")
    (crd,) = by_kind(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's rules: not the roles for people (aggregated into view/edit) nor for
    scrapers (metrics-reader: a non-resource URL)."""
    return [r for d in docs if d["kind"] in ("Role", "ClusterRole")
            and "aggregate-to-" not in str(d["metadata"].get("labels"))
            and not d["metadata"]["name"].endswith("-metrics-reader")
            for r in d["rules"]]


@needs_helm
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rbac_is_least_privilege(name: str) -> None:
    rules = _rules(render(*VALUE_SETS[name]))
    assert rules
    for r in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[field], r
        assert "secrets" not in r["resources"]
        assert not {"escalate", "bind", "impersonate"} & set(r["verbs"])
    # The operator lists and watches (kopf) and lists pods; the single objects it reads are a
    # DRA model's (its pods' ResourceClaims, its DeviceClass), never a Secret.
    verbs = {(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"]
             for v in r["verbs"]}
    assert ("", "secrets", "get") not in verbs
    assert ("serving.spyre.dev", "spyremodels", "patch") not in verbs, "only status is written"
    # a canary Deployment is removed when its canary ends (without: the refused canary stayed,
    # every reconcile failing on the delete, tests/realpods/test_output_check.py)
    assert ("apps", "deployments", "delete") in verbs
    # a model moved off a retainPolicy Delete claim: the old PVC is deleted once nothing names
    # or mounts it (control/claims.py); without the verb that delete was refused (issue 45, 3)
    assert ("", "persistentvolumeclaims", "delete") in verbs
    assert ("", "services", "delete") not in verbs, "Services go with their model only"


@needs_helm
def test_the_readme_names_every_rule_the_chart_grants_and_why() -> None:
    """Issue 45, 3: every verb the chart grants (cluster scope, scale to zero and leader
    election on: the most it grants) has its row in the chart README's RBAC table, with the
    code path that uses it, and every row is granted."""
    granted = {(g, res, v) for r in _rules(render("--set", "scaleToZero.enabled=true"))
               for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    text = (CHART / "README.md").read_text()
    section = text.split("\n## RBAC\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| API group |", 1)[1].split("\n\n", 1)[0]
    documented = set()
    for line in table.splitlines()[2:]:
        group, resources, verbs, why = [c.strip() for c in line.strip("|").split("|")][:4]
        assert why, line
        group = "" if group == '""' else group
        for res in resources.split(", "):
            for v in re.findall(r"\b(list|watch|create|patch|delete|get|update)\b", verbs):
                documented.add((group, res, v))
    assert not granted - documented, f"granted without a row: {sorted(granted - documented)}"
    assert not documented - granted, f"a row not granted: {sorted(documented - granted)}"


@needs_helm
@pytest.mark.parametrize("scope", [[], ["--set", "watch.allNamespaces=false", "--set",
                                        "watch.namespaces={team-a}"]])  # fmt: skip
def test_endpointslice_rights_come_with_scale_to_zero_only(scope: list[str]) -> None:
    """Issue 45, 3: the mirror slices are the only EndpointSlices the operator writes, and
    only for scale to zero; off, it neither watches nor may touch any (the operator registers
    that watch only when it is on: handlers.register_mirror_slice_handlers)."""
    def slices(*values: str) -> list[dict[str, Any]]:
        return [r for r in _rules(render(*scope, *values)) if "endpointslices" in r["resources"]]

    assert slices() == []
    assert any("create" in r["verbs"] for r in slices("--set", "scaleToZero.enabled=true"))


def test_the_operator_watches_endpointslices_only_with_scale_to_zero() -> None:
    import kopf
    from spyre_operator import handlers

    def watched() -> bool:
        registry = kopf.get_default_registry()
        return any("endpointslices" in str(getattr(h, "selector", "")) for h in
                   [*registry._indexing.get_all_handlers(),
                    *registry._watching.get_all_handlers()])  # fmt: skip

    if not handlers._MIRROR_SLICES_REGISTERED:
        assert not watched()
    handlers.register_mirror_slice_handlers()
    handlers.register_mirror_slice_handlers()  # once
    assert watched()


@needs_helm
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_dra_rights_are_the_verbs_its_code_uses(name: str) -> None:
    """Issue 46, 5: a DRA model's ResourceClaimTemplates are listed (no watch), applied and
    deleted (control/devices.py, decide/devices.py), its pods' ResourceClaims read by name;
    only the cluster scope may read DeviceClasses (cluster-scoped: a namespaced install gets
    no cluster-wide read for it)."""
    docs = render(*VALUE_SETS[name])
    dra = {(res, v) for r in _rules(docs) if r["apiGroups"] == ["resource.k8s.io"]
           for res in r["resources"] for v in r["verbs"]}
    expected = {("resourceclaimtemplates", v) for v in ("list", "create", "patch", "delete")}
    expected.add(("resourceclaims", "get"))
    if name != "namespaced":
        expected.add(("deviceclasses", "get"))
    assert dra == expected
    roles = [d for d in docs if d["kind"] == "Role"
             for r in d["rules"] if "deviceclasses" in r["resources"]]
    assert not roles, "a Role cannot grant a cluster-scoped resource"


@needs_helm
def test_only_the_cluster_scope_reads_other_installs_leases() -> None:
    """peers.py: a get on Leases (another install's, named by a model's stamp) in the
    ClusterRole; a namespaced install has none (it cannot know the other's namespace)."""
    lease_get = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}
    (cluster,) = [d for d in by_kind(render(), "ClusterRole")
                  if "aggregate-to-" not in str(d["metadata"].get("labels"))
                  and not d["metadata"]["name"].endswith(("-metrics-auth", "-metrics-reader"))]
    assert lease_get in cluster["rules"]
    namespaced = [r for d in by_kind(render(*VALUE_SETS["namespaced"]), "Role")
                  if not d["metadata"]["name"].endswith("leader-election") for r in d["rules"]]
    assert not [r for r in namespaced if "leases" in r["resources"]]


@needs_helm
def test_cluster_scope() -> None:
    docs = render()
    assert [d["metadata"]["name"] for d in by_kind(docs, "ClusterRoleBinding")] == [
        "spyre-system-spyre-spyre-model-operator",
        "spyre-system-spyre-spyre-model-operator-metrics-auth"]
    # the only RoleBinding is the Lease's: leader election is on by default
    assert [d["metadata"]["name"] for d in by_kind(docs, "RoleBinding")] == [
        "spyre-spyre-model-operator-leader-election"]
    args = operator_container(docs)["args"]
    assert "--all-namespaces" in args and "--leader-elect" in args
    assert not any(a.startswith("--namespace") for a in args)
    # scale to zero is off until KEDA is installed (its RBAC names KEDA's namespace)
    assert not any(a.startswith(("--coldstart", "--keda")) for a in args)
    assert "--no-scale-to-zero" in args  # no KEDA watch without its RBAC
    assert not [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("coldstart")]
    args = operator_container(render("--set", "scaleToZero.enabled=true"))["args"]
    assert "--no-scale-to-zero" not in args
    assert "--coldstart-service=spyre-system/spyre-spyre-model-operator-coldstart:8082" in args
    assert "--keda-interceptor-service=keda/keda-add-ons-http-interceptor-proxy" in args
    assert not any(a.startswith("--prometheus-address") for a in args)  # no default
    docs = render("--set", "scaleToZero.enabled=true")
    (cold,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("coldstart")]
    assert cold["spec"]["ports"][0]["targetPort"] == "coldstart"


@needs_helm
def test_namespaced_scope() -> None:
    docs = render(*VALUE_SETS["namespaced"])
    # Cluster-wide, only what deciding a scrape of /metrics takes (operator.metricsAuth): two
    # reviews that store nothing, as the built-in system:auth-delegator grants; off, nothing.
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"].endswith("-metrics-auth")
    (auth,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"]
               == binding["roleRef"]["name"]]  # fmt: skip
    assert auth["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
         "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
         "verbs": ["create"]}]  # fmt: skip
    off = render(*VALUE_SETS["namespaced"], "--set", "operator.metricsAuth=false")
    assert not by_kind(off, "ClusterRoleBinding")
    assert "--metrics-auth=none" in operator_container(off)["args"]
    assert "--metrics-auth=kubernetes" in operator_container(docs)["args"]
    roles = [r for r in by_kind(docs, "Role")
             if not r["metadata"]["name"].endswith(("election", "interceptor-endpoints"))]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    # scale to zero off (the default): nothing in KEDA's namespace, which may not exist (the
    # install failed there on a cluster without KEDA)
    assert not [r for r in by_kind(docs, "Role") if r["metadata"]["namespace"] == "keda"]
    # on: the interceptor proxy's EndpointSlices, read-only, in its namespace
    with_zero = render(*VALUE_SETS["namespaced"], "--set", "scaleToZero.enabled=true")
    (interceptor,) = [r for r in by_kind(with_zero, "Role")
                      if r["metadata"]["name"].endswith("interceptor-endpoints")]
    assert interceptor["metadata"]["namespace"] == "keda"
    assert interceptor["rules"] == [{"apiGroups": ["discovery.k8s.io"],
                                     "resources": ["endpointslices"],
                                     "verbs": ["list", "watch"]}]
    # Two releases of one name in two namespaces (a team each) do not claim one Role there.
    other = render(*VALUE_SETS["namespaced"], "--set", "scaleToZero.enabled=true",
                   namespace="team-ops")
    names_in_keda = {d["kind"]: d["metadata"]["name"] for d in with_zero
                     if d["metadata"].get("namespace") == "keda"}
    others_in_keda = {d["kind"]: d["metadata"]["name"] for d in other
                      if d["metadata"].get("namespace") == "keda"}
    assert set(names_in_keda) == {"Role", "RoleBinding"}
    assert not set(names_in_keda.values()) & set(others_in_keda.values()), names_in_keda
    for rb in by_kind(docs, "RoleBinding"):
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "spyre-spyre-model-operator",
                                   "namespace": "spyre-system"}]
    args = operator_container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args


@needs_helm
def test_namespaced_scope_needs_namespaces() -> None:
    res = helm("template", "spyre", str(CHART), "--set", "watch.allNamespaces=false",
               check=False)
    assert res.returncode != 0


@needs_helm
def test_replicas_turn_on_leader_election() -> None:
    docs = render(*VALUE_SETS["replicas-2"])
    args = operator_container(docs)["args"]
    assert "--leader-elect" in args
    assert "--leader-election-namespace=spyre-system" in args
    (role,) = [r for r in by_kind(docs, "Role")
               if r["metadata"]["name"].endswith("leader-election")]
    assert role["metadata"]["namespace"] == "spyre-system"
    assert {"coordination.k8s.io"} == {g for r in role["rules"] for g in r["apiGroups"]}
    get_update = [r for r in role["rules"] if "get" in r["verbs"]]
    assert get_update[0]["resourceNames"] == ["spyre-spyre-model-operator"]  # the release's
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert by_kind(docs, "PodDisruptionBudget")


def _lease(docs: list[dict[str, Any]]) -> tuple[str, set[str]]:
    """The Lease the operator is told to use, and the Lease names RBAC lets it get/update."""
    (arg,) = [a for a in operator_container(docs)["args"]
              if a.startswith("--leader-election-lease=")]
    return arg.split("=", 1)[1], {n for r in _rules(docs) for n in r.get("resourceNames", [])}


@needs_helm
def test_lease_name_matches_the_operator() -> None:
    arg, granted = _lease(render(*VALUE_SETS["replicas-2"]))
    assert granted == {arg}
    named, granted = _lease(render(*VALUE_SETS["replicas-2"], "--set",
                                   "leaderElection.leaseName=tenant-a-lease"))
    assert named == "tenant-a-lease" and granted == {named}


@needs_helm
def test_two_releases_in_one_namespace_have_their_own_lease() -> None:
    """One constant Lease name made one release's operator a standby of the other's forever."""
    leases = set()
    for release in ("tenant-a", "tenant-b"):
        res = helm("template", release, str(CHART), "--namespace", "shared")
        docs = [d for d in yaml.safe_load_all(res.stdout) if d]
        leases.add(_lease(docs)[0])
    assert len(leases) == 2, leases


@needs_helm
def test_pod_is_restricted() -> None:
    docs = render()
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = operator_container(docs)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    assert dep["spec"]["replicas"] == 1
    # leader election is on by default: old and new operator pods hand over through the Lease
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    no_election = render("--set", "leaderElection.enabled=false")
    dep = by_kind(no_election, "Deployment")[0]
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert "--no-leader-elect" in operator_container(no_election)["args"]


@needs_helm
def test_monitoring_needs_the_prometheus_operator_api() -> None:
    kinds = {d["kind"] for d in render("--set", "monitoring.enabled=true")}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}
    docs = render(*VALUE_SETS["monitoring"])
    (sm,) = by_kind(docs, "ServiceMonitor")
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "spyre-model-operator",
        "app.kubernetes.io/component": "server",
    }
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert by_kind(docs, "Service")


@needs_helm
@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_the_operator_monitor_scrapes_with_a_token_only_metrics_reader_grants(kind: str) -> None:
    """Issue 45, 4: with operator.metricsAuth (the default) the monitor sends the token of a
    ServiceAccount of its own, bound to the metrics-reader ClusterRole (get /metrics, nothing
    else); with operator.metricsTLS it scrapes https with the given tlsConfig."""
    docs = render(*VALUE_SETS["monitoring"], "--set", f"monitoring.operator.kind={kind}",
                  "--set", "operator.metricsTLS.secretName=op-tls",
                  "--set", "monitoring.operator.tlsConfig.serverName=op.example",
                  "--set", "monitoring.operator.serviceAnnotations.a=b")  # fmt: skip
    def operator_endpoint(docs: list[dict[str, Any]]) -> dict[str, Any]:
        (mon,) = [m for m in by_kind(docs, kind) if not m["metadata"]["name"].endswith("models")]
        (ep,) = mon["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
        return ep  # type: ignore[no-any-return]

    ep = operator_endpoint(docs)
    secret = ep["authorization"]["credentials"]["name"]
    assert ep["authorization"]["type"] == "Bearer" and ep["scheme"] == "https"
    assert ep["tlsConfig"] == {"serverName": "op.example"}
    (tok,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == secret]
    sa = tok["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert tok["type"] == "kubernetes.io/service-account-token"
    assert [d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")].count(sa) == 1
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding")
                  if b["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                        "namespace": "spyre-system"}]]  # fmt: skip
    (reader,) = [r for r in by_kind(docs, "ClusterRole")
                 if r["metadata"]["name"] == binding["roleRef"]["name"]]  # fmt: skip
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    c = operator_container(docs)
    assert "--metrics-auth=kubernetes" in c["args"]
    assert "--metrics-tls-dir=/etc/spyre/metrics-tls" in c["args"]
    (dep,) = by_kind(docs, "Deployment")
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["metrics-tls"]["secret"]["secretName"] == "op-tls"
    if kind == "ServiceMonitor":  # OpenShift's service CA writes op-tls once annotated
        (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("metrics")]
        assert svc["metadata"]["annotations"] == {"a": "b"}
    # off: no token, no scraper, plain HTTP
    plain = render(*VALUE_SETS["monitoring"], "--set", f"monitoring.operator.kind={kind}",
                   "--set", "operator.metricsAuth=false")  # fmt: skip
    ep = operator_endpoint(plain)
    assert "authorization" not in ep and "scheme" not in ep
    assert not [d for d in by_kind(plain, "Secret") if "metrics-scraper" in d["metadata"]["name"]]
    assert not [r for r in by_kind(plain, "ClusterRole") if "metrics" in r["metadata"]["name"]]


@needs_helm
def test_model_monitor_follows_the_watched_namespaces() -> None:
    docs = render(*VALUE_SETS["monitoring"], *VALUE_SETS["namespaced"],
                  "--set", "monitoring.models.kind=ServiceMonitor",
                  "--set", "monitoring.operator.kind=PodMonitor")
    models = [d for d in by_kind(docs, "ServiceMonitor")]
    assert models[0]["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert len(by_kind(docs, "PodMonitor")) == 1


@needs_helm
def test_model_monitors_per_namespace_for_user_workload_monitoring() -> None:
    """Issue 28: OpenShift's user-workload monitoring ignores a monitor's namespaceSelector, so
    perNamespace puts one monitor in each model namespace, selecting its own pods."""
    docs = render(*VALUE_SETS["monitoring"], *VALUE_SETS["namespaced"],
                  "--set", "monitoring.models.perNamespace=true",
                  "--set", "monitoring.models.namespaces={team-c,team-a}")
    models = [d for d in by_kind(docs, "PodMonitor")]
    assert sorted(m["metadata"]["namespace"] for m in models) == ["team-a", "team-b", "team-c"]
    for m in models:
        assert "namespaceSelector" not in m["spec"], m["spec"]
        assert m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
        assert [e["port"] for e in m["spec"]["podMetricsEndpoints"]] == ["http", "metrics"]
    # With every namespace watched, the namespaces must be listed.
    docs = render(*VALUE_SETS["monitoring"], "--set", "monitoring.models.perNamespace=true",
                  "--set", "monitoring.models.namespaces={team-x}")
    assert [m["metadata"]["namespace"] for m in by_kind(docs, "PodMonitor")] == ["team-x"]
    res = helm("template", "spyre", str(CHART), *VALUE_SETS["monitoring"],
               "--set", "monitoring.models.perNamespace=true", check=False)
    assert res.returncode != 0 and "monitoring.models.namespaces" in res.stderr


@needs_helm
def test_network_policy() -> None:
    (np,) = by_kind(render(*VALUE_SETS["network-policy"]), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    api = np["spec"]["egress"][0]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


@needs_helm
@pytest.mark.parametrize("values", [
    ["--set", "replicaCount=-1"],
    ["--set", "operator.logLevel=verbose"],
    ["--set", "unknownKey=1"],
    ["--set", "monitoring.models.kind=Probe"],
    ["--set", "defaults.cardResource=spyre_vf"],
    ["--set", "defaults.serving.tolerations[0].operator=Maybe"],
    ["--set", "defaults.engine=x"],
])
def test_schema_rejects(values: list[str]) -> None:
    assert helm("template", "spyre", str(CHART), *values, check=False).returncode != 0


def _site(docs: list[dict[str, Any]]) -> Any:
    """The SiteDefaults the operator builds from the rendered container's arguments."""
    from spyre_operator.cli import build_parser, site_defaults

    return site_defaults(build_parser().parse_args(operator_container(docs)["args"]))


@needs_helm
def test_site_defaults_reach_the_operator() -> None:
    """Every defaults.* value becomes the operator's default, read back by its own parser."""
    from spyre_operator.api.v1alpha1 import Toleration
    from spyre_operator.desired.site import SiteDefaults

    assert _site(render(*VALUE_SETS["site-defaults"])) == SiteDefaults(
        engine_image="registry.example.com/spyre/spyre-engine:1.0",
        image_pull_secrets=("registry-pull", "mirror-pull"),
        service_account_name="spyre-engine",
        resource_name="ibm.com/spyre_pf",
        device_class_name="spyre-standard-vf",
        scheduler_name="",
        serving_node_selector={"pool": "spyre"},
        serving_tolerations=(
            Toleration(key="ibm.com/spyre", operator="Exists", effect="NoSchedule"),
        ),
        precompile_node_selector={"pool": "cpu"},
        precompile_tolerations=(Toleration(key="cpu-only", operator="Exists"),),
        storage_class_name="nfs-rwx",
        allowed_engine_images=("registry.example.com/spyre/*",),
    )


@needs_helm
def test_without_site_values_the_operator_keeps_its_builtin_defaults() -> None:
    from spyre_operator.desired.site import SiteDefaults

    docs = render()
    assert not [a for a in operator_container(docs)["args"]
                if a.startswith(("--default-", "--allowed-"))]
    assert _site(docs) == SiteDefaults()


@pytest.mark.parametrize("args,error", [
    (["--default-serving-node-selector", "pool=spyre"], "--default-serving-node-selector"),
    (["--default-precompile-tolerations", '{"key": "cpu-only"}'],
     "--default-precompile-tolerations"),
    (["--default-card-resource", "spyre_vf"], "not an extended resource name"),
    (["--default-device-class", "Spyre_VF"], "not a DeviceClass name"),
    (["--default-engine-image", "docker.io/x/e:1", "--allowed-engine-image", "quay.io/y/*"],
     "every model leaving engine.image unset would be refused"),
])
def test_site_flags_that_cannot_work_stop_the_operator(args: list[str], error: str) -> None:
    """Refused at start-up, naming the flag, rather than on every model."""
    from spyre_operator.cli import build_parser, site_defaults

    with pytest.raises(ValueError, match=error):
        site_defaults(build_parser().parse_args(["run", "-A", *args]))


@needs_helm
def test_the_readmes_site_values_render_and_reach_the_operator(tmp_path: Path) -> None:
    """README, "Install the operator with Helm": the values file for a Spyre site is valid
    (schema, lint) on a release's chart (operator/scripts/release.py pins both images by
    digest into a copy of the chart) and its defaults become the operator's."""
    import re
    import shutil

    from tests.scripts import script

    release = script("release")
    chart = tmp_path / "spyre-model-operator"
    shutil.copytree(CHART, chart)
    operator = "registry.example.com/spyre/spyre-model-operator@sha256:" + "a" * 64
    engine = "registry.example.com/spyre/spyre-engine@sha256:" + "b" * 64
    release.pin_chart(chart, "0.1.0", operator, engine)

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(# spyre-values\.yaml\n.*?)```", readme, re.S)
    assert block is not None, "the README's spyre-values.yaml block is gone"
    values = tmp_path / "spyre-values.yaml"
    values.write_text(block.group(1))
    res = helm("lint", "--strict", str(chart), "-f", str(values))
    assert "0 chart(s) failed" in res.stdout, res.stdout
    out = helm("template", "spyre", str(chart), "--namespace", "spyre-system", "-f",
               str(values), "--api-versions", MONITORING).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert operator_container(docs)["image"] == operator
    site = _site(docs)
    assert site.engine_image == engine
    assert site.allows(site.engine_image) and not site.allows("docker.io/library/busybox")
    assert site.storage_class_name and site.precompile_node_selector


@needs_helm
def test_budget_values_reach_the_operator() -> None:
    args = operator_container(render())["args"]
    assert "--max-concurrent-compiles=4" in args and "--max-concurrent-rollouts=4" in args
    args = operator_container(render("--set", "budget.maxConcurrentCompiles=2",
                                     "--set", "budget.maxConcurrentRollouts=0"))["args"]
    assert "--max-concurrent-compiles=2" in args and "--max-concurrent-rollouts=0" in args
    # the schema refuses what the operator would refuse
    res = helm("template", "spyre", str(CHART), "--set", "budget.maxConcurrentCompiles=-1",
               check=False)
    assert res.returncode != 0 and "maxConcurrentCompiles" in res.stderr


def _pod_security(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = by_kind(docs, "Deployment")[0]
    return dep["spec"]["template"]["spec"]["securityContext"]  # type: ignore[no-any-return]


@needs_helm
@pytest.mark.parametrize(("args", "mode"), [
    ([], "fixed"),  # auto on a cluster without security.openshift.io
    (["--api-versions", "security.openshift.io/v1"], "assigned"),  # auto on OpenShift
    (["--set", "podUser=assigned"], "assigned"),
    (["--set", "podUser=fixed", "--api-versions", "security.openshift.io/v1"], "fixed"),
])
def test_pod_user_decides_the_operator_pods_uid_and_its_models(args: list[str], mode: str) -> None:
    """podUser: the operator pod pins 65532 only when fixed, and the operator is told the same
    for the pods it creates (--pod-user, read back by its own parser)."""
    docs = render(*args)
    sc = _pod_security(docs)
    pinned = {k: sc.get(k) for k in ("runAsUser", "runAsGroup", "fsGroup")}
    if mode == "fixed":
        assert pinned == {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}, sc
    else:
        assert pinned == {"runAsUser": None, "runAsGroup": None, "fsGroup": None}, sc
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert f"--pod-user={mode}" in operator_container(docs)["args"]
    assert _site(docs).platform_assigns_user is (mode == "assigned")


@needs_helm
def test_pod_user_values_given_in_pod_security_context_win_and_bad_values_are_refused() -> None:
    sc = _pod_security(render("--set", "podSecurityContext.runAsUser=70000"))
    assert sc["runAsUser"] == 70000 and sc["fsGroup"] == 65532
    res = helm("template", "spyre", str(CHART), "--set", "podUser=root", check=False)
    assert res.returncode != 0 and "podUser" in res.stderr


@needs_helm
def test_operator_network_policy_allows_dns_on_kubernetes_and_openshift() -> None:
    """Egress to kube-dns (port 53) and to OpenShift's DNS pods (openshift-dns, port 5353)."""
    pol = by_kind(render("--set", "networkPolicy.egress=true"), "NetworkPolicy")[0]
    dns = [r for r in pol["spec"]["egress"]
           if any(p["port"] in (53, 5353) for p in r.get("ports", []))]
    assert len(dns) == 1, pol["spec"]["egress"]
    ports = {(p["port"], p["protocol"]) for p in dns[0]["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP"), (5353, "UDP"), (5353, "TCP")}
    peers = dns[0]["to"]
    assert {"k8s-app": "kube-dns"} in [p["podSelector"]["matchLabels"] for p in peers]
    openshift = [p for p in peers if p.get("namespaceSelector", {}).get("matchLabels") ==
                 {"kubernetes.io/metadata.name": "openshift-dns"}]
    assert openshift and openshift[0]["podSelector"]["matchLabels"] == {
        "dns.operator.openshift.io/daemonset-dns": "default"}


@needs_helm
def test_the_operator_pod_admits_only_its_ports_by_default() -> None:
    """Issue 45, 4: the operator pod's NetworkPolicy is on by default and holds ingress only
    (nothing else calls the operator: free); the cold-start port is open with scale to zero
    alone; egress is the site's choice (it needs the API server's address)."""
    (pol,) = by_kind(render(), "NetworkPolicy")
    assert pol["spec"]["policyTypes"] == ["Ingress"] and "egress" not in pol["spec"], pol
    ports = {p["port"] for r in pol["spec"]["ingress"] for p in r["ports"]}
    assert ports == {"metrics", "health"}, pol["spec"]["ingress"]
    (pol,) = by_kind(render("--set", "scaleToZero.enabled=true"), "NetworkPolicy")
    assert {p["port"] for r in pol["spec"]["ingress"] for p in r["ports"]} == {
        "metrics", "health", "coldstart"}
    # every port the policy names is one of the operator container's
    named = {p["name"] for p in operator_container(render("--set", "scaleToZero.enabled=true"))
             ["ports"]}  # fmt: skip
    assert {"metrics", "health", "coldstart"} <= named, named
    assert not by_kind(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy")


@needs_helm
def test_the_operators_egress_reaches_the_serving_pods_it_reads() -> None:
    """With egress held, the operator may still read each canary and baseline pod's report
    on its serving port (canary_report.py): the rule's port and pod labels are the ones the
    operator's builders give serving pods (desired/deployment.py, desired/names.py)."""
    from spyre_operator.desired import names
    from spyre_operator.desired.deployment import PORT_NAME

    (pol,) = by_kind(render("--set", "networkPolicy.egress=true"), "NetworkPolicy")
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"], pol["spec"]
    serving_pods = {names.MANAGED_BY: names.MANAGED_BY_VALUE,
                    names.COMPONENT: names.COMPONENT_SERVER}
    reads = [r for r in pol["spec"]["egress"] for peer in r.get("to", [])
             if peer.get("namespaceSelector") == {}
             and (peer.get("podSelector") or {}).get("matchLabels", {}).items()
             <= serving_pods.items()]  # fmt: skip
    assert reads, pol["spec"]["egress"]
    assert [p["port"] for p in reads[0]["ports"]] == [PORT_NAME], reads


@needs_helm
@pytest.mark.parametrize(("args", "scc"), [
    ([], None),  # plain Kubernetes: podUser auto -> fixed, nothing pinned
    (["--api-versions", "security.openshift.io/v1"], "restricted-v2"),
    (["--set", "podUser=assigned", "--set", "requiredSCC=site-restricted"], "site-restricted"),
    (["--api-versions", "security.openshift.io/v1", "--set", "requiredSCC="], None),
])  # fmt: skip
def test_the_operator_pod_and_the_operator_pin_the_scc(args: list[str], scc: str | None) -> None:
    """Issue 46, 2: on OpenShift the operator's own pod pins its SCC, and the operator is told
    which one to pin on every pod it makes."""
    docs = render(*args, "--set", "podAnnotations.team=ml")
    (dep,) = by_kind(docs, "Deployment")
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations.get("openshift.io/required-scc") == scc and annotations["team"] == "ml"
    assert f"--required-scc={scc or ''}" in operator_container(docs)["args"]


@needs_helm
def test_the_selinux_change_policy_reaches_the_operator() -> None:
    """Issue 46, 3: the chart's selinuxChangePolicy is the operator's flag; the schema refuses
    what Kubernetes would."""
    assert "--selinux-change-policy=" in operator_container(render())["args"]
    args = operator_container(render("--set", "selinuxChangePolicy=MountOption"))["args"]
    assert "--selinux-change-policy=MountOption" in args
    res = helm("template", "x", str(CHART), "--set", "selinuxChangePolicy=mountoption",
               check=False)
    assert res.returncode != 0 and "selinuxChangePolicy" in res.stderr, res.stderr


@needs_helm
def test_the_admission_policies_name_the_operators_account() -> None:
    """rbac.confineWrites (tests/integration/test_chart.py sends the builders' objects through
    them): both policies bound with Deny, matched on this release's ServiceAccount; none when
    turned off. (The chart needs Kubernetes 1.30, ValidatingAdmissionPolicy's v1: Chart.yaml.)"""
    docs = render("--set", "serviceAccount.name=op-sa")
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "spyre-system-spyre-spyre-model-operator-gc-access",
        "spyre-system-spyre-spyre-model-operator-workloads"]
    for p in policies:
        (match,) = p["spec"]["matchConditions"]
        assert match["expression"] == (
            'request.userInfo.username == "system:serviceaccount:spyre-system:op-sa"'), match
        assert p["spec"]["failurePolicy"] == "Fail"
    bindings = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert sorted((b["spec"]["policyName"], tuple(b["spec"]["validationActions"]))
                  for b in bindings) == sorted(
        (p["metadata"]["name"], ("Deny",)) for p in policies)  # fmt: skip
    assert not by_kind(render("--set", "rbac.confineWrites=false"), "ValidatingAdmissionPolicy")


@needs_helm
def test_the_openshift_guides_values_blocks_are_values_the_chart_takes(tmp_path: Path) -> None:
    """Each ``# ...: add to spyre-values.yaml`` block of docs/openshift.md passes the chart's
    schema and renders (a renamed value there would fail here, not at a site's install)."""
    text = (ROOT / "docs" / "openshift.md").read_text()
    blocks = re.findall(r"```yaml\n(# [^\n]*add to spyre-values\.yaml\n.*?)```", text, re.S)
    assert len(blocks) >= 3, blocks
    for i, block in enumerate(blocks):
        values = tmp_path / f"values-{i}.yaml"
        values.write_text(block)
        res = helm("lint", "--strict", str(CHART), "-f", str(values))
        assert "0 chart(s) failed" in res.stdout, (block, res.stdout)
        helm("template", "spyre", str(CHART), "-f", str(values), "--api-versions", MONITORING)
