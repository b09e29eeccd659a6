"""Fault injection on the real control plane (issue 6).

- the operator is SIGKILLed at random moments while 20 SpyreModels reconcile;
- kube-apiserver and etcd restart under a running operator;
- concurrent conflicting edits of one SpyreModel;
- a SpyreModel whose precompile Job always fails.

Each test is small (a minute or two on 2 shared cores) and asserts outcomes and counts, never
timings.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.plan import plan_model

from tests.cluster.controlplane import ControlPlane, wait_until

from .conftest import Kube, OperatorProcess, holds, reconcile_now, settle_writes

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"
MANAGED = "app.kubernetes.io/managed-by=spyre-model-operator"


def spec(max_model_len: int = 2048, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        # kwok plays the pods; these lengths are not listed shapes: the check is off
        "compile": {"maxModelLen": max_model_len, "requireKnownConfiguration": False},
        "precompile": {"backoffLimit": 0},
    }
    base.update(overrides)
    return base


def apply_many(kube: Kube, docs: dict[str, dict[str, Any]]) -> None:
    """Create several SpyreModels with one kubectl call."""
    import yaml

    text = "\n---\n".join(
        yaml.safe_dump({"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
                        "metadata": {"name": n}, "spec": s})
        for n, s in docs.items()
    )  # fmt: skip
    kube.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=text)


def all_ready(kube: Kube, names: list[str]) -> bool:
    models = {m["metadata"]["name"]: m for m in kube.items("spyremodels")}
    for n in names:
        conds = (models.get(n, {}).get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            return False
    return True


def counters(op: OperatorProcess) -> dict[str, float]:
    m = op.metrics()
    return {
        "reconciles": m.get("spyre_operator_reconciles_total", 0),
        "writes": sum(v for k, v in m.items() if k.startswith("spyre_operator_writes_total")),
        # leader election's Lease renewals (every 2 s) are counted on their own
        "requests": sum(
            v for k, v in m.items()
            if k.startswith("spyre_operator_api_requests_total") and 'resource="leases"' not in k
        ),
        "lease_requests": sum(
            v for k, v in m.items()
            if k.startswith("spyre_operator_api_requests_total") and 'resource="leases"' in k
        ),
    }


def test_sigkill_at_random_moments_converges_without_duplicates(
    kube: Kube, operator: OperatorProcess
) -> None:
    """20 models on 10 keys (pairs share a Job); kill -9 the operator 4 times meanwhile.

    One model of each pair has zero replicas: the cluster has 16 fake Spyre cards.
    """
    seed = int(os.environ.get("SPYRE_FAULT_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    names = [f"k{i:02d}" for i in range(20)]
    slow = {"podAnnotations": {"kwok.spyre.dev/complete-after": "2s"}, "backoffLimit": 0}
    docs = {
        n: spec(2048 + 64 * (i // 2), precompile=slow, replicas=1 - i % 2)
        for i, n in enumerate(names)
    }
    apply_many(kube, docs)
    for _ in range(4):
        time.sleep(rnd.uniform(0.2, 3.0))
        operator.kill()
        operator.start()
    kube.wait(lambda: all_ready(kube, names), 150, f"all 20 Ready (seed {seed})")

    models = {m["metadata"]["name"]: m for m in kube.items("spyremodels")}
    uids = {m["metadata"]["uid"] for m in models.values()}
    by_key: dict[str, set[str]] = defaultdict(set)
    for n, m in models.items():
        by_key[m["status"]["artifact"]["key"]].add(n)
        assert m["status"]["servingArtifactKey"] == m["status"]["artifact"]["key"]
    assert len(by_key) == 10, f"seed {seed}: {dict(by_key)}"

    jobs = kube.items("jobs", MANAGED)
    job_keys = [j["metadata"]["annotations"][f"{GROUP}/artifact-key"] for j in jobs]
    assert sorted(job_keys) == sorted(by_key), f"seed {seed}: one Job per key, got {job_keys}"
    for j, key in zip(jobs, job_keys, strict=True):
        owners = {r["name"] for r in j["metadata"].get("ownerReferences") or []}
        assert owners == by_key[key], f"seed {seed}: Job {j['metadata']['name']} owners {owners}"

    # no orphans: every managed object is owned by a live SpyreModel, and nothing is doubled
    for kind in ("deployments", "services", "jobs"):
        items = kube.items(kind, MANAGED)
        for o in items:
            refs = o["metadata"].get("ownerReferences") or []
            assert refs and all(r["uid"] in uids for r in refs), (kind, o["metadata"]["name"])
        if kind != "jobs":
            assert sorted(o["metadata"]["name"] for o in items) == names, kind
    assert len(kube.items("pvc")) == 1, "one shared cache claim"
    assert len(kube.items("pdb")) == 0


def test_api_server_and_etcd_restart_recovered_without_operator_restart(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane
) -> None:
    hold = {"podAnnotations": {"kwok.spyre.dev/hold": "true"}, "backoffLimit": 0}
    kube.apply_model("before", spec(precompile=hold))
    job = kube.wait(lambda: kube.items("jobs", MANAGED), 60, "the precompile Job")[0]
    kube.wait_condition("before", "ArtifactReady", "False", reason="Compiling")
    assert operator.proc is not None
    pid, starts = operator.proc.pid, operator.starts

    control_plane.restart(("kube-apiserver", "etcd"))
    try:
        # the operator's watches reconnect: a change made after the restart is seen
        kube.kubectl("annotate", "pods", "-l", f"job-name={job['metadata']['name']}",
                     "kwok.spyre.dev/hold-")
        kube.wait_condition("before", "Ready", timeout=120)
        kube.apply_model("after", spec(4096))
        kube.wait_condition("after", "Ready", timeout=120)
    finally:
        # leave the shared cluster healthy for the tests after this one
        control_plane.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=60s",
                              check=False)
    assert operator.proc.poll() is None, "the operator exited"
    assert (operator.proc.pid, operator.starts) == (pid, starts), "the operator was restarted"
    assert len(kube.items("jobs", MANAGED)) == 2


def test_concurrent_conflicting_edits_converge_to_the_last_spec(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("edited", spec())
    kube.wait_condition("edited", "Ready")
    rnd = random.Random(6)
    edits = [spec(rnd.choice([2048, 3072, 4096]), replicas=rnd.randint(1, 3)) for _ in range(12)]
    errors: list[BaseException] = []

    def reported(*kubectl_args: str, input: str | None = None) -> None:
        try:
            kube.kubectl(*kubectl_args, input=input)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def edit(s: dict[str, Any], manager: str) -> None:
        reported("apply", "--server-side", f"--field-manager={manager}", "--force-conflicts",
                 "-f", "-", input=json.dumps({
                     "apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
                     "metadata": {"name": "edited"}, "spec": s}))

    threads = [threading.Thread(target=edit, args=(s, "test")) for s in edits]
    # a second writer patching replicas directly: conflicting field ownership
    threads += [threading.Thread(target=reported, args=(
        "patch", "spyremodel", "edited", "--type=merge", "-p",
        json.dumps({"spec": {"replicas": r}}))) for r in (2, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not [t for t in threads if t.is_alive()], "an edit did not return within 60 s"
    assert not errors, errors

    def converged() -> dict[str, Any] | None:
        m = kube.model("edited")
        st = m.get("status") or {}
        # the operator's key: of the spec with the cluster defaults filled in (engine image)
        want = plan_model("edited", kube.ns, "", SpyreModelSpec.model_validate(m["spec"])).key
        dep = kube.get("deployment", "edited")
        ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
        if (
            st.get("observedGeneration") == m["metadata"]["generation"]
            and st.get("servingArtifactKey") == want
            and ready.get("status") == "True" and ready.get("reason") == "Serving"
            and dep is not None and dep["spec"]["replicas"] == m["spec"]["replicas"]
            and dep["metadata"]["annotations"].get(f"{GROUP}/artifact-key", want) == want
        ):
            return m
        return None

    final = kube.wait(converged, 120, "the model to converge to its last spec")
    reconcile_now(kube, operator, "edited")  # nothing flips back afterwards
    assert converged() is not None
    args = kube.get("deployment", "edited")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == str(final["spec"]["compile"]["maxModelLen"])


def test_always_failing_job_backs_off_and_recovers(kube: Kube, operator: OperatorProcess) -> None:
    failure = {"reason": "CompileFailed", "message": "does not fit"}
    kube.apply_model("failing", spec(precompile={"backoffLimit": 0, "podAnnotations": {
        "kwok.spyre.dev/fail": "true",
        "kwok.spyre.dev/termination-message": json.dumps(failure)}}))
    kube.wait_condition("failing", "Degraded", "True", reason="PrecompileFailed", timeout=60)
    # The counters below are process-wide: models in namespaces of earlier tests still being
    # deleted are reconciled meanwhile ("namespace is being deleted; not retrying"), 42
    # requests a minute in one run against the bound's 40. The quiet is measured once they
    # are gone.
    wait_until(lambda: not [n["metadata"]["name"] for n in kube.items("namespaces")
                            if n["metadata"]["name"] != kube.ns
                            and (n.get("status") or {}).get("phase") == "Terminating"],
               180, "the earlier tests' namespaces deleted")  # fmt: skip
    settle_writes(operator, kube.ns)  # trailing Events and status

    def footprint() -> dict[str, Any]:
        """What the operator writes for this model: its status, its Job, its Events."""
        return {
            "model": kube.model("failing")["metadata"]["resourceVersion"],
            "jobs": sorted(j["metadata"]["uid"] for j in kube.items("jobs", MANAGED)),
            "events": len([e for e in kube.items("events")
                           if e["involvedObject"]["name"] == "failing"]),
        }

    before, mine, raw = counters(operator), footprint(), operator.metrics()
    ns_writes = operator.namespace_writes(kube.ns)
    t0 = time.monotonic()
    holds(lambda: footprint() == mine, 60, "this model's status, Job and Events", interval=2)
    after, minutes = counters(operator), (time.monotonic() - t0) / 60
    per_minute = {k: (after[k] - before[k]) / minutes for k in before}
    moved = {k: v - raw.get(k, 0) for k, v in operator.metrics().items()
             if k.startswith("spyre_operator_api_requests_total") and v != raw.get(k, 0)}
    # A failed compile waits out its backoff (5 minutes with the test operator): no new Job,
    # no status or Event churn for this model (exactly), and the operator as a whole stays
    # quiet. The operator's counters are process-wide: earlier tests' models may still be
    # winding down (their GC evaluations and not-ready rechecks: 22 requests a minute was
    # seen on a loaded run), so the bounds only rule out a retry loop, which at the 1 s base
    # backoff would make 60 and more a minute.
    # a reconcile of the model (not only time) passes over it: still no retry, no write
    reconcile_now(kube, operator, "failing")
    assert {k: v for k, v in footprint().items() if k != "model"} == {
        k: v for k, v in mine.items() if k != "model"}  # (the labels changed the model)
    assert operator.namespace_writes(kube.ns) == ns_writes, operator.log_tail(15)
    assert per_minute["writes"] <= 10, (per_minute, moved)
    assert per_minute["requests"] <= 40, (per_minute, moved)
    assert per_minute["lease_requests"] <= 35, per_minute  # one renewal per 2 s
    assert kube.condition("failing", "Degraded")["reason"] == "PrecompileFailed"
    # fixing the cause and asking for a retry recovers
    kube.apply_model("failing", spec(precompile={"backoffLimit": 1}))
    kube.kubectl("annotate", "--overwrite", "spyremodel/failing", f"{GROUP}/retry-compile=now")
    kube.wait_condition("failing", "Ready", timeout=90)
    assert kube.condition("failing", "Degraded")["status"] == "False"
