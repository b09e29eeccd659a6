"""Issue 11 on the real control plane: every edit converges, every failure shows in status.

Each test is one case the issue reproduced as a user would (kwok plays the pods; what needs a
pod to really run is in the real-node tests).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane

from .conftest import Kube, OperatorProcess, holds, reconcile_now, settle_writes

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
SAMPLES = Path(__file__).resolve().parents[2] / "operator" / "samples"
HOLD = {"kwok.spyre.dev/hold": "true"}
MANAGED = "app.kubernetes.io/managed-by=spyre-model-operator"


def spec(**overrides: Any) -> dict[str, Any]:
    # requireKnownConfiguration off: kwok plays the pods, and 2048 is not a listed shape
    base: dict[str, Any] = {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        "compile": {"maxModelLen": 2048, "requireKnownConfiguration": False},
        "precompile": {"backoffLimit": 0},
    }
    base.update(overrides)
    if "compile" in overrides:
        base["compile"] = {"requireKnownConfiguration": False, **overrides["compile"]}
    return base


def jobs(kube: Kube) -> list[dict[str, Any]]:
    return kube.items("jobs", MANAGED)


def claims_of(dep: dict[str, Any]) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"]
            for v in dep["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]


def events_for(kube: Kube, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.items("events") if e["involvedObject"]["name"] == name]


def test_model_named_after_its_model_reaches_ready(kube: Kube, operator: OperatorProcess) -> None:
    """Reproduced: `granite-3.3-8b` never got a status (Service names cannot contain dots)."""
    kube.apply_model("granite-3.3-8b", spec())
    kube.kubectl("wait", "--for=condition=Ready", "--timeout=90s", "spyremodel/granite-3.3-8b")
    st = kube.model("granite-3.3-8b")["status"]
    svc_name = st["endpoint"].split("//", 1)[1].split(".", 1)[0]
    assert "." not in svc_name
    svc = kube.get("service", svc_name)
    assert svc is not None and svc["spec"]["selector"][f"{GROUP}/model"] == "granite-3.3-8b"
    assert kube.get("deployment", svc_name) is not None


def test_rollout_that_can_never_progress_is_rejected_at_admission(kube: Kube, crd: Any) -> None:
    """Reproduced: rollout 0/0 was admitted, then every Deployment write was rejected."""
    doc = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
           "metadata": {"name": "stuck"},
           "spec": spec(serving={"rollout": {"maxSurge": 0, "maxUnavailable": 0}})}
    r = kube.try_apply(doc)
    assert r.returncode != 0 and "cannot both be 0" in r.stderr, r.stderr
    for mode in ("ReadOnlyMany", "ReadWriteOncePod"):
        doc["spec"] = spec(cache={"volume": {"accessModes": [mode]}})
        r = kube.try_apply(doc)
        assert r.returncode != 0 and "Unsupported value" in r.stderr, r.stderr
    # issue 12: sendnn_compile_only cannot serve; resource names are extended resources
    for bad, expect in (
        ({"compile": {"backend": "sendnn_compile_only"}}, "sendnn_compile_only cannot serve"),
        ({"accelerator": {"resourceName": "kubernetes.io/spyre"}}, "outside the kubernetes.io"),
        ({"model": {"uri": "hf://a/b", "downloadEnv": [{"name": "HF_TOKEN", "value": "x"}]}},
         "use model.tokenSecret"),
    ):
        doc["spec"] = spec(**bad)
        r = kube.try_apply(doc)
        assert r.returncode != 0 and expect in r.stderr, r.stderr
    doc["spec"] = spec(accelerator={"resourceName": "ibm.com/spyre_pf_tier1"})
    r = kube.try_apply(doc)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.yaml")))
def test_samples_are_admitted(kube: Kube, crd: Any, sample: str) -> None:
    r = kube.cp.kubectl("apply", "-n", kube.ns, "--dry-run=server", "-f",
                        str(SAMPLES / sample), check=False)
    assert r.returncode == 0, r.stderr


def test_switching_the_cache_claim_compiles_there_before_moving(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Reproduced: the Deployment moved onto the new, empty claim and status stayed Serving."""
    kube.apply_model("m", spec())
    kube.wait_condition("m", "Ready", reason="Serving")
    kube.apply_model("m", spec(cache={"volume": {"name": "cache-b"}},
                               precompile={"backoffLimit": 0, "podAnnotations": HOLD}))
    job = kube.wait(lambda: [j for j in jobs(kube)
                             if j["metadata"]["labels"][f"{GROUP}/cache-claim"] == "cache-b"],
                    30, "a precompile Job on the new claim")[0]
    ready = kube.wait_condition("m", "Ready", "True", reason="ServingPreviousArtifact")
    assert "cache-b" in ready["message"]
    assert kube.model("m")["status"]["artifact"]["claim"] == "cache-b"
    reconcile_now(kube, operator, "m")  # a wrong implementation would move here
    assert claims_of(kube.get("deployment", "m")) == ["spyre-compile-cache"]
    kube.kubectl("annotate", "pods", "-l", f"job-name={job['metadata']['name']}",
                 "kwok.spyre.dev/hold-")
    kube.wait(lambda: claims_of(kube.get("deployment", "m")) == ["cache-b"], 60,
              "the Deployment on the new claim once its artifact is there")
    kube.wait_condition("m", "Ready", "True", reason="Serving")


def test_fields_the_operator_stops_setting_are_removed(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Reproduced by reading apply.py: Delete -> Retain kept the PVC's ownerReferences (and so
    garbage-collected every artifact later); a removed env entry stayed on the Deployment."""
    kube.apply_model("m", spec(cache={"volume": {"name": "gc-cache", "retainPolicy": "Delete"}},
                               serving={"env": [{"name": "LOG_LEVEL", "value": "debug"}]}))
    kube.wait_condition("m", "Ready")
    assert kube.get("pvc", "gc-cache")["metadata"].get("ownerReferences")
    env = kube.get("deployment", "m")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert any(e["name"] == "LOG_LEVEL" for e in env)
    kube.apply_model("m", spec(cache={"volume": {"name": "gc-cache", "retainPolicy": "Retain"}}))
    kube.wait(lambda: not kube.get("pvc", "gc-cache")["metadata"].get("ownerReferences"), 30,
              "the PVC's ownerReferences removed")

    def env_names() -> list[str]:
        c = kube.get("deployment", "m")["spec"]["template"]["spec"]["containers"][0]
        return [e["name"] for e in c["env"]]

    kube.wait(lambda: "LOG_LEVEL" not in env_names(), 30, "the removed env entry gone")


def test_rejected_write_reaches_status_and_recovers(
    kube: Kube, operator: OperatorProcess
) -> None:
    """RECONCILE_ERROR was defined and unused: a rejected write only showed in the log."""
    kube.kubectl("create", "quota", "no-services", "--hard=services=0")
    kube.apply_model("m", spec())
    deg = kube.wait_condition("m", "Degraded", "True", reason="ReconcileError", timeout=60)
    assert "exceeded quota" in deg["message"] and "Service" in deg["message"], deg
    assert kube.condition("m", "Ready")["status"] == "False"
    assert any(e["reason"] == "ReconcileError" and e["type"] == "Warning"
               for e in events_for(kube, "m"))
    kube.kubectl("delete", "quota", "no-services")
    kube.wait_condition("m", "Ready", timeout=90)
    assert kube.condition("m", "Degraded")["status"] == "False"


def test_same_named_service_that_is_not_ours_is_not_taken_over(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.kubectl("create", "service", "clusterip", "taken", "--tcp=80:8080")
    before = kube.get("service", "taken")
    kube.apply_model("taken", spec())
    c = kube.wait_condition("taken", "Degraded", "True", reason="NameConflict", timeout=60)
    assert "Service taken" in c["message"]
    reconcile_now(kube, operator, "taken")  # a wrong implementation would take it over here
    after = kube.get("service", "taken")
    assert after["spec"]["selector"] == before["spec"]["selector"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # Its pods serve, but its endpoint is someone else's Service: not Ready (it was Serving).
    kube.wait(lambda: ((kube.get("deployment", "taken") or {}).get("status") or {}).get(
        "availableReplicas"), 90, "its pods available")
    reconcile_now(kube, operator, "taken")
    ready = kube.wait_condition("taken", "Ready", "False", reason="NameConflict", timeout=60)
    assert ready["status"] == "False", ready
    # once it is gone, the model proceeds without any edit: the operator writes its Service.
    kube.kubectl("delete", "service", "taken")
    kube.wait(lambda: ((kube.get("service", "taken") or {}).get("metadata", {}).get("labels")
                       or {}).get("app.kubernetes.io/managed-by") == "spyre-model-operator",
              90, "the operator's Service taken")
    kube.wait_condition("taken", "Degraded", "False", timeout=90)
    kube.wait_condition("taken", "Ready", timeout=90)


def test_a_same_named_configmap_that_is_not_ours_is_not_taken_over(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Issue 45, 2: the operator is sent only the ConfigMaps with its label, so a model's
    ``<model>-output-check`` that someone else made (unlabelled) is looked up by name before
    the first write: reported (NameConflict), never written over; once it is gone (no event
    reaches the operator: it looks again every minute meanwhile; here a reconcile is forced),
    the operator writes its own."""
    taken = "cmx-output-check"
    kube.kubectl("create", "configmap", taken, "--from-literal=mine=yes")
    before = kube.get("configmap", taken)
    kube.apply_model("cmx", spec())
    c = kube.wait_condition("cmx", "Degraded", "True", reason="NameConflict", timeout=90)
    assert f"ConfigMap {taken}" in c["message"], c
    reconcile_now(kube, operator, "cmx")  # a wrong implementation would take it over here
    after = kube.get("configmap", taken)
    assert after["data"] == {"mine": "yes"}, after
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert kube.condition("cmx", "Ready")["status"] == "True"  # it serves meanwhile
    kube.kubectl("delete", "configmap", taken)
    reconcile_now(kube, operator, "cmx")
    kube.wait(lambda: ((kube.get("configmap", taken) or {}).get("metadata", {}).get("labels")
                       or {}).get("app.kubernetes.io/managed-by") == "spyre-model-operator",
              90, "the operator's ConfigMap written")  # fmt: skip
    kube.wait_condition("cmx", "Degraded", "False", timeout=90)


def test_model_claim_appearing_later_is_noticed(kube: Kube, operator: OperatorProcess) -> None:
    """pvc:// claims were not watched: ClaimNotFound stayed until an unrelated event."""
    kube.apply_model("w", spec(model={"uri": "pvc://weights/granite"}))
    kube.wait_condition("w", "Degraded", "True", reason="ClaimNotFound", timeout=60)
    # (kwok cannot isolate the claim's own event: the precompile pod mounts the claim and its
    # start wakes the operator too; tests/unit/test_controller_routing.py checks the routing)
    rv = kube.model("w")["metadata"]["resourceVersion"]
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadWriteMany"],
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    kube.wait(lambda: kube.condition("w", "Degraded")["reason"] != "ClaimNotFound", 30,
              "the model claim noticed")
    assert kube.model("w")["metadata"]["generation"] == 1 and rv  # no edit was needed


def test_scale_does_not_retry_a_failed_compile(kube: Kube, operator: OperatorProcess) -> None:
    """A /scale bumps the generation; it used to delete and retry the failed Job."""
    kube.apply_model("f", spec(precompile={"backoffLimit": 0, "podAnnotations": {
        "kwok.spyre.dev/fail": "true"}}))
    kube.wait_condition("f", "Degraded", "True", reason="PrecompileFailed", timeout=60)
    uids = sorted(j["metadata"]["uid"] for j in jobs(kube))
    kube.kubectl("scale", "spyremodel/f", "--replicas=2")
    kube.wait(lambda: kube.model("f")["status"]["observedGeneration"] == 2, 30, "observed")
    reconcile_now(kube, operator, "f")
    assert sorted(j["metadata"]["uid"] for j in jobs(kube)) == uids


def test_failed_compile_is_retried_with_a_bounded_backoff(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    """Retries independent of edits: attempts and the next retry time are in status."""
    operator.stop()  # this test's operator retries after 3 s, 6 s, 6 s ...
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_COMPILE_RETRY_BASE_SECONDS": "3",
                                "SPYRE_COMPILE_RETRY_MAX_SECONDS": "6"})
    fast.start()
    try:
        kube.apply_model("f", spec(precompile={"backoffLimit": 0, "podAnnotations": {
            "kwok.spyre.dev/fail": "true"}}))
        kube.wait_condition("f", "Degraded", "True", reason="PrecompileFailed", timeout=60)
        seen: set[str] = set()

        def attempts() -> int:
            art = kube.model("f")["status"]["artifact"]
            if art.get("nextRetryAt"):
                seen.add(art["nextRetryAt"])
            assert len(jobs(kube)) <= 1, "one Job at a time"
            return int(art.get("attempts") or 0)

        kube.wait(lambda: attempts() >= 3, 90, "two automatic retries")
        assert len(seen) >= 2, seen
        # each attempt fails again and says so
        kube.wait_condition("f", "Degraded", "True", reason="PrecompileFailed", timeout=30)
    finally:
        fast.stop()
        operator.start()


def test_two_operators_never_both_write(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    """Leader election is on by default: a second operator waits; a paused leader that wakes
    up after losing its lease does not write; the standby takes over within the lease."""
    standby = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs")
    standby.start()
    assert operator.proc is not None
    try:
        kube.apply_model("a", spec())
        kube.wait_condition("a", "Ready")
        assert standby.writes() == 0, "the standby wrote while the leader held the lease"
        settle_writes(operator, kube.ns)  # a's trailing status writes
        paused_writes = operator.namespace_writes(kube.ns)
        # pause the leader: the standby takes over once the lease (15 s) runs out
        operator.proc.send_signal(signal.SIGSTOP)
        try:
            kube.apply_model("b", spec(serving={"port": 8081}))
            kube.wait_condition("b", "Ready", timeout=60)
        finally:
            operator.proc.send_signal(signal.SIGCONT)
        kube.apply_model("c", spec(serving={"port": 8082}))
        kube.wait_condition("c", "Ready", timeout=60)
        # counted from before the pause: a write right after waking up counts too
        holds(lambda: operator.namespace_writes(kube.ns) == paused_writes, 3,
              "the old leader not writing after losing its lease")
    finally:
        standby.stop()
    # the first operator leads again (within the lease) and serves new models
    kube.apply_model("d", spec(serving={"port": 8083}))
    kube.wait_condition("d", "Ready", timeout=60)
