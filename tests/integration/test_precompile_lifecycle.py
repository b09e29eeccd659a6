"""The precompile Job's life on the real control plane (kwok plays the pods; the real node
test of an image that cannot be pulled is tests/realpods/test_precompile_failure.py).

Each case was reproduced on the API server before its fix: a pod that could not start read
"precompile Job ... is running" for up to 7200 s, a superseded Job ran on to completion, and a
Deployment deleted while a new key compiled stayed gone until the compile ended.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Kube, OperatorProcess

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
HOLD = {"kwok.spyre.dev/hold": "true"}
MANAGED = "app.kubernetes.io/managed-by=spyre-model-operator"
#: Two supported shapes of the model (a compile-affecting edit between them).
SHAPE_A = {"maxModelLen": 8192, "maxNumSeqs": 4}
SHAPE_B = {"maxModelLen": 3072, "maxNumSeqs": 16}


def spec(shape: dict[str, Any] | None = None, **precompile: Any) -> dict[str, Any]:
    return {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        "compile": shape or SHAPE_A,
        "precompile": {"backoffLimit": 0, **precompile},
    }


def precompile_jobs(kube: Kube) -> list[dict[str, Any]]:
    return [j for j in kube.items("jobs", MANAGED)
            if j["metadata"]["labels"].get("app.kubernetes.io/component") == "precompile"]


def job_names(kube: Kube) -> set[str]:
    return {j["metadata"]["name"] for j in precompile_jobs(kube)}


def test_an_unschedulable_precompile_shows_in_status_and_a_fix_replaces_it(
    kube: Kube, operator: OperatorProcess
) -> None:
    t0 = time.monotonic()
    kube.apply_model("m", spec(nodeSelector={"pool": "no-such-pool"}))
    kube.wait_condition("m", "ArtifactReady", "False", "PrecompileUnschedulable", timeout=30)
    print(f"apply -> PrecompileUnschedulable in {time.monotonic() - t0:.0f}s")
    # The scheduler's first answer may be the cache claim not bound yet (a loaded run saw
    # "unbound immediate PersistentVolumeClaims"); once it binds, the status carries the
    # nodeSelector's refusal, still PrecompileUnschedulable.
    c = kube.wait(lambda: (lambda c: c if "didn't match Pod's node affinity/selector"
                           in c.get("message", "") else None)(
                               kube.condition("m", "ArtifactReady")), 60,
                  "the status to name the nodeSelector's refusal")
    assert c["reason"] == "PrecompileUnschedulable", c
    assert kube.condition("m", "Progressing")["reason"] == "PrecompileUnschedulable"
    assert kube.condition("m", "Degraded")["status"] == "False"  # waiting, not broken
    [stuck] = precompile_jobs(kube)
    # The fix is outside the artifact key: the same Job name, a new Job.
    kube.apply_model("m", spec(nodeSelector={"topology.kubernetes.io/zone": "zone-a"}))
    kube.wait(lambda: [j for j in precompile_jobs(kube)
                       if j["metadata"]["uid"] != stuck["metadata"]["uid"]], 30,
              "the stuck Job replaced")
    assert job_names(kube) == {stuck["metadata"]["name"]}
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)


def test_a_quota_that_refuses_the_precompile_pod_shows_in_status(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.kubectl("create", "quota", "no-pods", "--hard=pods=0")
    t0 = time.monotonic()
    kube.apply_model("q", spec())
    c = kube.wait_condition("q", "Degraded", "True", "PrecompilePodRejected", timeout=30)
    print(f"apply -> PrecompilePodRejected in {time.monotonic() - t0:.0f}s")
    assert "exceeded quota" in c["message"] and "no-pods" in c["message"], c
    art = kube.model("q")["status"]["artifact"]
    assert "exceeded quota" in art["message"] and art["phase"] == "Pending", art
    kube.kubectl("delete", "quota", "no-pods")
    kube.wait_condition("q", "Ready", reason="Serving", timeout=180)


def test_an_edit_and_its_revert_stop_the_jobs_no_spec_needs(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("e", spec(podAnnotations=HOLD))  # the compile runs until released
    first = kube.wait(lambda: job_names(kube), 30, "the first Job")
    kube.apply_model("e", spec(SHAPE_B, podAnnotations=HOLD))
    second = kube.wait(lambda: (names := job_names(kube)) - first and names, 30, "the edit's Job")
    kube.wait(lambda: not (job_names(kube) & first), 30, "the first Job stopped and removed")
    kube.apply_model("e", spec(podAnnotations=HOLD))  # revert
    kube.wait(lambda: job_names(kube) == first, 30, "only the reverted spec's Job left")
    assert not job_names(kube) & (second - first)


def test_a_shared_job_stays_while_another_model_needs_it(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("a", spec(podAnnotations=HOLD))
    kube.apply_model("b", spec(podAnnotations=HOLD))
    [shared] = kube.wait(lambda: precompile_jobs(kube), 30, "one shared Job")
    kube.wait(lambda: len(precompile_jobs(kube)[0]["metadata"]["ownerReferences"]) == 2, 30,
              "owned by both")
    kube.apply_model("a", spec(SHAPE_B, podAnnotations=HOLD))
    kube.wait(lambda: len(job_names(kube)) == 2, 30, "a's new Job")

    def edit_reconciled() -> bool:  # a wrong implementation stops b's Job in this reconcile
        m = kube.model("a")
        observed = (m.get("status") or {}).get("observedGeneration")
        return bool(observed == m["metadata"]["generation"])

    kube.wait(edit_reconciled, 30, "a's edit reconciled (observedGeneration)")
    uids = {j["metadata"]["uid"] for j in precompile_jobs(kube)}
    assert shared["metadata"]["uid"] in uids, "b still needs the shared Job"


def test_a_deployment_deleted_while_a_new_key_compiles_serves_the_old_key_again(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("d", spec())
    kube.wait_condition("d", "Ready", reason="Serving", timeout=90)
    old_key = kube.model("d")["status"]["servingArtifactKey"]
    kube.apply_model("d", spec(SHAPE_B, podAnnotations=HOLD))
    kube.wait_condition("d", "Ready", "True", reason="ServingPreviousArtifact", timeout=30)
    before = kube.get("deployment", "d")
    kube.kubectl("delete", "deployment", "d", "--wait=true")
    t0 = time.monotonic()
    dep = kube.wait(lambda: (d := kube.get("deployment", "d")) and d["metadata"]["uid"]
                    != before["metadata"]["uid"] and d, 30, "the Deployment recreated")
    print(f"deleted -> recreated in {time.monotonic() - t0:.0f}s")
    assert dep["metadata"]["annotations"][f"{GROUP}/artifact-key"] == old_key
    kube.wait_condition("d", "Ready", "True", reason="ServingPreviousArtifact", timeout=60)
    assert kube.model("d")["status"]["servingArtifactKey"] == old_key


def test_models_sharing_a_failing_compile_share_one_retry_budget(
    kube: Kube, operator: OperatorProcess, control_plane: Any, kubeconfig: Any
) -> None:
    """A model joining a key whose compile failed several times started its own count at 1
    and retried after the first backoff: N models retried a shared compile N times as often.
    The attempt is the Job's: the newcomer waits for the same retry as the others."""
    operator.stop()
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_COMPILE_RETRY_BASE_SECONDS": "4",
                                "SPYRE_COMPILE_RETRY_MAX_SECONDS": "120"})
    fast.start()
    try:
        failing = spec(podAnnotations={"kwok.spyre.dev/fail": "true"})
        kube.apply_model("a", failing)
        kube.wait(lambda: int(kube.model("a")["status"]["artifact"].get("attempts") or 0) >= 3
                  and kube.model("a")["status"]["artifact"]["phase"] == "Failed", 90,
                  "a's third attempt failed")
        kube.apply_model("b", failing)

        def failed(name: str) -> dict[str, Any] | None:
            art = (kube.model(name).get("status") or {}).get("artifact") or {}
            return art if art.get("phase") == "Failed" else None

        art = kube.wait(lambda: failed("b"), 30, "b's first Failed status")
        assert int(art["attempts"]) >= 3, f"b keeps its own retry count: {art}"
        a = kube.wait(lambda: failed("a"), 30, "a Failed")
        if a["attempts"] == art["attempts"]:
            assert a["nextRetryAt"] == art["nextRetryAt"], (a, art)
        [job] = precompile_jobs(kube)
        assert job["metadata"]["annotations"][f"{GROUP}/attempt"] == str(art["attempts"])
    finally:
        fast.stop()
        operator.start()
