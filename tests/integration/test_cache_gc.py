"""Garbage collection of unused artifacts on a shared cache claim, on the real control plane.

kwok plays the pods (the GC Job's pod completes without removing anything). What is checked is
the operator's side: which keys it asks ``spyre-engine gc`` to remove, and that a key some
model needs or serves is never among them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
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
        # (key_a's finished precompile Job may be gone already: no spec needs it.)

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


def _gc_pod_check(kube: Kube, control_plane: ControlPlane, claim: str,
                  account: str = "spyre-gc") -> Any:
    """What ``spyre-engine gc --claim`` asks before each removal, as the GC pod would: the
    real API server, with a token of ``account`` (the operator's spyre-gc ServiceAccount)."""
    from spyre_engine import inuse

    token = kube.kubectl("create", "token", account, "--duration=10m").strip()
    lister = inuse.api_lister(kube.ns, server=control_plane.server, token=token,
                              ca_file=control_plane.pki / "ca.crt")
    return inuse.InUseCheck(claim, lister)


def _held_gc_pods_and_an_edit(kube: Kube) -> str:
    """b, the claim's oldest user, serving (its precompile.podAnnotations, kwok's hold, go to
    the GC Jobs' pods: they run only when the test lets them), a served at 2048 and then edited
    to 4096: the 2048 key, which the edit leaves unused."""
    kube.apply_model("b", spec(compile={"maxModelLen": 8192}, cache=NO_RETENTION,
                               precompile={"backoffLimit": 0, "podAnnotations": HOLD}))
    b_job = kube.wait(lambda: (kube.model("b").get("status") or {}).get("artifact", {})
                      .get("jobName"), 30, "b's precompile Job")  # fmt: skip
    kube.wait(lambda: kube.items("pods", f"job-name={b_job}"), 30, "b's precompile pod")
    release(kube, b_job)
    kube.wait_condition("b", "Ready", "True", reason="Serving")
    kube.apply_model("a", _spec(2048))
    kube.wait_condition("a", "Ready", "True", reason="Serving")
    key = str(kube.model("a")["status"]["artifact"]["key"])
    kube.apply_model("a", _spec(4096))
    return key


def test_a_key_needed_again_before_the_gc_pod_runs_is_not_removed_and_if_it_was_compiles(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any,
    tmp_path: Any,
) -> None:
    """A GC Job's remove list is fixed when it is created. Its pod waits (kwok holds it);
    meanwhile model a reverts to the key and serves it again. When the GC pod runs, its check
    (the engine's, through the real API server with the spyre-gc ServiceAccount the operator
    applied) finds a's Deployment and pods using the key and keeps it; a token without that
    Role removes nothing. And had the key been removed anyway (the GC pod's summary says so),
    a does not trust its memory: ArtifactReady turns False and the key compiles again."""
    from spyre_engine import catalog, gc, inuse, manifest

    operator.stop()
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    claim = "spyre-compile-cache"
    try:
        # b is the claim's oldest user: its precompile.podAnnotations (kwok's hold) go to the
        # GC Job's pod.
        key = _held_gc_pods_and_an_edit(kube)
        job = kube.wait(lambda: next(iter(kube.items("jobs", GC_SELECTOR)), None), 90,
                        "a GC Job for a's old key")
        assert _removed(job) == [key]
        assert job["spec"]["template"]["spec"]["serviceAccountName"] == "spyre-gc"

        kube.apply_model("a", _spec(2048))  # the revert, before the GC pod runs
        kube.wait(lambda: artifact_of(deployment(kube, "a")) == key[:12], 60, "a serves it again")
        kube.wait(lambda: [p for p in kube.items("pods", "app.kubernetes.io/component=server")
                           if p["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key],
                  60, "a pod of the revert")

        # The GC pod runs now, with its Job's own --remove: on a volume holding the key.
        art = tmp_path / "artifacts" / key
        art.mkdir(parents=True)
        (art / "graph.bin").write_bytes(b"x" * 1000)
        catalog.add_entry(art, {"data": {"MODEL_NAME": key}})
        manifest.write_manifest(art)
        result = gc.gc(tmp_path, _removed(job), in_use=_gc_pod_check(kube, control_plane, claim))
        assert result.removed == [] and result.in_use_unknown is None, result
        [skipped] = result.skipped
        assert skipped["key"] == key and "deployment/a" in skipped["reason"], skipped
        assert "pod/a-" in skipped["reason"], skipped
        manifest.verify(art)
        # Without the Role (the namespace's default ServiceAccount) it cannot tell: no removal.
        unknown = gc.gc(tmp_path, [key], in_use=_gc_pod_check(kube, control_plane, claim,
                                                               account="default"))
        assert unknown.removed == [] and "HTTP 403" in (unknown.in_use_unknown or "")
        manifest.verify(art)
        # The Role lists pods, Jobs and Deployments, nothing else.
        role = kube.get("role", "spyre-gc")
        assert sorted((r["apiGroups"][0], r["resources"][0], tuple(r["verbs"]))
                      for r in role["rules"]) == [
            ("", "pods", ("list",)), ("apps", "deployments", ("list",)),
            ("batch", "jobs", ("list",))]
        assert inuse.users_of(key, "another-claim", kube.items("pods"), [], []) == []

        # Had it been removed anyway (the pod's summary says so): a compiles it again.
        summary = {"removed": [{"key": key, "sizeBytes": 1000}], "skipped": [],
                   "freedBytes": 1000}
        def key_jobs() -> set[str]:
            return {j["metadata"]["uid"]
                    for j in kube.items("jobs", "app.kubernetes.io/component=precompile")
                    if j["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key}

        before = key_jobs()  # (none: the revert serves what status remembers)
        gc_pods = f"job-name={job['metadata']['name']}"
        pod = kube.wait(lambda: next(iter(kube.items("pods", gc_pods)), None), 30, "the GC pod")
        kube.kubectl("annotate", "pod", pod["metadata"]["name"],
                     f"kwok.spyre.dev/termination-message={json.dumps(summary)}",
                     "kwok.spyre.dev/hold-")

        def recompiled() -> Any:  # (kwok compiles in a second: the Event shows the False)
            return [e for e in kube.items("events") if e["involvedObject"]["name"] == "a"
                    and "ArtifactReady=False" in e.get("message", "")
                    and "garbage collection" in e.get("message", "")]

        kube.wait(recompiled, 60, "ArtifactReady=False: the served key was collected")
        kube.wait(lambda: key_jobs() - before, 60, "the key's precompile Job created again")
        kube.wait_condition("a", "ArtifactReady", "True")
        assert artifact_of(deployment(kube, "a")) == key[:12]
    finally:
        fast.stop()
        operator.start()


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_removal_whose_gc_job_went_while_the_operator_was_down_is_learned_again(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any,
) -> None:
    """Issue 47, 2, the reported sequence: a GC Job removes a's old key while the operator is
    down, and goes (its TTL, a cleanup of finished Jobs) before anyone read it; meanwhile a is
    reverted to that key. A fresh operator trusted status's memory of the artifact for good
    (ArtifactReady on a dir no longer there: the key in use is never collected again). Now the
    engine records removals on the volume and every later GC Job reports them: the next one
    (for the key the revert left unused) tells the operator, which puts the removal on the
    claim and compiles the key again. kwok plays the pods: the GC pods' summaries are the
    engine's (tests/engine/test_gc.py checks the engine writes them)."""
    logs = control_plane.root / ".cluster" / "logs"
    operator.stop()
    fast = OperatorProcess(kubeconfig, logs, env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    claim = "spyre-compile-cache"

    def key_jobs(key: str) -> set[str]:
        return {j["metadata"]["uid"]
                for j in kube.items("jobs", "app.kubernetes.io/component=precompile")
                if j["metadata"]["annotations"].get(f"{GROUP}/artifact-key") == key}

    def gc_job_removing(key: str) -> Any:
        return next((j for j in kube.items("jobs", GC_SELECTOR) if key in _removed(j)), None)

    def finish(job: dict[str, Any], summary: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        pod = kube.wait(lambda: next(iter(kube.items("pods", f"job-name={name}")), None), 30,
                        f"{name}'s pod")  # fmt: skip
        kube.kubectl("annotate", "pod", pod["metadata"]["name"],
                     f"kwok.spyre.dev/termination-message={json.dumps(summary)}",
                     "kwok.spyre.dev/hold-")  # fmt: skip
        kube.wait(lambda: any(c.get("type") == "Complete" for c in
                              ((kube.get("job", name) or {}).get("status") or {})
                              .get("conditions") or []), 60, f"{name} done")  # fmt: skip

    try:
        # b is the claim's oldest user: its precompile.podAnnotations (kwok's hold) go to the
        # GC Jobs' pods, which run only when the test has written what they removed.
        old = _held_gc_pods_and_an_edit(kube)
        kube.wait(lambda: artifact_of(deployment(kube, "a")) != old[:12], 90, "roll to 4096")
        new = kube.model("a")["status"]["artifact"]["key"]
        job = kube.wait(lambda: gc_job_removing(old), 90, "a GC Job for a's old key")

        fast.stop()  # the operator is down from here
        removed_at = _utc_now()  # (the GC pod's clock: after the key's compile)
        finish(job, {"removed": [{"key": old, "sizeBytes": 1000}], "skipped": [],
                     "freedBytes": 1000, "removedRecord": {old: removed_at}})
        kube.kubectl("delete", "job", job["metadata"]["name"], "--wait=true")
        kube.apply_model("a", _spec(2048))  # the revert, with nobody to read the GC Job
        compiled_before = key_jobs(old)

        again = OperatorProcess(kubeconfig, logs, env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
        again.start()
        try:
            # the revert left the 4096 key unused: the next GC Job, whose pod reports the
            # volume's record (the lost removal included)
            nxt = kube.wait(lambda: gc_job_removing(new), 90, "a GC Job for the 4096 key")
            finish(nxt, {"removed": [{"key": new, "sizeBytes": 1000}], "skipped": [],
                         "freedBytes": 1000,
                         "removedRecord": {new: _utc_now(), old: removed_at}})

            def recorded() -> bool:
                pvc = kube.get("pvc", claim) or {}
                raw = pvc["metadata"].get("annotations", {}).get(
                    f"{GROUP}/removed-artifacts") or "{}"
                return old in json.loads(raw)

            kube.wait(recorded, 60, "the lost removal recorded on the claim")
            kube.wait(lambda: key_jobs(old) - compiled_before, 60,
                      "the reverted key compiled again")  # fmt: skip
            kube.wait_condition("a", "ArtifactReady", "True", timeout=60)
            assert kube.model("a")["status"]["artifact"]["key"] == old
        finally:
            again.stop()
    finally:
        fast.stop()
        operator.start()


def test_a_key_a_model_that_moved_away_still_serves_from_the_claim_is_not_listed(
    kube: Kube, operator: OperatorProcess, control_plane: ControlPlane, kubeconfig: Any
) -> None:
    """a and b share key K on the claim; b is edited away from K (its status lists K unused)
    and a moves to another claim whose compile is slow (kwok holds it): a is no user of the
    claim any more but its pods still serve K from it. No GC Job may list K."""
    operator.stop()
    fast = OperatorProcess(kubeconfig, control_plane.root / ".cluster" / "logs",
                           env={"SPYRE_GC_INTERVAL_SECONDS": "2"})
    fast.start()
    listed: set[str] = set()

    def gc_lists() -> set[str]:
        for j in kube.items("jobs", GC_SELECTOR):
            listed.update(_removed(j))
        return listed

    try:
        kube.apply_model("a", _spec(2048))
        kube.apply_model("b", _spec(2048))
        kube.wait_condition("a", "Ready", "True", reason="Serving")
        kube.wait_condition("b", "Ready", "True", reason="Serving")
        key = kube.model("a")["status"]["artifact"]["key"]
        assert kube.model("b")["status"]["artifact"]["key"] == key
        moved = {"volume": {"name": "spyre-cache-moved",
                            "retention": {"keepLast": 0, "unusedForSeconds": 0}}}
        kube.apply_model("a", spec(compile={"maxModelLen": 2048}, cache=moved,
                                   precompile={"backoffLimit": 0, "podAnnotations": HOLD}))
        kube.wait(lambda: (kube.model("a")["status"].get("artifact") or {}).get("claim")
                  == "spyre-cache-moved", 30, "a compiles on the new claim")
        assert artifact_of(deployment(kube, "a")) == key[:12], "a still serves K"
        kube.apply_model("b", _spec(8192))
        kube.wait(lambda: [x["key"] for x in kube.model("b")["status"]["cache"]["artifacts"]
                           if not x["inUse"]] == [key], 90, "K unused in b's status")
        holds_over_reconciles(kube, fast, lambda: key not in gc_lists(), "K not listed",
                              seconds=8)
        assert artifact_of(deployment(kube, "a")) == key[:12]
    finally:
        fast.stop()
        operator.start()
