"""Every pod the operator can create is admitted under OpenShift's restricted-v2 SCC (issue 28).

restricted-v2 is emulated on the real API server with Kubernetes' own admission policies
(tests/cluster/manifests/restricted-v2.yaml, in namespaces made by
``tests.realpods.support.ensure_namespace``). Each builder's pod template (the precompile Job,
on and off the cards; the serving Deployment; the GC Job) over models that exercise every
volume and option the builders add is created as a Pod with a server-side dry run: with
``--pod-user assigned`` (SiteDefaults.platform_assigns_user) each is admitted and assigned the
namespace's uid and fsGroup; pinned (``fixed``, plain Kubernetes) each is refused, naming the
range. The real-node tests run their pods in such namespaces too (tests/realpods, the chart's
pod in tests/integration/test_chart_pod.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.gcjob import GC_SERVICE_ACCOUNT, build_gc_job
from spyre_operator.desired.job import build_precompile_job
from spyre_operator.desired.plan import plan_model
from spyre_operator.desired.site import SiteDefaults

from tests.cluster.controlplane import ControlPlane
from tests.realpods import support

from ..unit.samples import ALL

pytestmark = pytest.mark.integration

#: Models over which every builder option that touches the pod shows: the samples (hf://, a
#: pvc:// model, TP 4 on cards, CPU backend with a managed ReadWriteOnce cache), plus a gated
#: model with a CA bundle, a site model_configs.yaml and the metrics port.
EXTRA = {
    "gated": {
        "model": {"uri": "hf://org/gated", "tokenSecret": {"name": "hf", "key": "token"},
                  "caBundle": {"name": "ca", "key": "ca.crt"},
                  "downloadEnv": [{"name": "HF_ENDPOINT", "value": "https://hub.example"}]},
        "compile": {"backend": "sendnn", "modelConfigFile": {"name": "cfg", "key": "c.yaml"},
                    "tensorParallelSize": 1, "maxModelLen": 512, "maxNumSeqs": 4,
                    "maxNumBatchedTokens": 128},
        "precompile": {"onCards": True},
        "serving": {"metricsPort": 9000},
    },
}
SPECS = {**ALL, **EXTRA}


def _pods(name: str, spec_doc: dict[str, Any], site: SiteDefaults, ns: str) -> dict[str, Any]:
    """Pod manifests from each builder's pod template, for model ``name`` in ``ns``."""
    plan = plan_model(name, ns, f"uid-{name}", SpyreModelSpec.model_validate(spec_doc), site)
    templates = {
        "precompile": build_precompile_job(plan, [plan.owner]).spec.template,
        "serving": build_deployment(plan, plan.key).spec.template,
        "gc": build_gc_job(plan, [plan.key], [plan.owner]).spec.template,
    }
    out = {}
    for kind, t in templates.items():
        d = t.to_dict()
        out[kind] = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"{name}-{kind}", "namespace": ns,
                                  "labels": d["metadata"].get("labels", {})},
                     "spec": d["spec"]}
    return out


def _dry_run(cp: ControlPlane, pod: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    r = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                   input=json.dumps(pod), check=False)
    return (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


@pytest.fixture
def scc_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    support.ensure_namespace(control_plane, namespace, labels={"spyre.dev/test-namespace": "true"})
    # The GC pod's account (the operator creates it with the GC Job's Role).
    control_plane.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": GC_SERVICE_ACCOUNT, "namespace": namespace}})
    yield namespace


@pytest.mark.parametrize("sample", sorted(SPECS))
def test_every_operator_pod_is_admitted_with_the_assigned_user(
    control_plane: ControlPlane, scc_namespace: str, sample: str
) -> None:
    ns, first = scc_namespace, support.scc_range_start(scc_namespace)
    for kind, pod in _pods(sample, SPECS[sample], SiteDefaults(platform_assigns_user=True),
                           ns).items():
        created, err = _dry_run(control_plane, pod)
        assert created is not None, f"{sample} {kind} pod refused: {err}"
        sc = created["spec"]["securityContext"]
        assert (sc.get("runAsUser"), sc.get("fsGroup")) == (first, first), (kind, sc)
        assert not sc.get("runAsGroup"), (kind, sc)


@pytest.mark.parametrize("sample", sorted(SPECS))
def test_a_pinned_uid_is_refused(
    control_plane: ControlPlane, scc_namespace: str, sample: str
) -> None:
    """What ``--pod-user fixed`` builds (plain Kubernetes) cannot run there: the emulation
    refuses what restricted-v2 refuses, so the test above can fail."""
    for kind, pod in _pods(sample, SPECS[sample], SiteDefaults(), scc_namespace).items():
        created, err = _dry_run(control_plane, pod)
        assert created is None, f"{sample} {kind} pod pinned uid 1001 and was admitted"
        assert "runAsUser 1001 is not in the namespace's range" in err, err


@pytest.fixture
def scc_only_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """A namespace with the emulated restricted-v2 and no Pod Security level, so that what
    both refuse is refused by the emulation (Pod Security's admission runs first)."""
    name = f"{namespace[:55]}-scc"
    support.ensure_namespace(control_plane, name, restricted=False,
                             labels={"spyre.dev/test-namespace": "true"})
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                          check=False)


def _no_run_as_non_root(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"].pop("runAsNonRoot")
    pod["spec"]["containers"][0]["securityContext"].pop("runAsNonRoot")


def test_the_emulation_refuses_what_restricted_v2_refuses(
    control_plane: ControlPlane, scc_only_namespace: str
) -> None:
    """Each rule of the policy, broken once in an otherwise admitted serving pod."""
    pod = _pods("generate", ALL["generate"], SiteDefaults(platform_assigns_user=True),
                scc_only_namespace)["serving"]
    assert _dry_run(control_plane, pod)[0] is not None
    c = pod["spec"]["containers"][0]["securityContext"]
    breaks = {
        "fsGroup": lambda p: p["spec"]["securityContext"].update(fsGroup=1001),
        "runAsNonRoot": _no_run_as_non_root,
        "allowPrivilegeEscalation": lambda p: p["spec"]["containers"][0]["securityContext"]
        .update(allowPrivilegeEscalation=True),
        "capabilities": lambda p: p["spec"]["containers"][0]["securityContext"]
        .update(capabilities={"drop": ["NET_RAW"]}),
        "seccompProfile": lambda p: p["spec"]["securityContext"]
        .update(seccompProfile={"type": "Unconfined"}),
        "host": lambda p: p["spec"].update(hostIPC=True),
        "volumes": lambda p: p["spec"]["volumes"].append(
            {"name": "host", "hostPath": {"path": "/var"}}),
        "container uid": lambda p: p["spec"]["containers"][0]["securityContext"]
        .update(runAsUser=1001),
    }
    assert c.get("runAsNonRoot") is True
    for what, brk in breaks.items():
        broken = json.loads(json.dumps(pod))
        brk(broken)
        created, err = _dry_run(control_plane, broken)
        assert created is None, f"admitted with {what} broken"
        assert "restricted-v2" in err, (what, err)
