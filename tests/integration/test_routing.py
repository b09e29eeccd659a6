"""spec.routing.inferencePool on the real API server, with the Inference Extension's own CRD.

The InferencePool CRD comes from the extension's release (its Go module,
tests/cluster/crds.sh): the API server validates and defaults the pool the operator writes
with the extension's real schema. No Gateway implementation runs here; the test writes the
pool's status the way one does (status.parents[].conditions, as the v1 API defines them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.thirdparty import INFERENCE_POOL_CRD, crd_name, installed_crd, remove_crd

from .conftest import Kube, OperatorProcess, reconcile_now, settle_writes
from .test_operator import spec

pytestmark = pytest.mark.integration

ROUTING = {"inferencePool": {"endpointPicker": {"name": "routed-epp", "port": 9002}}}
GATEWAY = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw"}


def parent_status(kube: Kube, accepted: str, reason: str, message: str) -> None:
    """Write the pool's status as a Gateway implementation would (the status subresource)."""
    status = {"parents": [{
        "parentRef": {**GATEWAY, "namespace": kube.ns},
        "controllerName": "example.net/inference-gateway",
        "conditions": [{"type": "Accepted", "status": accepted, "reason": reason,
                        "message": message, "observedGeneration": 1,
                        "lastTransitionTime": "2026-11-22T10:00:00Z"}],
    }]}
    kube.kubectl("patch", "inferencepool", "routed", "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))


def pool_reads(op: OperatorProcess) -> float:
    """GET requests on inferencepools so far (the watch's LIST and WATCH are GETs too)."""
    return sum(v for k, v in op.metrics().items()
               if k.startswith("spyre_operator_api_requests_total") and 'verb="GET"' in k
               and 'resource="inferencepools"' in k)


@pytest.fixture
def routing_operator(
    control_plane: ControlPlane, kubeconfig: Path, operator: OperatorProcess
) -> Any:
    """An operator that looks for an absent CRD every 2 s (default 60 s), instead of the
    session's: two operators must never both reconcile one namespace."""
    operator.stop()
    remove_crd(control_plane, INFERENCE_POOL_CRD)  # start without the CRD
    op = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                         env={"SPYRE_OPTIONAL_API_RECHECK_SECONDS": "2"})
    op.start()
    try:
        yield op
    finally:
        op.stop()
        operator.start()


def test_inference_pool_from_missing_crd_to_accepted(
    kube: Kube, control_plane: ControlPlane, routing_operator: OperatorProcess
) -> None:
    kube.apply_model("routed", spec(routing=ROUTING, replicas=2))
    # No CRD: the model serves, and one condition says what is missing.
    kube.wait_condition("routed", "Ready", timeout=90)
    c = kube.wait_condition("routed", "RoutingReady", "False", reason="InferencePoolCRDMissing")
    assert "inference.networking.k8s.io/v1" in c["message"]
    assert kube.condition("routed", "Degraded")["status"] == "False"
    log = routing_operator.log_tail(400)
    # No reconcile error loop for this model. (The fresh operator also lists the models of
    # earlier tests' namespaces being deleted: their transient errors are not this test's; the
    # ones seen here, a 404 on a status or on a Job's owners, are unit-tested as no failures.)
    looped = [ln for ln in log.splitlines() if "failed (retry in" in ln and f"{kube.ns}/" in ln]
    assert not looped, log
    assert "Traceback" not in log, log

    with installed_crd(control_plane, INFERENCE_POOL_CRD):
        # The watch finds the CRD and the pool is created, with the real schema's defaults.
        pool = kube.wait(lambda: kube.get("inferencepool", "routed"), 60, "the InferencePool")
        svc = kube.get("service", "routed")
        assert pool["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        assert pool["spec"]["appProtocol"] == "http"
        assert pool["spec"]["endpointPickerRef"] == {
            "group": "", "kind": "Service", "name": "routed-epp", "port": {"number": 9002},
            "failureMode": "FailClose"}
        [ref] = pool["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["controller"]) == ("SpyreModel", "routed", True)
        # It selects exactly the model's serving pods.
        sel = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
        pods = kube.items("pods", sel)
        assert len(pods) == 2
        assert all(p["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
                   for p in pods)
        c = kube.wait_condition("routed", "RoutingReady", "False", reason="InferencePoolPending")
        assert "HTTPRoute" in c["message"]

        # A Gateway accepts the pool, then stops accepting it.
        parent_status(kube, "True", "Accepted", "")
        c = kube.wait_condition("routed", "RoutingReady", "True", reason="InferencePoolAccepted")
        assert f"Gateway {kube.ns}/inference-gw" in c["message"]
        # Idle: a reconcile (the model touched) writes nothing; the pool is read from the watch.
        settle_writes(routing_operator, kube.ns)  # trailing status writes and Events
        writes, reads = routing_operator.namespace_writes(kube.ns), pool_reads(routing_operator)
        version = kube.get("inferencepool", "routed")["metadata"]["resourceVersion"]
        reconcile_now(kube, routing_operator, "routed")
        assert routing_operator.namespace_writes(kube.ns) == writes, "an idle reconcile wrote"
        assert pool_reads(routing_operator) == reads, "a reconcile read the pool from the API"
        assert kube.get("inferencepool", "routed")["metadata"]["resourceVersion"] == version
        parent_status(kube, "False", "NotSupportedByParent", "no inference extension here")
        c = kube.wait_condition("routed", "RoutingReady", "False",
                                reason="InferencePoolNotAccepted")
        assert "NotSupportedByParent: no inference extension here" in c["message"]
        assert kube.condition("routed", "Ready")["status"] == "True"

        # Drift: a deleted pool comes back.
        uid = pool["metadata"]["uid"]
        kube.kubectl("delete", "inferencepool", "routed")
        again = kube.wait(
            lambda: (p := kube.get("inferencepool", "routed")) and p["metadata"]["uid"] != uid
            and p, 60, "the InferencePool recreated")
        assert again["spec"]["targetPorts"] == [{"number": 8000}]

        # Routing removed from the spec: the pool and the condition go.
        kube.apply_model("routed", spec(replicas=2))
        kube.wait(lambda: kube.get("inferencepool", "routed") is None, 60, "the pool deleted")
        wait_until(lambda: kube.condition("routed", "RoutingReady") is None, 60,
                   "RoutingReady removed")
    assert kube.condition("routed", "Ready")["status"] == "True"
    assert crd_name(INFERENCE_POOL_CRD) == "inferencepools.inference.networking.k8s.io"


def test_a_pool_that_is_not_the_operators_is_never_taken_over(
    kube: Kube, control_plane: ControlPlane, routing_operator: OperatorProcess
) -> None:
    with installed_crd(control_plane, INFERENCE_POOL_CRD):
        foreign = {
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "mine", "namespace": kube.ns},
            "spec": {"selector": {"matchLabels": {"app": "other"}},
                     "targetPorts": [{"number": 9999}],
                     "endpointPickerRef": {"name": "other-epp", "port": {"number": 9002}}},
        }
        r = kube.try_apply(foreign)
        assert r.returncode == 0, r.stderr
        kube.apply_model("mine", spec(routing=ROUTING))
        c = kube.wait_condition("mine", "RoutingReady", "False", reason="NameConflict")
        assert "InferencePool mine" in c["message"]
        kube.wait_condition("mine", "Ready", timeout=90)
        assert kube.get("inferencepool", "mine")["spec"]["targetPorts"] == [{"number": 9999}]
