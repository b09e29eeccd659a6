"""The operator's pods really run the engine (issue 7).

kwok plays the precompile and serving pods in the local control plane, so the integration tests
cannot tell whether the Job and Deployment the operator writes would start the engine. Here the
containers those objects describe — read back from the API server — run locally with the real
engine (see ``localpod.py`` for what stands in for what), and what they report goes back through
the operator's own parser and ``reconcile.decide()``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from spyre_engine import catalog
from spyre_engine.precompile import directory_size
from spyre_operator import conditions as C
from spyre_operator.controller import compact_pod
from spyre_operator.desired import names
from spyre_operator.reconcile import Observed, decide
from spyre_operator.summary import ArtifactSummary, EngineFailure, parse_termination_message

from .conftest import (
    CASES,
    SERVE_PARAMS,
    STARTUP_TIMEOUT,
    Host,
    JobRun,
    Reconciled,
)
from .localpod import ContainerProcess

pytestmark = [pytest.mark.contract, pytest.mark.integration]

REQUEST_TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def _terminated_pod(pod: dict[str, Any], exit_code: int, message: str) -> dict[str, Any]:
    """``pod`` as the kubelet reports it once its container ended with ``message``."""
    name = _container(pod)["name"]
    term = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "message": message,
        "finishedAt": _now(),
    }
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Running",
        "containerStatuses": [
            {"name": name, "ready": False, "restartCount": 0 if exit_code == 0 else 1}
            | ({"state": {"terminated": term}} if exit_code == 0 else
               {"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": term}})
        ],
    }  # fmt: skip
    return {**pod, "status": status}


def _cache_mount(pod: dict[str, Any]) -> str:
    claim_volumes = {
        v["name"]
        for v in pod["spec"]["volumes"]
        if v.get("persistentVolumeClaim", {}).get("claimName") == "spyre-compile-cache"
    }
    return next(
        m["mountPath"] for m in _container(pod)["volumeMounts"] if m["name"] in claim_volumes
    )


def _artifact_host_dir(host: Host, rec: Reconciled, pod: dict[str, Any]) -> Path:
    """The host dir of the artifact: the operator's status path, through the cache mount."""
    path = rec.model["status"]["artifact"]["path"]
    mount = _cache_mount(pod)
    assert path.startswith(mount + "/"), f"status.artifact.path {path} is outside {mount}"
    return host.claims["spyre-compile-cache"] / path[len(mount) + 1 :]


def _snapshot(path: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.relpath(os.path.join(root, f), path)] = (st.st_size, st.st_mtime_ns)
    return out


# --------------------------------------------------------------------------- precompile Job


@pytest.mark.parametrize("case", SERVE_PARAMS)
def test_precompile_job_fills_the_artifact_and_the_operator_reads_its_summary(
    case: str, host: Host, reconciled: dict[str, Reconciled], precompiled: Callable[[str], JobRun]
) -> None:
    rec, run = reconciled[case], precompiled(case)
    assert run.exit_code == 0, f"precompile exited {run.exit_code}:\n{run.log_tail}"
    pod = rec.job_template_pod()
    art = _artifact_host_dir(host, rec, pod)

    # The artifact holds a catalog entry for exactly the shape the Deployment will serve.
    entries = catalog.read_catalog(art)
    assert len(entries) == 1, entries
    serve_args = _container(rec.server_template_pod())["args"]
    shape = {
        a.removeprefix("--"): b
        for a, b in zip(serve_args, serve_args[1:], strict=False)
        if a.startswith("--")
    }
    data = entries[0]["data"]
    assert data["NUM_AIUS"] == int(shape["tensor-parallel-size"])
    if rec.case.pooling:
        lens, sizes = zip(*(s.split("x") for s in shape["warmup-shapes"].split(",")), strict=True)
        assert data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == ",".join(lens)
        assert data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] == ",".join(sizes)
    else:
        assert data["VLLM_DT_MAX_CONTEXT_LEN"] == int(shape["max-model-len"])
        assert data["VLLM_DT_MAX_BATCH_SIZE"] == int(shape["max-num-seqs"])

    # The termination message goes through the operator's own parser ...
    parsed = parse_termination_message(run.termination_message)
    assert isinstance(parsed, ArtifactSummary), run.termination_message
    assert parsed.key == rec.key
    # ... and the path the engine reports is the operator's artifact path inside the pod.
    assert Path(parsed.path or "").resolve() == art.resolve()
    assert parsed.size_bytes == directory_size(art)
    # Only files and directories: the artifact can be copied, archived, moved to another claim.
    special = [str(p) for p in art.rglob("*") if not (p.is_file() or p.is_dir()) or p.is_symlink()]
    assert not special, f"the artifact holds sockets, pipes or links: {special[:5]}"
    assert parsed.versions.get("vllm") and parsed.versions.get("sendnn_inference")

    # ... and through decide(), with the Job Complete and its pod terminated with that message.
    job_pod = compact_pod(_terminated_pod(rec.job_pod, 0, run.termination_message))
    d = decide(
        {**rec.model, "status": {}},
        Observed(cache_pvc=rec.cache_pvc, job=rec.job, job_pods=[job_pod]),
        _now(),
    )
    status = d.status["artifact"]
    assert status["phase"] == "Ready"
    assert status["key"] == rec.key
    assert status["path"] == rec.model["status"]["artifact"]["path"]
    assert status["compileSeconds"] == round(parsed.compile_seconds or 0.0, 3)
    assert status["sizeBytes"] == parsed.size_bytes
    assert "message" not in status, status  # no key disagreement reported
    ready = C.find(d.status["conditions"], C.ARTIFACT_READY)
    assert ready and ready["status"] == "True" and ready["reason"] == C.ARTIFACT_AVAILABLE


# --------------------------------------------------------------------------- serving Deployment


def _request(rec: Reconciled, proc: ContainerProcess) -> httpx.Response:
    """A completion, or an embedding for the pooling model, on the container's http port."""
    port = proc.ports[_port_name(rec)]
    model = _served_name(rec)
    if rec.case.pooling:
        return httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings",
            json={"model": model, "input": "spyre accelerators serve large language models"},
            timeout=REQUEST_TIMEOUT,
        )
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        json={"model": model, "prompt": "hello world", "max_tokens": 24, "ignore_eos": True},
        timeout=REQUEST_TIMEOUT,
    )


def _port_name(rec: Reconciled) -> str:
    """The name of the container port the Service targets."""
    ports = _container(rec.server_template_pod())["ports"]
    assert len(ports) == 1
    return str(ports[0]["name"])


def _served_name(rec: Reconciled) -> str:
    args = _container(rec.server_template_pod())["args"]
    return str(args[args.index("--served-name") + 1])


@pytest.mark.parametrize("case", SERVE_PARAMS)
def test_deployment_serves_from_the_artifact_and_drains_on_sigterm(
    case: str, host: Host, reconciled: dict[str, Reconciled], precompiled: Callable[[str], JobRun]
) -> None:
    rec = reconciled[case]
    assert precompiled(case).exit_code == 0, "the precompile Job failed; see its test"
    pod = rec.server_template_pod()
    container = _container(pod)
    art = _artifact_host_dir(host, rec, pod)
    before = _snapshot(host.claims["spyre-compile-cache"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == _cache_mount(pod))
    assert mount.get("readOnly") is True, "the serving pods must mount the cache read-only"

    proc = host.start(pod, container["name"], f"serve-{case}")
    try:
        # The kubelet: startup probe until it passes, then readiness and liveness.
        started = proc.wait_probe(container["startupProbe"], STARTUP_TIMEOUT)
        assert proc.wait_probe(container["readinessProbe"], 30) < 30
        assert 200 <= proc.http_get(container["livenessProbe"]) < 400

        resp = _request(rec, proc)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if rec.case.pooling:
            vec = body["data"][0]["embedding"]
            assert len(vec) > 0 and all(isinstance(x, float) for x in vec)
        else:
            assert body["usage"]["completion_tokens"] == 24

        # It serves the operator's artifact, by key, from the artifact dir (no compiling).
        port = proc.ports[_port_name(rec)]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=REQUEST_TIMEOUT).text
        info = next(
            ln for ln in metrics.splitlines() if ln.startswith("spyre_engine_artifact_info{")
        )
        assert f'key="{rec.key}"' in info and f'artifact_dir="{art}"' in info, info
        # The plugin itself found the engine's catalog entry for this vLLM configuration and
        # model (it only warns otherwise), and, for a decoder, disabled compilation.
        log = proc.log_path.read_text(errors="replace")
        assert "[PRECOMPILED_WARN] Provided vllm configuration doesn't match" not in log
        assert "but the pre-compiled model config has name" not in log
        if not rec.case.pooling:
            assert "[PRECOMPILED_WARN] Setting DISABLE_COMPILATION" in log
        if proc.argv[proc.argv.index("--backend") + 1] == "inductor":
            if getattr(proc, "read_only_enforced", True):
                _assert_inductor_compiled_nothing(proc, art)
            else:
                # Permissions-only mode (checkout under /tmp, see localpod): root can write the
                # "read-only" artifact, so the engine serves from it in place rather than from
                # its private copy, and this run cannot prove the read-only guarantee.
                print(f"{case}: read-only cache not enforced here; compile check not proven")

        # SIGTERM with a request in flight: readiness fails at once, the request completes,
        # the container exits 0 well within terminationGracePeriodSeconds.
        grace = int(pod["spec"]["terminationGracePeriodSeconds"])
        in_flight: dict[str, Any] = {}

        def call() -> None:
            try:
                in_flight["status"] = _request(rec, proc).status_code
            except httpx.HTTPError as exc:
                in_flight["error"] = repr(exc)

        t = threading.Thread(target=call, daemon=True)
        t.start()
        time.sleep(0.3)
        signalled = proc.sigterm()
        time.sleep(0.5)
        if proc.proc.poll() is None:
            ready = proc.http_get(container["readinessProbe"])
            if ready != 503:
                # Refused (0) only because the drain already finished and the server is on its
                # way out (a short request can complete within the 0.5 s above).
                assert ready == 0, f"readiness answered {ready} while draining"
        code = proc.wait_exit(grace)
        took = time.monotonic() - signalled
        assert code == 0, f"exit {code} after SIGTERM ({took:.1f}s):\n{proc.log_tail()}"
        assert took < grace, f"took {took:.1f}s, grace period {grace}s"
        t.join(30)
        assert in_flight.get("status") == 200, in_flight
        deadline = time.monotonic() + 10
        while proc.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not proc.group_alive(), "processes of the engine survived its exit"
        print(f"{case}: started in {started:.1f}s, drained in {took:.1f}s (grace {grace}s)")
    finally:
        proc.kill()
    # Serving never wrote to the cache claim (it is mounted read-only; nothing changed anyway).
    assert _snapshot(host.claims["spyre-compile-cache"]) == before


def _files(path: Path, skip: tuple[str, ...] = ("locks",)) -> set[str]:
    out: set[str] = set()
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        out.update(os.path.relpath(os.path.join(root, f), path) for f in files)
    return out


def _special_files(directory: str, entries: list[str]) -> list[str]:
    """Entries of ``directory`` that are neither regular files nor directories (sockets)."""
    base = Path(directory)
    return [e for e in entries if not ((base / e).is_file() or (base / e).is_dir())]


def _assert_inductor_compiled_nothing(proc: ContainerProcess, art: Path) -> None:
    """Serve ran inductor on a private copy of the read-only artifact's cache (in the pod's
    /tmp); a cache miss would have added graphs or kernels to that copy."""
    assert proc.local is not None
    tmp = Path(proc.local.host_path("/tmp") or "/tmp")
    copies = sorted(tmp.glob("spyre-engine-inductor-*/inductor"), key=lambda p: p.stat().st_mtime)
    if not copies:  # no mount namespace: the engine's /tmp was the host's
        copies = sorted(
            Path("/tmp").glob("spyre-engine-inductor-*/inductor"), key=lambda p: p.stat().st_mtime
        )
    assert copies, f"no private inductor cache under {tmp}"
    added = _files(copies[-1]) - _files(art / "inductor")
    assert not added, f"serve compiled at start-up: {sorted(added)[:10]}"


# --------------------------------------------------------------------------- mismatch


def test_serving_refuses_an_artifact_of_another_shape_and_the_operator_says_why(
    host: Host,
    reconciled: dict[str, Reconciled],
    precompiled: Callable[[str], JobRun],
    tmp_path: Path,
) -> None:
    rec = reconciled[CASES[0].name]
    assert precompiled(rec.case.name).exit_code == 0
    pod = rec.server_template_pod()
    container = _container(pod)

    # A copy of the cache claim whose catalog says the artifact was compiled for another length.
    cache = Path(host.root) / "c2"
    # (Only files and directories: a stray Unix socket would make copytree fail.)
    shutil.copytree(host.claims["spyre-compile-cache"], cache, ignore=_special_files)
    art = cache / rec.model["status"]["artifact"]["path"][len(_cache_mount(pod)) + 1 :]
    path = catalog.catalog_path(art)
    entries = json.loads(path.read_text())
    for e in entries:
        e["data"]["VLLM_DT_MAX_CONTEXT_LEN"] = int(e["data"]["VLLM_DT_MAX_CONTEXT_LEN"]) * 2
    path.write_text(json.dumps(entries))

    claims = {**host.claims, "spyre-compile-cache": cache}
    proc = host.start(pod, container["name"], "serve-mismatch", claims=claims)
    try:
        code = proc.wait_exit(60)
    finally:
        proc.kill()
    assert code == 1, f"exit {code}:\n{proc.log_tail()}"
    message = proc.termination_message()
    parsed = parse_termination_message(message)
    assert isinstance(parsed, EngineFailure), message
    assert parsed.reason == "ArtifactMismatch"
    assert "has no entry for" in parsed.message

    # The operator surfaces it: the crashed pod, through compact_pod and decide().
    server_pod = compact_pod(_terminated_pod(rec.server_pod, code, message))
    deployment = {
        **rec.deployment,
        "status": {
            **rec.deployment.get("status", {}),
            "readyReplicas": 0,
            "availableReplicas": 0,
            "unavailableReplicas": rec.deployment["spec"]["replicas"],
        },
    }
    job_pod = compact_pod(
        _terminated_pod(rec.job_pod, 0, precompiled(rec.case.name).termination_message)
    )
    d = decide(
        rec.model,
        Observed(
            cache_pvc=rec.cache_pvc,
            job=rec.job,
            job_pods=[job_pod],
            deployment=deployment,
            server_pods=[server_pod],
        ),
        _now(),
    )
    degraded = C.find(d.status["conditions"], C.DEGRADED)
    assert degraded and degraded["status"] == "True", d.status["conditions"]
    assert degraded["reason"] == C.ENGINE_FAILED
    assert "ArtifactMismatch" in degraded["message"]
    assert parsed.message[:200] in degraded["message"]
    ready = C.find(d.status["conditions"], C.READY)
    assert ready and ready["status"] == "False" and ready["reason"] == C.ENGINE_FAILED
    assert server_pod["artifact"] == names.short_key(rec.key)
