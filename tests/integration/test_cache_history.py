"""Rollback without recompiling, on the real control plane (issue 14).

kwok plays the pods. What is checked is the operator's side: after a compile-affecting edit
and its revert, with the old precompile Job gone, the model serves the old artifact again at
once: no Job is created, the Deployment points at the old key, and status.cache lists both.
"""

from __future__ import annotations

import json

import pytest

from .conftest import Kube, OperatorProcess
from .test_operator import GROUP, artifact_of, deployment, jobs, spec

pytestmark = pytest.mark.integration

SIZE = 5 * 2**30


def _spec(max_model_len: int) -> dict[str, object]:
    summary = {"path": "ignored", "compileSeconds": 12.0, "sizeBytes": SIZE}
    return spec(
        compile={"maxModelLen": max_model_len},
        precompile={"backoffLimit": 0, "podAnnotations": {
            "kwok.spyre.dev/termination-message": json.dumps(summary)}},
    )


def test_revert_serves_the_remembered_artifact_without_a_job(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("m", _spec(2048))
    kube.wait_condition("m", "Ready", "True", reason="Serving")
    key_a = kube.model("m")["status"]["artifact"]["key"]

    kube.apply_model("m", _spec(4096))
    kube.wait(lambda: artifact_of(deployment(kube, "m")) != key_a[:12], 90, "roll to the edit")
    kube.wait_condition("m", "Ready", "True", reason="Serving")
    st = kube.model("m")["status"]
    key_b = st["artifact"]["key"]
    assert key_b != key_a
    kube.wait(lambda: [(a["key"], a["inUse"]) for a in
                       kube.model("m")["status"]["cache"]["artifacts"]]
              == [(key_b, True), (key_a, False)], 30, "A no longer in use")

    # The Jobs are gone (a cleanup policy, or by hand): only the status remembers A.
    kube.kubectl("delete", "jobs", "--all", "--wait=true")
    kube.wait(lambda: not jobs(kube), 30, "Jobs deleted")

    kube.apply_model("m", _spec(2048))
    kube.wait(lambda: artifact_of(deployment(kube, "m")) == key_a[:12], 60,
              "the Deployment back on the old key")
    kube.wait_condition("m", "Ready", "True", reason="Serving")
    assert not jobs(kube), "a revert to an artifact still on the claim must not compile"
    st = kube.model("m")["status"]
    assert st["artifact"]["key"] == st["servingArtifactKey"] == key_a
    assert st["artifact"]["phase"] == "Ready" and st["artifact"]["sizeBytes"] == SIZE
    art = next(c for c in st["conditions"] if c["type"] == "ArtifactReady")
    assert "compiled earlier" in art["message"]
    dep = deployment(kube, "m")
    assert dep["metadata"]["annotations"][f"{GROUP}/artifact-key"] == key_a
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "2048"
    kube.wait(lambda: [(a["key"], a["inUse"]) for a in
                       kube.model("m")["status"]["cache"]["artifacts"]]
              == [(key_a, True), (key_b, False)], 30, "B no longer in use")

    # Usage: per artifact and in total, and a column of `kubectl get -o wide`.
    cache = kube.model("m")["status"]["cache"]
    assert [a["sizeBytes"] for a in cache["artifacts"]] == [SIZE, SIZE]
    assert cache["usedBytes"] == 2 * SIZE and cache["usage"] == "10.0 GiB in 2"
    table = kube.kubectl("get", "spyremodel/m", "-o", "wide")
    header, row = table.strip().splitlines()
    assert "CACHE" in header.split() and "10.0 GiB in 2" in row


def test_an_artifact_the_servers_refuse_shows_why_and_is_compiled_again_once_its_job_is_gone(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Serving pods that find the artifact truncated exit with ArtifactCorrupt (kwok plays the
    crash with the engine's termination message): that is the condition reason; deleting the
    precompile Job is how users ask for a fresh compile, and the operator starts one."""
    kube.apply_model("c", _spec(2048))
    kube.wait_condition("c", "Ready", "True", reason="Serving")
    key = kube.model("c")["status"]["artifact"]["key"]
    message = json.dumps({"reason": "ArtifactCorrupt", "message":
                          f"/cache/artifacts/{key} does not match spyre_artifact_manifest.json "
                          "(1 of 9 files): truncated or resized: g0.bin; precompile again"})
    crashing = _spec(2048)
    crashing["serving"] = {"podAnnotations": {"kwok.spyre.dev/crashloop": "true",
                                              "kwok.spyre.dev/termination-message": message}}
    kube.apply_model("c", crashing)
    degraded = kube.wait_condition("c", "Degraded", "True", reason="ArtifactCorrupt", timeout=90)
    assert "truncated or resized: g0.bin" in degraded["message"]
    assert [j["metadata"]["labels"][f"{GROUP}/artifact"] for j in jobs(kube)] == [key[:12]]

    kube.kubectl("delete", "jobs", "--all", "--wait=true")
    new = kube.wait(lambda: jobs(kube), 60, "a new precompile Job for the refused artifact")
    assert [j["metadata"]["labels"][f"{GROUP}/artifact"] for j in new] == [key[:12]]
    st = kube.model("c")["status"]
    assert st["artifact"]["key"] == key
