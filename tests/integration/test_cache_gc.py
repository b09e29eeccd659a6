"""Garbage collection of unused artifacts on a shared cache claim, on the real control plane.

kwok plays the pods (the GC Job's pod completes without removing anything). What is checked is
the operator's side: which keys it asks ``spyre-engine gc`` to remove, and that a key some
model needs or serves is never among them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import ControlPlane, Kube, OperatorProcess, holds_over_reconciles
from .test_operator import GROUP, HOLD, artifact_of, deployment, release, spec

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
        # a few more evaluations (2 s apart, the timer user reconciled each time): none may
        # add a Job
        holds_over_reconciles(kube, fast, lambda: len(gc_jobs()) == 1, "one GC Job")
        in_use = {key_a2, key_b}
        for removed in seen.values():
            assert not set(removed) & in_use, f"an in-use key listed: {removed}"
    finally:
        fast.stop()
        operator.start()


def test_gc_off_then_on_collects_and_says_so(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    """retention.enabled false makes no GC Job; turned on, the Job's summary (kwok plays the
    engine's termination message) becomes an ArtifactsCollected Event on every user of the
    claim, the key leaves status.cache and its precompile Job goes (a revert compiles again)."""
    operator.stop()
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    off = {"volume": {"retention": {"enabled": False, "keepLast": 0, "unusedForSeconds": 0}}}
    try:
        kube.apply_model("a", spec(compile={"maxModelLen": 2048}, cache=off))
        kube.wait_condition("a", "Ready", "True", reason="Serving")
        kube.apply_model("b", spec(compile={"maxModelLen": 8192}))
        kube.wait_condition("b", "Ready", "True", reason="Serving")
        key_a = kube.model("a")["status"]["artifact"]["key"]
        kube.apply_model("a", spec(compile={"maxModelLen": 4096}, cache=off))
        kube.wait(lambda: [a["key"] for a in kube.model("a")["status"]["cache"]["artifacts"]
                           if not a["inUse"]] == [key_a], 90, "the old artifact unused")
        # a few evaluations (2 s apart): the oldest user's retention is off
        holds_over_reconciles(kube, fast, lambda: not kube.items("jobs", GC_SELECTOR),
                              "no GC Job")
        assert any(j["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key_a
                   for j in kube.items("jobs", "app.kubernetes.io/component=precompile"))

        summary = {"removed": [{"key": key_a, "sizeBytes": 3000}], "skipped": [],
                   "freedBytes": 3000, "remainingBytes": 5}
        on = {"volume": {"retention": {"keepLast": 0, "unusedForSeconds": 0}}}
        kube.apply_model("a", spec(
            compile={"maxModelLen": 4096}, cache=on,
            precompile={"backoffLimit": 0, "podAnnotations": {
                "kwok.spyre.dev/termination-message": json.dumps(summary)}}))
        job = kube.wait(lambda: next(iter(kube.items("jobs", GC_SELECTOR)), None), 60,
                        "a GC Job")
        assert _removed(job) == [key_a]

        def collected_events() -> set[str]:
            events = kube.items("events")
            return {e["involvedObject"]["name"] for e in events
                    if e.get("reason") == "ArtifactsCollected" and "freed 3000 bytes"
                    in e.get("message", "")}

        kube.wait(lambda: collected_events() == {"a", "b"}, 60, "ArtifactsCollected on a and b")
        kube.wait(lambda: key_a not in [a["key"] for a in
                                        kube.model("a")["status"]["cache"]["artifacts"]],
                  30, "the removed key leaves status.cache")
        kube.wait(lambda: not any(
            j["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key_a
            for j in kube.items("jobs", "app.kubernetes.io/component=precompile")),
            30, "the removed key's precompile Job deleted")
        kube.wait_condition("a", "Ready", "True", reason="Serving")
    finally:
        fast.stop()
        operator.start()


def test_the_key_of_a_running_precompile_is_not_collected_until_it_finishes(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    """An artifact model a no longer uses is being compiled again by a precompile Job nobody's
    spec needs any more (model c asked for it, then was edited away): the Job protects it."""
    operator.stop()
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    off = {"volume": {"retention": {"enabled": False, "keepLast": 0, "unusedForSeconds": 0}}}
    held = {"backoffLimit": 0, "podAnnotations": HOLD}
    try:
        kube.apply_model("a", spec(compile={"maxModelLen": 2048}, cache=off))
        kube.wait_condition("a", "Ready", "True", reason="Serving")
        key_x = kube.model("a")["status"]["artifact"]["key"]
        kube.apply_model("a", spec(compile={"maxModelLen": 4096}, cache=off))
        kube.wait(lambda: [a["key"] for a in kube.model("a")["status"]["cache"]["artifacts"]
                           if not a["inUse"]] == [key_x], 90, "X unused")
        kube.kubectl("delete", "job", names_of_key(kube, key_x)[0], "--wait=true")

        kube.apply_model("c", spec(compile={"maxModelLen": 2048}, precompile=held))
        x_job = kube.wait(lambda: next(iter(names_of_key(kube, key_x)), None), 30,
                          "X compiling again")
        kube.apply_model("c", spec(compile={"maxModelLen": 8192}, precompile=held))
        kube.wait(lambda: kube.model("c")["status"]["artifact"]["key"] != key_x, 30,
                  "c edited away from X")
        assert names_of_key(kube, key_x) == [x_job], "X's Job still running"

        kube.apply_model("a", spec(compile={"maxModelLen": 4096}, cache=NO_RETENTION))
        # a few evaluations (2 s apart): X is unused but being written
        holds_over_reconciles(kube, fast, lambda: not kube.items("jobs", GC_SELECTOR),
                              "no GC Job", seconds=6)

        release(kube, x_job)
        job = kube.wait(lambda: next(iter(kube.items("jobs", GC_SELECTOR)), None), 60,
                        "a GC Job once X's compile finished")
        assert _removed(job) == [key_x]
    finally:
        fast.stop()
        operator.start()


def names_of_key(kube: Kube, key: str) -> list[str]:
    return [j["metadata"]["name"] for j in
            kube.items("jobs", "app.kubernetes.io/component=precompile")
            if j["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key]
