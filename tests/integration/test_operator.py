"""The operator against the real control plane: the reconcile end to end (issue 3).

kwok plays the precompile pod (Job pods complete; annotations make them hold, fail, or report
a termination message) and the serving pods (Ready).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from spyre_operator.desired import names

from .conftest import Kube, OperatorProcess, reconcile_now, settle_writes

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
HOLD = {"kwok.spyre.dev/hold": "true"}


#: kwok plays the pods and the tests vary maxModelLen for distinct artifact keys, with shapes the
#: plugin's model_configs.yaml does not list: they opt out of the known-configuration check (the
#: operator refuses unlisted shapes of listed models otherwise; test_supported_shapes.py).
UNCHECKED = {"requireKnownConfiguration": False}


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        "compile": {"maxModelLen": 2048, **UNCHECKED},
        "precompile": {"backoffLimit": 0},
    }
    for k, v in overrides.items():
        base[k] = {**UNCHECKED, **v} if k == "compile" else v
    return base


def jobs(kube: Kube) -> list[dict[str, Any]]:
    return kube.items("jobs", "app.kubernetes.io/managed-by=spyre-model-operator")


def deployment(kube: Kube, name: str) -> dict[str, Any] | None:
    return kube.get("deployment", name)  # type: ignore[no-any-return]


def artifact_of(dep: dict[str, Any]) -> str:
    return str(dep["metadata"]["labels"][f"{GROUP}/artifact"])


def release(kube: Kube, job_name: str) -> None:
    """Let a held precompile pod complete (kwok re-evaluates its stages on the update)."""
    kube.kubectl("annotate", "pods", "-l", f"job-name={job_name}", "kwok.spyre.dev/hold-")


def test_happy_path_to_ready(kube: Kube, operator: OperatorProcess) -> None:
    summary = {"path": "ignored", "compileSeconds": 42.5, "sizeBytes": 123456789}
    kube.apply_model(
        "granite",
        spec(precompile={"podAnnotations": {
            "kwok.spyre.dev/termination-message": json.dumps(summary)}}),
    )
    # kubectl wait works on the Ready condition, and on kstatus' Reconciling: Ready turns True
    # once the Deployment is available, Reconciling False once its rollout is recorded as done
    # (the next reconcile: a read right after Ready saw Reconciling still True in a loaded run)
    kube.kubectl("wait", "--for=condition=Ready", "--timeout=90s", "spyremodel/granite")
    kube.kubectl("wait", "--for=condition=Reconciling=False", "--timeout=60s",
                 "spyremodel/granite")
    # The operator's record of the completed rollout (rollout.py) starts no new generation of
    # the Deployment. As an annotation it did (the API server bumps a Deployment's generation on
    # an annotation change: the controller copies them to its ReplicaSets), and until the
    # controller observed it, the rollout read as not done: Reconciling flapped back to True
    # after `kubectl wait` had seen it False (the full run of 889b7f2).
    kube.wait(lambda: (deployment(kube, "granite") or {}).get("metadata", {}).get(
        "labels", {}).get(names.ROLLED_OUT_LABEL), 30, "the rolled-out record")
    assert deployment(kube, "granite")["metadata"]["generation"] == 1
    m = kube.model("granite")
    st = m["status"]
    assert st["observedGeneration"] == m["metadata"]["generation"]
    assert st["artifact"]["phase"] == "Ready"
    assert st["artifact"]["compileSeconds"] == 42.5
    assert st["artifact"]["sizeBytes"] == 123456789
    key = st["artifact"]["key"]
    assert st["artifact"]["path"] == f"/cache/artifacts/{key}"
    assert st["servingArtifactKey"] == key
    assert st["endpoint"] == f"http://granite.{kube.ns}.svc:8000/v1"
    types = {c["type"]: c for c in st["conditions"]}
    assert set(types) == {"Ready", "CacheVolumeReady", "ArtifactReady", "Progressing", "Degraded",
                          "Reconciling", "Stalled"}
    assert types["Reconciling"]["status"] == "False" and types["Stalled"]["status"] == "False"
    assert types["CacheVolumeReady"]["status"] == "True"
    assert types["Degraded"]["status"] == "False"
    for c in types.values():
        assert c["observedGeneration"] == m["metadata"]["generation"] and c["lastTransitionTime"]

    dep = deployment(kube, "granite")
    assert dep is not None
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "spyre-model-operator"
    assert dep["metadata"]["labels"][f"{GROUP}/model"] == "granite"
    assert artifact_of(dep) == key[:12]
    pod = dep["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "spyre-scheduler"
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] == "1"
    assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"
    assert env["TORCH_SENDNN_CACHE_DIR"] == f"/cache/artifacts/{key}"
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == "sendnn"
    assert c["resources"]["limits"]["ibm.com/spyre_vf"] == "1"
    mounts = {v["mountPath"]: v for v in c["volumeMounts"]}
    assert mounts["/cache"]["readOnly"] is True
    claim = next(v for v in pod["volumes"] if v["name"] == "compile-cache")
    assert claim["persistentVolumeClaim"]["claimName"] == "spyre-compile-cache"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/startup"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert pod["terminationGracePeriodSeconds"] == 5 + 30 + 40  # preStop sleep, drain, margin
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] == 5
    strategy = dep["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxSurge"] == 0 and strategy["maxUnavailable"] == 1
    svc = kube.get("service", "granite")
    assert svc["spec"]["ports"][0]["name"] == "http" and svc["spec"]["ports"][0]["port"] == 8000
    # the serving pod really runs on a fake Spyre node with the cards
    pods = kube.items("pods", f"{GROUP}/model=granite")
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    assert all(p["spec"]["nodeName"].startswith("spyre-node") for p in pods)
    pvc = kube.get("pvc", "spyre-compile-cache")
    assert pvc["status"]["phase"] == "Bound"
    # the transitions were recorded as Events
    events = kube.items("events", "")
    reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "granite"}
    assert {"Compiling", "ArtifactAvailable", "Serving"} <= reasons, reasons
    # printer columns
    out = kube.kubectl("get", "spyremodels")
    assert "READY" in out and "REASON" in out and "Serving" in out


def test_same_key_shares_one_job(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_model("a", spec(precompile={"podAnnotations": HOLD, "backoffLimit": 0}))
    kube.apply_model("b", spec(replicas=2, serving={"port": 8080}))  # same key
    job = kube.wait(lambda: (j := jobs(kube)) and len(j[0]["metadata"].get(
        "ownerReferences", [])) == 2 and j[0], 30, "a Job owned by both models")
    assert len(jobs(kube)) == 1
    assert {r["name"] for r in job["metadata"]["ownerReferences"]} == {"a", "b"}
    for n in ("a", "b"):  # the held pod: compiling (not the scheduler's try before binding)
        kube.wait_condition(n, "ArtifactReady", "False", "Compiling", timeout=30)
    release(kube, job["metadata"]["name"])
    for n in ("a", "b"):
        kube.wait_condition(n, "Ready", timeout=60)
    assert len(jobs(kube)) == 1


def test_replicas_edit_scales_without_new_job(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_model("m", spec())
    kube.wait_condition("m", "Ready")
    key = kube.model("m")["status"]["artifact"]["key"]
    kube.apply_model("m", spec(replicas=3))
    kube.wait(lambda: (d := deployment(kube, "m")) and d["spec"]["replicas"] == 3, 30,
              "Deployment scaled to 3")
    kube.wait(lambda: kube.model("m")["status"].get("readyReplicas") == 3, 60, "3 ready")
    kube.wait_condition("m", "Ready")
    assert len(jobs(kube)) == 1
    assert kube.model("m")["status"]["artifact"]["key"] == key
    assert kube.get("pdb", "m") is not None  # replicas > 1
    # the scale subresource works too
    kube.kubectl("scale", "spyremodel/m", "--replicas=1")
    kube.wait(lambda: deployment(kube, "m")["spec"]["replicas"] == 1, 30, "scaled to 1")
    kube.wait(lambda: kube.get("pdb", "m") is None, 30, "PDB removed at 1 replica")


def test_compile_edit_keeps_old_pods_until_new_artifact(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("m", spec())
    kube.wait_condition("m", "Ready")
    old_key = kube.model("m")["status"]["artifact"]["key"]
    # new shape; hold the new Job's pod so the compile "takes a while"
    kube.apply_model("m", spec(compile={"maxModelLen": 4096},
                               precompile={"podAnnotations": HOLD, "backoffLimit": 0}))
    new = kube.wait(
        lambda: [j for j in jobs(kube) if j["metadata"]["labels"][f"{GROUP}/artifact"]
                 != old_key[:12]], 30, "the new precompile Job")[0]
    kube.wait_condition("m", "Progressing", "True", reason="Compiling")
    ready = kube.wait_condition("m", "Ready", "True", reason="ServingPreviousArtifact")
    assert old_key[:12] in ready["message"]
    reconcile_now(kube, operator, "m")  # a wrong implementation would roll early here
    dep = deployment(kube, "m")
    assert artifact_of(dep) == old_key[:12], "Deployment switched before the artifact was ready"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "2048"
    serving = [p for p in kube.items("pods", f"{GROUP}/model=m")
               if p["status"].get("phase") == "Running"]
    assert serving, "old pods must keep serving while the new artifact compiles"
    release(kube, new["metadata"]["name"])
    kube.wait(lambda: artifact_of(deployment(kube, "m")) != old_key[:12], 60, "roll to new key")
    kube.wait_condition("m", "Ready", "True", reason="Serving")
    st = kube.model("m")["status"]
    assert st["servingArtifactKey"] == st["artifact"]["key"] != old_key
    args = deployment(kube, "m")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "4096"


def test_failing_job_is_degraded_with_message(kube: Kube, operator: OperatorProcess) -> None:
    failure = {"reason": "CompileFailed", "message": "graph too large for 1 card"}
    failing = {"backoffLimit": 0, "podAnnotations": {
        "kwok.spyre.dev/fail": "true", "kwok.spyre.dev/termination-message": json.dumps(failure)}}
    kube.apply_model("bad", spec(precompile=failing))
    deg = kube.wait_condition("bad", "Degraded", "True", reason="PrecompileFailed")
    assert "graph too large for 1 card" in deg["message"]
    assert kube.condition("bad", "Ready")["status"] == "False"
    assert kube.model("bad")["status"]["artifact"]["phase"] == "Failed"
    assert deployment(kube, "bad") is None
    events = [e for e in kube.items("events") if e["involvedObject"]["name"] == "bad"]
    assert any(e["type"] == "Warning" and e["reason"] == "PrecompileFailed" for e in events)
    st = kube.model("bad")["status"]["artifact"]
    assert st["attempts"] == 1 and st["nextRetryAt"], st
    assert "next retry at" in kube.condition("bad", "ArtifactReady")["message"]
    # an edit that changes neither the artifact nor the precompile pod is no reason to retry
    kube.apply_model("bad", spec(precompile=failing, replicas=2))
    gen = kube.model("bad")["metadata"]["generation"]
    kube.wait(lambda: kube.model("bad")["status"].get("observedGeneration") == gen, 30,
              "the edit reconciled (observedGeneration)")
    art = kube.model("bad")["status"]["artifact"]
    assert art["phase"] == "Failed" and art["attempts"] == 1, art
    # the annotation retries now (the cause is still there: it fails again, attempt 2)
    kube.kubectl("annotate", "--overwrite", "spyremodel/bad", f"{GROUP}/retry-compile=1")
    kube.wait(lambda: (a := kube.model("bad")["status"]["artifact"])["attempts"] == 2
              and a["phase"] == "Failed", 60, "the retry failed again (attempt 2)")
    # fixing the cause (the pod's annotations) changes the precompile pod: replaced at once
    kube.apply_model("bad", spec(precompile={"backoffLimit": 1}, replicas=2))
    kube.wait_condition("bad", "Ready", timeout=60)
    assert kube.condition("bad", "Degraded")["status"] == "False"


def test_a_replica_without_a_card_keeps_the_model_ready_and_says_why(
    kube: Kube, operator: OperatorProcess
) -> None:
    # 8 cards per pod, one 8-card node: the second replica can never be scheduled.
    kube.apply_model("short", spec(
        compile={"maxModelLen": 2048, "tensorParallelSize": 8},
        accelerator={"nodeSelector": {"kubernetes.io/hostname": "spyre-node-1"}},
    ))  # fmt: skip
    kube.wait_condition("short", "Ready", timeout=120)
    kube.kubectl("scale", "spyremodel/short", "--replicas=2")
    kube.wait(lambda: (kube.condition("short", "Progressing") or {}).get("reason")
              == "InsufficientCapacity", 90, "Progressing=InsufficientCapacity")  # fmt: skip
    progressing = kube.condition("short", "Progressing")
    assert progressing["status"] == "True"
    assert "1/2 replicas available" in progressing["message"]
    assert "Insufficient ibm.com/spyre_vf" in progressing["message"], progressing["message"]
    assert kube.condition("short", "Ready")["status"] == "True"
    assert kube.condition("short", "Degraded")["status"] == "False"
    kube.kubectl("scale", "spyremodel/short", "--replicas=1")
    kube.wait(lambda: kube.condition("short", "Progressing")["status"] == "False", 90,
              "back to Reconciled at 1 replica")


@pytest.mark.parametrize(
    "bad,expect",
    [
        ({"compile": {"maxNumBatchedTokens": 100}}, "multiple of 64"),
        ({"compile": {"warmupShapes": [{"promptLen": 64, "batchSize": 1}]}},
         "warmupShapes apply only to pooling models"),
        ({"compile": {"tensorParallelSize": 3}}, "tensorParallelSize must be 1, 2, 4 or 8"),
        ({"task": "embed", "compile": {"warmupShapes": []}}, "must not be empty"),
        ({"model": {"uri": "s3://bucket/model"}}, "hf://org/name"),
        ({"serving": {"extraArgs": ["--max-model-len=99"]}}, "must not set flags"),
        ({"cache": {"volume": {"retention": {"keepLast": -1}}}}, "keepLast"),
        ({"cache": {"volume": {"retention": {"unusedForSeconds": -5}}}}, "unusedForSeconds"),
        ({"cache": {"claimName": "mine", "volume": {"name": "other"}}}, "not both"),
        ({"serving": {"env": [{"name": "TORCH_SENDNN_CACHE_DIR", "value": "/x"}]}},
         "must not set variables the operator manages"),
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2, "targetQueueLength": 1}},
         "minReplicas must not exceed"),
        ({"autoscaling": {"maxReplicas": 2}}, "at least one target"),
        ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "at least one target"),
        ({"autoscaling": {"maxReplicas": 2, "targetKvCacheUsage": 0}},
         "targetKvCacheUsage"),
    ],
)
def test_api_server_rejects_bad_specs(kube: Kube, crd: Any, bad: dict[str, Any],
                                      expect: str) -> None:
    doc = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
           "metadata": {"name": "rejected"}, "spec": {**spec(), **bad}}
    r = kube.try_apply(doc)
    assert r.returncode != 0, "the API server accepted an invalid SpyreModel"
    assert expect in r.stderr, r.stderr
    assert kube.get("spyremodel", "rejected") is None


def test_idle_period_makes_no_writes(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_model("idle", spec(replicas=2))
    kube.wait_condition("idle", "Ready")
    settle_writes(operator, kube.ns)  # trailing status updates (the second replica's readiness)

    def versions() -> dict[str, str]:
        out = {}
        for kind in ("deployment", "service", "pdb", "job", "pvc", "configmap"):
            for o in kube.items(kind):
                out[f"{kind}/{o['metadata']['name']}"] = o["metadata"]["resourceVersion"]
        return out

    before, kinds_before = versions(), write_counts(operator)
    assert "configmap/idle-output-check" in before, "its verified artifact is not named"
    writes_before = operator.namespace_writes(kube.ns)
    assert writes_before > 0, "the operator's writes to this namespace are not counted"
    # poke the operator: an unrelated label on the model triggers a full reconcile
    reconcile_now(kube, operator, "idle")
    assert versions() == before, "an idle reconcile changed a child"
    written = operator.namespace_writes(kube.ns) - writes_before
    kinds = {k: v - kinds_before.get(k, 0) for k, v in write_counts(operator).items()
             if v != kinds_before.get(k, 0)}  # process-wide, to say what was written
    assert written == 0, (
        f"the operator wrote {written:.0f} times to {kube.ns} during an idle period "
        f"(all namespaces: {kinds})\n{operator.log_tail(15)}")

    # A status field another field manager set alone (the operator writes no scaleToZero for
    # this model): a status apply never removes it, so comparing with it wrote the status on
    # every reconcile (issue 31, 10).
    kube.kubectl("patch", "spyremodel", "idle", "--subresource=status", "--type=merge",
                 "--field-manager=by-hand", "-p",
                 '{"status": {"scaleToZero": {"lastActiveTime": "2026-11-27T00:00:00Z"}}}')
    writes_before = operator.namespace_writes(kube.ns)
    reconcile_now(kube, operator, "idle")
    written = operator.namespace_writes(kube.ns) - writes_before
    assert written == 0, (f"the operator wrote {written:.0f} times to {kube.ns} after another "
                          f"manager set a status field\n{operator.log_tail(15)}")
    assert kube.model("idle")["status"]["scaleToZero"]["lastActiveTime"]  # left as it is


def write_counts(operator: OperatorProcess) -> dict[str, float]:
    return {k: v for k, v in operator.metrics().items() if k.startswith("spyre_operator_writes")}


def test_deletion_cleans_up(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply_model("gone", spec(replicas=2, cache={"volume": {
        "name": "tmp-cache", "retainPolicy": "Delete", "size": "1Gi"}}))
    kube.apply_model("kept", spec(cache={"volume": {"name": "kept-cache", "size": "1Gi"}}))
    kube.wait_condition("gone", "Ready")
    kube.wait_condition("kept", "Ready")
    kube.kubectl("delete", "spyremodel", "gone", "kept", "--wait=true", "--timeout=60s")

    def cleaned() -> bool:
        left = [o["metadata"]["name"] for kind in ("deployment", "service", "pdb", "job")
                for o in kube.items(kind)]
        return not left and kube.get("pvc", "tmp-cache") is None
    kube.wait(cleaned, 90, "children garbage-collected")
    assert kube.get("pvc", "kept-cache") is not None, "Retain policy must keep the PVC"


def test_operator_restart_mid_compile_makes_no_duplicate_job(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("r", spec(precompile={"podAnnotations": HOLD, "backoffLimit": 0}))
    job = kube.wait(lambda: jobs(kube), 30, "the precompile Job")[0]
    kube.wait_condition("r", "ArtifactReady", "False", reason="Compiling")
    operator.kill()
    operator.start()
    # the new process's counters start at 0: once it reconciled r, a duplicate would exist
    kube.wait(lambda: operator.namespace_reconciles(kube.ns) >= 1, 30,
              "the restarted operator reconciled r")
    assert [j["metadata"]["uid"] for j in jobs(kube)] == [job["metadata"]["uid"]]
    release(kube, job["metadata"]["name"])
    kube.wait_condition("r", "Ready", timeout=60)
    assert [j["metadata"]["uid"] for j in jobs(kube)] == [job["metadata"]["uid"]]


def test_a_scheduler_that_does_not_run_is_named_in_status(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Issue 28: serving pods whose scheduler is not installed (or not running) are Pending
    without a PodScheduled condition; the model says so within a minute of the pod instead of
    RollingOut for good (the package's operator: within 20 s, SPYRE_SCHEDULER_SILENCE_SECONDS).
    The compile, off the cards, needs no Spyre scheduler."""
    kube.apply_model("nosched", spec(accelerator={"schedulerName": "not-installed-scheduler"}))
    kube.wait_condition("nosched", "ArtifactReady", timeout=90)
    c = kube.wait_condition("nosched", "Progressing", reason="SchedulerNotRunning", timeout=120)
    assert "'not-installed-scheduler'" in c["message"], c
    pods = kube.items("pods", f"{GROUP}/model=nosched")
    assert pods and all(not p["spec"].get("nodeName") for p in pods), pods
    # kstatus's Reconciling carries the reason too (kubectl wait, Argo CD, Flux).
    assert kube.condition("nosched", "Reconciling")["reason"] == "SchedulerNotRunning"
