"""Garbage collection of unused artifacts on a shared cache claim, on the real control plane.

kwok plays the pods (the GC Job's pod completes without removing anything). What is checked is
the operator's side: which keys it asks ``spyre-engine gc`` to remove, and that a key some
model needs or serves is never among them.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import ControlPlane, Kube, OperatorProcess
from .test_operator import GROUP, artifact_of, deployment, spec

pytestmark = pytest.mark.integration

GC_SELECTOR = "app.kubernetes.io/component=gc"
NO_RETENTION = {"volume": {"retention": {"keepLast": 0, "unusedForSeconds": 0}}}


def _spec(max_model_len: int) -> dict[str, Any]:
    return spec(compile={"maxModelLen": max_model_len}, cache=NO_RETENTION)


def _removed(job: dict[str, Any]) -> list[str]:
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("--remove") + 1]).split(",")


def test_an_edit_leaves_an_unused_artifact_that_a_gc_job_removes(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    operator.stop()  # this test's operator evaluates the claim every 2 s
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    seen: dict[str, list[str]] = {}

    def gc_jobs() -> list[dict[str, Any]]:
        items = kube.items("jobs", GC_SELECTOR)
        for j in items:
            seen[j["metadata"]["name"]] = _removed(j)
        return items

    try:
        kube.apply_model("a", _spec(2048))
        kube.apply_model("b", _spec(8192))
        kube.wait_condition("a", "Ready", "True", reason="Serving")
        kube.wait_condition("b", "Ready", "True", reason="Serving")
        key_a = kube.model("a")["status"]["artifact"]["key"]
        key_b = kube.model("b")["status"]["artifact"]["key"]
        assert key_a != key_b
        assert not gc_jobs(), "nothing is unused yet"

        kube.apply_model("a", _spec(4096))
        kube.wait(lambda: artifact_of(deployment(kube, "a")) != key_a[:12], 90, "roll to the edit")
        kube.wait_condition("a", "Ready", "True", reason="Serving")
        key_a2 = kube.model("a")["status"]["artifact"]["key"]

        job = kube.wait(lambda: next(iter(gc_jobs()), None), 60, "a GC Job")
        assert _removed(job) == [key_a], "exactly the artifact the edit left unused"
        pod = job["spec"]["template"]["spec"]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "spyre-compile-cache"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert job["spec"]["ttlSecondsAfterFinished"] > 0
        assert sorted(r["name"] for r in job["metadata"]["ownerReferences"]) == ["a", "b"]
        assert job["metadata"]["labels"][f"{GROUP}/cache-claim"] == "spyre-compile-cache"

        # The GC Job completes (kwok) without a summary: nothing is known to be removed, and
        # the same decision never makes a second Job.
        kube.wait(lambda: any(c.get("type") == "Complete" for c in
                              (kube.get("job", job["metadata"]["name"]).get("status") or {})
                              .get("conditions") or []), 60, "the GC Job done")
        time.sleep(5)  # a few more evaluations (2 s apart): none may add a Job
        assert len(gc_jobs()) == 1
        in_use = {key_a2, key_b}
        for removed in seen.values():
            assert not set(removed) & in_use, f"an in-use key listed: {removed}"
    finally:
        fast.stop()
        operator.start()
