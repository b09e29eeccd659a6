"""The operator's pods really run the engine (issues 7 and 10).

The integration tests play every pod with kwok, so they prove what the operator *writes*. Here
the precompile Job and the serving Deployment the operator writes run on the local cluster's
real node (kubelet, containerd, kube-proxy) with the engine image: the Job really compiles into
the cache claim, the kubelet runs the real probes, a completion goes through the Service, and
what the pods report comes back through the operator into the SpyreModel's status.

The one thing that differs from production is the spec itself: the CPU backend ``eager``
instead of ``sendnn`` (no Spyre cards); what the operator writes for ``sendnn`` is checked at the
object level in ``test_units.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from spyre_engine import catalog, manifest
from spyre_engine.precompile import directory_size
from spyre_operator.decide import conditions as C
from spyre_operator.decide.summary import ArtifactSummary, parse_termination_message
from spyre_operator.desired import names

from tests.cluster.node import NODE_NAME
from tests.realpods import support

from .conftest import PARAMS, Served
from .realpods import (
    SERVED_NAME,
    RealEnv,
    artifact_host_dir,
    describe_pods,
    server_pods,
)

pytestmark = [pytest.mark.contract, pytest.mark.integration, pytest.mark.realpods,
              pytest.mark.timeout(1500)]  # fmt: skip


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = obj["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def _deployment(env: RealEnv, served: Served) -> dict[str, Any]:
    dep = env.kube.get("deployment", names.server_name(served.name))
    assert dep, "no Deployment"
    return dep  # type: ignore[no-any-return]


def _snapshot(path: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.relpath(os.path.join(root, f), path)] = (st.st_size, st.st_mtime_ns)
    return out


# --------------------------------------------------------------------------- precompile Job


@pytest.mark.parametrize("served", PARAMS, indirect=True)
def test_precompile_job_fills_the_artifact_and_the_operator_reads_its_summary(
    env: RealEnv, served: Served
) -> None:
    model = served.model
    art_status = model["status"]["artifact"]
    job_name = art_status["jobName"]
    job = env.kube.get("job", job_name)
    assert job, f"the precompile Job {job_name} is gone"
    pods = env.kube.items("pods", f"job-name={job_name}")
    assert len(pods) == 1, describe_pods(env.kube)
    pod = pods[0]
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["phase"] == "Succeeded"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0

    # The kubelet read the termination message the engine wrote; the operator's parser reads it.
    parsed = parse_termination_message(term.get("message"))
    assert isinstance(parsed, ArtifactSummary), term.get("message")
    assert parsed.key == art_status["key"]
    assert parsed.path == art_status["path"] == f"/cache/artifacts/{art_status['key']}"
    assert parsed.versions.get("vllm") and parsed.versions.get("sendnn_inference")
    # ... and the status is what the pod reported.
    assert art_status["phase"] == "Ready"
    assert art_status["compileSeconds"] == round(parsed.compile_seconds or 0.0, 3)
    assert art_status["sizeBytes"] == parsed.size_bytes
    assert "message" not in art_status, art_status
    ready = {c["type"]: c for c in model["status"]["conditions"]}[C.ARTIFACT_READY]
    assert ready["status"] == "True" and ready["reason"] == C.ARTIFACT_AVAILABLE

    # On the cache claim's volume: the artifact, its size as reported, only files and dirs.
    art = artifact_host_dir(env.cp, env.kube, model)
    assert art.is_dir(), f"no artifact at {art}"
    assert directory_size(art) == parsed.size_bytes
    special = [str(p) for p in art.rglob("*") if not (p.is_file() or p.is_dir()) or p.is_symlink()]
    assert not special, f"the artifact holds sockets, pipes or links: {special[:5]}"
    # The manifest the Job wrote last vouches for every file it left (issue 14).
    doc = manifest.verify(art)
    assert not manifest.compare(art, doc).unlisted

    # A catalog entry for exactly the shape the Deployment serves.
    entries = catalog.read_catalog(art)
    assert len(entries) == 1, entries
    args = _container(_deployment(env, served)["spec"]["template"])["args"]
    shape = {a.removeprefix("--"): b for a, b in zip(args, args[1:], strict=False)
             if a.startswith("--")}  # fmt: skip
    data = entries[0]["data"]
    assert data["NUM_AIUS"] == int(shape["tensor-parallel-size"])
    if "warmup-shapes" in shape:
        lens, sizes = zip(*(s.split("x") for s in shape["warmup-shapes"].split(",")), strict=True)
        assert data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == ",".join(lens)
        assert data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] == ",".join(sizes)
    else:
        assert data["VLLM_DT_MAX_CONTEXT_LEN"] == int(shape["max-model-len"])
        assert data["VLLM_DT_MAX_BATCH_SIZE"] == int(shape["max-num-seqs"])


# --------------------------------------------------------------------------- serving Deployment


@pytest.mark.parametrize("served", PARAMS, indirect=True)
def test_deployment_serves_from_the_read_only_artifact(env: RealEnv, served: Served) -> None:
    dep = _deployment(env, served)
    template = dep["spec"]["template"]
    container = _container(template)
    key = served.model["status"]["artifact"]["key"]
    art = artifact_host_dir(env.cp, env.kube, served.model)
    before = _snapshot(art)

    # The kubelet ran the startup, readiness and liveness probes on the named port: Ready.
    pods = server_pods(env.kube, served.name)
    assert len(pods) == 1, describe_pods(env.kube)
    pod = pods[0]
    assert pod["spec"]["nodeName"] == NODE_NAME
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["started"] and status["restartCount"] == 0, status
    port = next(p for p in container["ports"] if p["name"] == "http")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/cache")
    assert mount.get("readOnly") is True

    # A completion at status.endpoint (cluster DNS, kube-proxy), as a client in the cluster.
    url = support.service_url(env.cp, env.ns, served.name)
    pooling = served.model["spec"].get("task", "generate") != "generate"
    if pooling:
        r = env.client.run("once", f"{url}/v1/embeddings", json.dumps(
            {"model": SERVED_NAME, "input": "spyre accelerators serve large language models"}))
        assert r["status"] == 200, r
        vec = json.loads(r["body"])["data"][0]["embedding"]
        assert len(vec) > 0 and all(isinstance(x, float) for x in vec)
    else:
        r = env.client.complete(url, max_tokens=24)
        assert r["status"] == 200, r
        assert json.loads(r["body"])["usage"]["completion_tokens"] == 24
    assert served.model["status"]["endpoint"].endswith(f":{port['containerPort']}/v1")

    # It serves the operator's artifact, by key and directory.
    metrics = env.cp.kubectl(
        "exec", "-n", env.ns, pod["metadata"]["name"], "--", "python", "-c",
        "import urllib.request as u;"
        f"print(u.urlopen('http://127.0.0.1:{port['containerPort']}/metrics').read().decode())",
    ).stdout  # fmt: skip
    info = next(ln for ln in metrics.splitlines() if ln.startswith("spyre_engine_artifact_info{"))
    assert f'key="{key}"' in info and f'artifact_dir="/cache/artifacts/{key}"' in info, info

    # The plugin matched the engine's catalog entry and disabled compilation (a decoder).
    log = env.kube.kubectl("logs", pod["metadata"]["name"])
    assert "[PRECOMPILED_WARN] Provided vllm configuration doesn't match" not in log
    assert "but the pre-compiled model config has name" not in log
    if not pooling:
        assert "[PRECOMPILED_WARN] Setting DISABLE_COMPILATION" in log

    # The cache claim and the root filesystem are read-only in the pod, which runs as the uid
    # its namespace assigns (emulated restricted-v2: the operator pinned none).
    for path in ("/cache/artifacts/probe", "/probe"):
        res = env.cp.kubectl("exec", "-n", env.ns, pod["metadata"]["name"], "--",
                             "sh", "-c", f"id -u; touch {path}", check=False)  # fmt: skip
        assert res.returncode != 0 and "Read-only file system" in res.stderr, (path, res)
        assert res.stdout.strip() == str(support.scc_range_start(env.ns))
    assert _snapshot(art) == before, "serving changed the artifact"


# --------------------------------------------------------------------------- mismatch


def test_serving_refuses_an_artifact_of_another_shape_and_the_operator_says_why(
    env: RealEnv, served: Served
) -> None:
    """The last test of the module: it leaves the model crash-looping."""
    art = artifact_host_dir(env.cp, env.kube, served.model)
    path = catalog.catalog_path(art)
    original = json.loads(path.read_text())
    entries = json.loads(path.read_text())
    for e in entries:
        e["data"]["VLLM_DT_MAX_CONTEXT_LEN"] = int(e["data"]["VLLM_DT_MAX_CONTEXT_LEN"]) * 2
    path.write_text(json.dumps(entries))
    old = [p["metadata"]["name"] for p in server_pods(env.kube, served.name)]
    env.kube.kubectl("delete", "pod", *old, "--wait=false")

    # The replacement pod refuses to start; the kubelet keeps its termination message.
    def crashed() -> dict[str, Any] | None:
        for p in server_pods(env.kube, served.name):
            if p["metadata"]["name"] in old:
                continue
            for cs in p["status"].get("containerStatuses") or []:
                t = (cs.get("lastState") or {}).get("terminated") or (
                    cs.get("state") or {}).get("terminated")
                if t:
                    return t  # type: ignore[no-any-return]
        return None

    term = env.kube.wait(crashed, 300, "the replacement pod to crash")
    assert term["exitCode"] == 1, term
    assert "ArtifactMismatch" in term.get("message", ""), term
    assert "has no entry for" in term["message"]

    # The operator surfaces the engine's reason.
    degraded = env.kube.wait_condition(served.name, "Degraded", "True", C.ARTIFACT_MISMATCH, 120)
    assert "has no entry for" in degraded["message"]
    ready = env.kube.wait_condition(served.name, "Ready", "False", C.ARTIFACT_MISMATCH, 60)
    assert "has no entry for" in ready["message"]

    # The catalog restored but the manifest gone (a precompile that never finished, a copy
    # without it): the next pod refuses before loading, and the reason says so (issue 14).
    path.write_text(json.dumps(original))
    manifest.manifest_path(art).unlink()
    crashed_before = {p["metadata"]["name"] for p in server_pods(env.kube, served.name)}
    # a pod listed above may finish terminating before the delete (the first delete's)
    env.kube.kubectl("delete", "pod", *crashed_before, "--wait=false", "--ignore-not-found")
    degraded = env.kube.wait_condition(served.name, "Degraded", "True", C.ARTIFACT_CORRUPT, 300)
    assert "spyre_artifact_manifest.json is missing" in degraded["message"]
    ready = env.kube.wait_condition(served.name, "Ready", "False", C.ARTIFACT_CORRUPT, 60)
    assert "precompile" in ready["message"]
