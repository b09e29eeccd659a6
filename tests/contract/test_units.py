"""Unit checks behind the contract (no cluster, no vLLM): the engine on a read-only artifact."""

from __future__ import annotations

import collections
import os
import tempfile
from pathlib import Path

import pytest
from spyre_engine.launch import Child, inductor_dirs, plugin_env
from spyre_engine.precompile import remove_dead_sockets
from spyre_engine.settings import ServeSettings


def test_serve_uses_a_private_inductor_cache_when_the_artifact_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = tmp_path / "art"
    (art / "inductor" / "ab").mkdir(parents=True)
    (art / "inductor" / "ab" / "graph.py").write_text("x = 1\n")
    # Writable: serve (and precompile) use the artifact's own dirs.
    assert inductor_dirs(art, serving=True) == (art / "inductor", art / "tmp")
    # Read-only (as mounted in the serving pods; root ignores modes, so fake access(2)).
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if Path(p) == art and m == os.W_OK else real_access(p, m)
    )
    (tmp_path / "podtmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "podtmp"))  # the pod's /tmp
    settings = ServeSettings.model_validate(
        {"model": "/m", "artifact_dir": art, "backend": "inductor"}
    )
    env = plugin_env(settings, require_precompiled=True, base={})
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert cache.is_relative_to(tmp_path / "podtmp")
    assert (cache / "ab" / "graph.py").read_text() == "x = 1\n"
    assert Path(env["TMPDIR"]).is_dir() and Path(env["TMPDIR"]).is_relative_to(tmp_path / "podtmp")
    # Precompile always writes into the artifact.
    assert inductor_dirs(art, serving=False) == (art / "inductor", art / "tmp")


def test_engine_failure_names_the_engine_cores_exception_not_vllms_wrapper() -> None:
    # What `vllm serve` printed when the serving pod could not write its read-only cache.
    child = Child.__new__(Child)
    child.tail = collections.deque(
        [
            "(EngineCore pid=9)     raise InductorError(e, currentframe()).with_traceback(",
            "(EngineCore pid=9) torch._inductor.exc.InductorError: OSError: [Errno 30] "
            "Read-only file system: '/cache/artifacts/k/inductor/locks/x.lock'",
            "(APIServer pid=8)     raise RuntimeError(",
            "(APIServer pid=8) RuntimeError: Engine core initialization failed. "
            "See root cause above. Failed core proc(s): {}",
        ]
    )
    assert "Read-only file system" in child.last_error()


def test_precompile_removes_the_dead_sockets_vllm_left_in_the_artifact(tmp_path: Path) -> None:
    import socket

    (tmp_path / "graph.bin").write_bytes(b"x")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "ipc-1"))
    assert remove_dead_sockets(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["graph.bin"]


# --------------------------------------------------------------------------- sendnn vs. here


def _pod_dict(pod_spec: object, key: str) -> dict[str, object]:
    """A built pod spec as a plain dict, with the artifact key (and its short form) masked."""
    import json

    from spyre_operator.desired import names

    text = json.dumps(pod_spec.to_dict())  # type: ignore[attr-defined]
    text = text.replace(key, "<key>").replace(names.short_key(key), "<short-key>")
    return json.loads(text)  # type: ignore[no-any-return]


def _flat(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            name = v.get("name") if isinstance(v, dict) and "name" in v else i
            out.update(_flat(v, f"{prefix}[{name}]"))
        return out
    return {prefix: obj}


def test_the_sendnn_pods_differ_from_the_pods_run_here_only_in_backend_and_cards() -> None:
    """The real-pod tests run the CPU backend; for ``sendnn`` the operator writes the same Job
    and serving pod but for the backend flag and env, the Spyre card requests, ``FLEX_DEVICE``
    (VF for ``ibm.com/spyre_vf``, on pods with cards only) and the Spyre scheduler (compile off
    the cards: the Job gets no cards)."""
    from spyre_operator.decide import Observed, decide

    from tests.cluster.node import NODE_SELECTOR, NODE_TOLERATION
    from tests.unit.samples import model
    from tests.unit.test_reconcile import NOW
    from tests.unit.test_reconcile_correctness import bound
    from tests.unit.test_spyre_stack import built

    from .realpods import model_spec

    def pods(backend: str) -> tuple[dict[str, object], dict[str, object]]:
        spec = model_spec("localhost/spyre-engine:test")
        spec["compile"] = {**spec["compile"], "backend": backend}
        key = decide(model("m", spec), Observed(cache_pvc=bound()), NOW).status["artifact"]["key"]
        job, dep = built(spec)
        return _flat(_pod_dict(job, key)), _flat(_pod_dict(dep, key))

    (cpu_job, cpu_dep), (card_job, card_dep) = pods("eager"), pods("sendnn")
    c = "containers[engine]"

    def diff(a: dict[str, object], b: dict[str, object]) -> dict[str, tuple[object, object]]:
        return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}

    job_diff = diff(cpu_job, card_job)
    j = "containers[precompile]"
    assert {k for k in job_diff if not k.startswith(f"{j}.args[")} == {
        f"{j}.env[SENDNN_INFERENCE_DYNAMO_BACKEND].value"
    }, job_diff
    assert sorted(str(v) for _, v in job_diff.values()) == sorted(
        ["sendnn_compile_only", "sendnn_compile_only"]
    ), job_diff
    dep_diff = diff(cpu_dep, card_dep)
    assert {k for k in dep_diff if not k.startswith(f"{c}.args[")} == {
        f"{c}.env[SENDNN_INFERENCE_DYNAMO_BACKEND].value",
        f"{c}.env[FLEX_DEVICE].name",
        f"{c}.env[FLEX_DEVICE].value",
        f"{c}.resources.limits.ibm.com/spyre_vf",
        f"{c}.resources.requests.ibm.com/spyre_vf",
        "schedulerName",
    }, dep_diff
    assert card_dep["schedulerName"] == "spyre-scheduler"
    assert card_dep[f"{c}.resources.limits.ibm.com/spyre_vf"] == "1"
    assert card_dep[f"{c}.env[FLEX_DEVICE].value"] == "VF"
    assert sorted(str(v) for _, v in dep_diff.values()) == sorted(
        ["sendnn", "sendnn", "1", "1", "spyre-scheduler", "FLEX_DEVICE", "VF"]
    ), dep_diff
    # Both run on the real node's selector and toleration (the Job off the cards there too).
    for flat in (cpu_job, cpu_dep, card_job, card_dep):
        assert flat["nodeSelector.spyre.dev/real-node"] == NODE_SELECTOR["spyre.dev/real-node"]
        assert flat["tolerations[0].key"] == NODE_TOLERATION["key"]
