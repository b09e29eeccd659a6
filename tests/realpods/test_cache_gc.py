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

from typing import Any

import pytest
from spyre_engine import manifest
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
    assert leftovers == [], leftovers
    # (raises ArtifactCorrupt otherwise; an eager artifact lists no compiled files)
    assert "files" in manifest.verify(root / "artifacts" / new_key)
    status = env.kube.model(MODEL)["status"]
    assert old_key not in [a["key"] for a in status["cache"]["artifacts"]]
    assert support.condition(env.kube.model(MODEL), "Ready")["status"] == "True"
    answer = support.completion(env.cp, env.ns, MODEL, "hello", max_tokens=4, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 4, answer


def test_a_deleted_models_artifact_is_swept_from_the_shared_claim(env: RealEnv) -> None:
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

    env.kube.kubectl("delete", "spyremodel", peer, "--wait=true", "--timeout=60s")

    def swept() -> list[dict[str, Any]]:
        return [e for e in env.kube.items("events")
                if e["involvedObject"]["name"] == MODEL and e.get("reason") == "ArtifactsCollected"
                and names.short_key(peer_key) in e["message"]]  # fmt: skip

    [event] = _wait("the deleted peer's artifact collected", swept, 300, env)
    assert "listed by no SpyreModel" in event["message"], event["message"]
    assert not peer_dir.exists()
    # The survivor's artifact and the volume's orphan record are all that is left.
    left = sorted(p.name for p in (root / "artifacts").iterdir())
    assert left == sorted([serving, ".gc-orphans.json"]) or left == [serving], left
    assert "files" in manifest.verify(root / "artifacts" / serving)
    assert support.condition(env.kube.model(MODEL), "Ready")["status"] == "True"
