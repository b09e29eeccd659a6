"""Artifact garbage collection on the real node (issue 14): a real GC Job on the cache claim.

One SpyreModel with ``retention: {keepLast: 0, unusedForSeconds: 0}`` is compiled and served,
then edited to another compile shape. Its first artifact is then unused: the operator runs
``spyre-engine gc`` in a Job on the claim, which removes the directory (the catalog lives in
it) while the new artifact keeps serving. Checked on the PV's files, not only in the status.

Then a second SpyreModel on the same claim compiles its own shape (no replicas) and is
deleted: its artifact is an orphan, which only the volume knows of. The peer's reconcile sweeps
the claim (``--keep`` every key still known) and, with a zero retention, the GC Job removes it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from spyre_engine import gc, manifest
from spyre_operator.desired import names
from spyre_operator.desired.gcjob import COMPONENT_GC

from tests.contract.realpods import (
    RealEnv,
    claim_host_dir,
    model_spec,
    real_env_fixture,
    wait_ready,
)
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(1200)]

# GC is evaluated at most every SPYRE_GC_INTERVAL_SECONDS per claim (default 300 s).
env = real_env_fixture("gc", operator_env={"SPYRE_GC_INTERVAL_SECONDS": "5"})

MODEL = "gc"
RETAIN_NOTHING = {"cache": {"volume": {"retention": {"keepLast": 0, "unusedForSeconds": 0}}}}


def _spec(env: RealEnv, max_num_seqs: int) -> dict[str, Any]:
    return model_spec(env.image, compile={"maxNumSeqs": max_num_seqs}, **RETAIN_NOTHING)


def _wait(what: str, predicate: Any, timeout: float, env: RealEnv) -> Any:
    return support.wait_for(env.cp, env.ns, MODEL, what, predicate, timeout)


def test_an_artifact_an_edit_left_unused_is_removed_from_the_claim_by_a_gc_job(
    env: RealEnv,
) -> None:
    env.kube.apply_model(MODEL, _spec(env, 2))
    first = wait_ready(env.kube, MODEL)
    old_key = first["status"]["servingArtifactKey"]
    root = claim_host_dir(env.cp, env.kube, first["status"]["artifact"]["claim"])
    old_dir = root / "artifacts" / old_key
    assert manifest.manifest_path(old_dir).is_file(), sorted(p.name for p in old_dir.iterdir())

    env.kube.apply_model(MODEL, _spec(env, 4))
    new_key = _wait("the edit served from a new artifact", lambda: (
        (st := env.kube.model(MODEL).get("status") or {}).get("servingArtifactKey") not in
        (None, old_key) and st["servingArtifactKey"]), 900, env)  # fmt: skip
    wait_ready(env.kube, MODEL)

    def collected() -> list[dict[str, Any]]:
        return [e for e in env.kube.items("events")
                if e["involvedObject"]["name"] == MODEL
                and e.get("reason") == "ArtifactsCollected"]  # fmt: skip

    events = _wait("an ArtifactsCollected Event", collected, 300, env)
    assert names.short_key(old_key) in events[0]["message"], events[0]["message"]
    gc_jobs = env.cp.kubectl_json("get", "jobs", "-n", env.ns, "-l",
                                  f"{names.COMPONENT}={COMPONENT_GC}")["items"]  # fmt: skip
    assert gc_jobs and all((j.get("status") or {}).get("succeeded") for j in gc_jobs), gc_jobs

    # On the claim: the old artifact is gone, nothing half-removed is left, the new one is
    # complete and still verifies against its manifest.
    assert not old_dir.exists()
    leftovers = sorted(p.name for p in (root / "artifacts").iterdir() if p.name != new_key)
    assert leftovers == [gc.REMOVED_FILENAME], leftovers  # the volume's record of the removal
    assert old_key in gc.read_removed(root / "artifacts")
    # (raises ArtifactCorrupt otherwise; an eager artifact lists no compiled files)
    assert "files" in manifest.verify(root / "artifacts" / new_key)
    status = env.kube.model(MODEL)["status"]
    assert old_key not in [a["key"] for a in status["cache"]["artifacts"]]
    assert support.condition(env.kube.model(MODEL), "Ready")["status"] == "True"
    answer = support.completion(env.cp, env.ns, MODEL, "hello", max_tokens=4, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 4, answer

    # What the GC Job removed is recorded on the claim, which outlives the Job (issue 31, 3:
    # a model still listing the key and reverted to it after the Job's TTL was told "compiled
    # earlier" and switched to nothing): written by the operator as a field manager of its own.
    claim = first["status"]["artifact"]["claim"]
    pvc = env.cp.kubectl_json("get", "pvc", "-n", env.ns, claim, "--show-managed-fields")
    record = json.loads(pvc["metadata"]["annotations"][names.REMOVED_ARTIFACTS_ANNOTATION])
    assert old_key in record, record
    managers = {f["manager"] for f in pvc["metadata"]["managedFields"]
                if names.REMOVED_ARTIFACTS_ANNOTATION in json.dumps(f.get("fieldsV1"))}
    assert managers == {"spyre-model-operator-records"}, pvc["metadata"]["managedFields"]


def _plant_download(root: Path, repo: str) -> Path:
    """``repo`` downloaded into the claim's hub/ as a precompile Job leaves it (huggingface_hub
    itself, from tests/engine/hub.py's local stand-in for the Hub), writable by the GC pod's
    uid as the precompile pod's files are (its fsGroup): the model's folder."""
    from huggingface_hub import snapshot_download

    from tests.engine.hub import LocalHub, Repo

    with LocalHub() as hub:
        hub.repos[repo] = Repo(files={"config.json": b"{}", "model.safetensors": b"w" * 4096})
        snapshot_download(repo, cache_dir=root / "hub", endpoint=hub.url, token=False)
    for dirpath, _dirs, files in os.walk(root / "hub"):
        os.chmod(dirpath, 0o777)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o666)
    return root / "hub" / ("models--" + repo.replace("/", "--"))


def test_a_deleted_models_artifact_is_swept_from_the_shared_claim(env: RealEnv) -> None:
    """... and a downloaded model no SpyreModel names goes with a sweep too (issue 47, 1)."""
    peer = "gc-peer"
    # its own start: the model served (where the test above leaves it; run alone, it compiles)
    env.kube.apply_model(MODEL, _spec(env, 4))
    serving = _wait("the model served at its spec", lambda: (
        (m := env.kube.model(MODEL))["metadata"]["generation"]
        == (st := m.get("status") or {}).get("observedGeneration")
        and (support.condition(m, "Ready") or {}).get("status") == "True"
        and st.get("servingArtifactKey") == (st.get("artifact") or {}).get("key")
        and st["servingArtifactKey"]), 900, env)  # fmt: skip
    env.kube.apply_model(peer, {**_spec(env, 3), "replicas": 0})
    art = support.wait_for(env.cp, env.ns, peer, "the peer's artifact", lambda: (
        (c := support.condition(env.kube.model(peer), "ArtifactReady")) is not None
        and c["status"] == "True" and env.kube.model(peer)["status"]["artifact"]
    ), 900)  # fmt: skip
    peer_key = art["key"]
    assert peer_key != serving
    root = claim_host_dir(env.cp, env.kube, art["claim"])
    peer_dir = root / "artifacts" / peer_key
    assert manifest.manifest_path(peer_dir).is_file()
    unused = _plant_download(root, "org/unused")

    env.kube.kubectl("delete", "spyremodel", peer, "--wait=true", "--timeout=60s")

    def swept() -> list[dict[str, Any]]:
        return [e for e in env.kube.items("events")
                if e["involvedObject"]["name"] == MODEL and e.get("reason") == "ArtifactsCollected"
                and names.short_key(peer_key) in e["message"]]  # fmt: skip

    [event] = _wait("the deleted peer's artifact collected", swept, 300, env)
    assert "listed by no SpyreModel" in event["message"], event["message"]
    assert not peer_dir.exists()
    # The survivor's artifact and the volume's records (orphans, removals) are all that is left.
    left = sorted(p.name for p in (root / "artifacts").iterdir() if p.name != gc.ORPHANS_FILENAME)
    assert left == sorted([serving, gc.REMOVED_FILENAME]), left
    assert "files" in manifest.verify(root / "artifacts" / serving)
    assert support.condition(env.kube.model(MODEL), "Ready")["status"] == "True"

    def downloads() -> list[dict[str, Any]]:
        return [e for e in env.kube.items("events")
                if e["involvedObject"]["name"] == MODEL and e.get("reason") == "ModelsCollected"]

    [event] = _wait("the unnamed download collected", downloads, 300, env)
    freed = re.search(r"freed (\d+) bytes", event["message"])
    assert "org/unused" in event["message"] and freed and int(freed[1]) >= 4096, event["message"]
    assert not unused.exists() and not (root / "hub" / ".locks" / unused.name).exists()


def test_a_key_served_again_before_the_gc_pod_runs_stays_on_the_claim(env: RealEnv) -> None:
    """A GC Job's remove list is fixed when it is created; its pod may run minutes later.
    Here it waits for a node label (the claim's oldest user's precompile.nodeSelector) while
    the model reverts to the listed key and serves it again. When the real GC pod runs, the
    engine asks the API server (as the spyre-gc ServiceAccount the operator applied) and keeps
    the key its pods serve: the artifact is whole on the PV and the model answers."""
    hold, peer, model = "spyre.dev/gc-hold", "gc-hold", "gc-rev"
    volume = {"volume": {"name": "gc-revert", "retention": {"keepLast": 0,
                                                            "unusedForSeconds": 0}}}

    def spec(seqs: int, **override: Any) -> dict[str, Any]:
        return model_spec(env.image, compile={"maxNumSeqs": seqs}, cache=volume, **override)

    def wait(name: str, what: str, predicate: Any, timeout: float = 900) -> Any:
        return support.wait_for(env.cp, env.ns, name, what, predicate, timeout)

    # The claim's oldest user compiles its shape, then its precompile placement (outside the
    # key) names a node label nobody has: the GC Job's pod, placed like it, waits.
    env.kube.apply_model(peer, {**spec(3), "replicas": 0})
    wait(peer, "the peer's artifact", lambda: (
        (support.condition(env.kube.model(peer), "ArtifactReady") or {}).get("status") == "True"))
    env.kube.apply_model(peer, {**spec(3, precompile={"nodeSelector": {hold: "go"}}),
                                "replicas": 0})
    env.kube.apply_model(model, spec(2))
    key = wait_ready(env.kube, model)["status"]["servingArtifactKey"]
    env.kube.apply_model(model, spec(4))
    wait(model, "served from the edit", lambda: (
        (env.kube.model(model).get("status") or {}).get("servingArtifactKey")
        not in (None, key) and (support.condition(env.kube.model(model), "Ready") or {})
        .get("status") == "True"))  # fmt: skip

    def gc_job() -> dict[str, Any] | None:
        # this claim's only: the same shape has the same key on the other tests' claim, whose
        # GC Job (finished) may list it too
        for j in env.kube.items("jobs", f"{names.COMPONENT}={COMPONENT_GC},"
                                        f"{names.CLAIM_LABEL}=gc-revert"):
            args = j["spec"]["template"]["spec"]["containers"][0]["args"]
            if key in args[args.index("--remove") + 1].split(","):
                return j
        return None

    job = wait(model, "a GC Job listing the old key", gc_job, 120)
    env.kube.apply_model(model, spec(2))  # the revert, before the GC pod runs
    wait(model, "the revert served", lambda: (
        (env.kube.model(model).get("status") or {}).get("servingArtifactKey") == key
        and (support.condition(env.kube.model(model), "Ready") or {}).get("status") == "True"
        and (pods := support.server_pods(env.cp, env.ns, model))
        and all(p["metadata"]["annotations"].get(names.ARTIFACT_KEY_ANNOTATION) == key
                for p in pods)))  # fmt: skip
    assert not (env.kube.get("job", job["metadata"]["name"]).get("status") or {}).get(
        "succeeded"), "the GC pod must not have run yet"

    env.cp.kubectl("label", "node", env.node.name, f"{hold}=go", "--overwrite")
    try:
        # The operator deletes a GC Job that kept a key in use as soon as it has read its
        # result (so that the decision can be made again), and says so in an Event.
        [kept] = wait(model, "the GC pod ran and kept the key", lambda: [
            e for e in env.kube.items("events") if e["involvedObject"]["name"] == model
            and e.get("reason") == "ArtifactsKept" and names.short_key(key) in e["message"]],
            300)  # fmt: skip
    finally:
        env.cp.kubectl("label", "node", env.node.name, f"{hold}-", check=False)
    assert "in use by" in kept["message"] and "deployment/" in kept["message"], kept["message"]
    assert not [e for e in env.kube.items("events") if e["involvedObject"]["name"] == model
                and e.get("reason") == "ArtifactsCollected"
                and names.short_key(key) in e["message"]]  # fmt: skip
    root = claim_host_dir(env.cp, env.kube, "gc-revert")
    assert "files" in manifest.verify(root / "artifacts" / key)
    assert support.condition(env.kube.model(model), "Ready")["status"] == "True"
    art = support.condition(env.kube.model(model), "ArtifactReady")
    assert art["status"] == "True", art
    answer = support.completion(env.cp, env.ns, model, "hello", max_tokens=4, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 4, answer
