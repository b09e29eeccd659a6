"""``spyre-engine precompile``: catalog entry, termination summary, idempotence, concurrency."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from spyre_engine import answers, catalog, manifest
from spyre_engine.precompile import record_references_on, reference_backend
from spyre_engine.settings import PrecompileSettings
from spyre_engine.summary import FailureSummary, PrecompileSummary, parse_termination_message
from spyre_engine.testing.process import EngineProcess, engine_command

from .conftest import SHAPE, STARTUP_TIMEOUT, precompile_eager

pytestmark = pytest.mark.engine


def test_precompile_writes_entry_and_summary(tiny_model: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    summary = precompile_eager(tiny_model, art, "--artifact-key", "k-123",
                               "--reference-answers", "record")
    parsed = parse_termination_message(json.dumps(summary))
    assert isinstance(parsed, PrecompileSummary)
    assert parsed.key == "k-123" and parsed.path == str(art.resolve())
    assert parsed.compile_seconds >= 0 and parsed.size_bytes > 0
    assert parsed.versions.sendnn_inference == "2.6.3"
    assert parsed.versions.vllm and parsed.versions.torch
    # the Spyre compiler stack: none on this CPU machine, recorded as absent
    assert parsed.versions.torch_sendnn is None and parsed.versions.deeptools is None
    assert {"torch_sendnn", "deeptools"} <= set(summary["versions"])
    entries = catalog.read_catalog(art)
    assert entries == [
        {
            "sendnn_inference_version": "2.6.3",
            "dynamo_backend": "eager",
            "compiler_stack": {"torch_sendnn": None, "deeptools": None},
            "data": {
                "MODEL_NAME": str(tiny_model),
                "NUM_AIUS": 1,
                "VLLM_DT_MAX_CONTEXT_LEN": 512,
                "VLLM_DT_MAX_BATCH_SIZE": 4,
                "VLLM_DT_CHUNK_LEN": 128,
                "VLLM_DT_MAX_BATCH_TKV_LIMIT": 512 * 4,
            },
        }
    ]
    # Issue 44, 6: eager records reference answers too (on a vLLM started for them), with a
    # prompt past the shape's 128-token chunk and one repeating its prefix, from these files.
    refs, ref_doc = answers.read(art) or ([], {})
    ids = {a.prompt_id: a.prompt_token_ids for a in refs}
    assert len(ids["long"]) > 128 and ids["prefix"][:128] == ids["long"][:128], ids.keys()
    assert len(refs) == len(answers.DEFAULT_PROMPTS) + 2
    assert all(len(a.token_ids) == len(a.logprobs) > 0 for a in refs), refs
    assert ref_doc["source"] == "eager" and ref_doc["recordedWith"]["backend"] == "eager"
    assert ref_doc["weights"] == answers.weights_fingerprint(tiny_model)
    assert parsed.references is not None and parsed.references["prompts"] == len(refs)
    # The manifest is written last, and serve's check passes on what precompile left.
    assert manifest.verify(art)["format"] == 1
    # Re-running is idempotent: same single entry.
    precompile_eager(tiny_model, art, "--artifact-key", "k-123")
    assert catalog.read_catalog(art) == entries
    manifest.verify(art)


def test_concurrent_precompiles_keep_every_entry(tiny_model: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    procs = []
    for seqs in range(1, 9):
        args = ["precompile", "--model", str(tiny_model), "--artifact-dir", str(art)]
        args += ["--backend", "eager", "--max-model-len", "512", "--max-num-seqs", str(seqs),
                 "--reference-answers", "off"]  # the catalog's concurrency, not 8 vLLMs
        args += ["--termination-log", str(tmp_path / f"term-{seqs}")]
        procs.append(
            subprocess.Popen(
                engine_command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * 8
    entries = catalog.read_catalog(art)
    assert sorted(e["data"]["VLLM_DT_MAX_BATCH_SIZE"] for e in entries) == list(range(1, 9))
    assert not list(art.glob(".catalog-*.tmp"))


@pytest.mark.parametrize(("backend", "recorded_on"), [
    ("sendnn", "sendnn"), ("inductor", "eager"), ("sendnn_compile_only", "eager"),
    ("eager", "eager")])  # fmt: skip
def test_each_backend_records_its_references_on(backend: str, recorded_on: str | None,
                                                tmp_path: Path) -> None:
    """The CPU compile backends (the cards' graphs built on a CPU node, inductor) get references
    from eager on that node, not from the compiler under check; eager's own (issue 44, 6: it
    compiles nothing, but weights changed under its key were served unchecked). Decoders only,
    and never when off."""
    s = PrecompileSettings(model="m", artifact_dir=tmp_path, backend=backend)
    assert reference_backend(s) == recorded_on
    assert reference_backend(s.model_copy(update={"reference_answers": "off"})) is None
    assert reference_backend(s.model_copy(update={"task": "embed"})) is None


@pytest.mark.slow
def test_a_compile_only_artifact_gets_references_from_a_second_eager_vllm(
    tiny_model: Path, tmp_path: Path,
) -> None:
    """sendnn_compile_only runs no model, so its precompile answers the prompts on a second,
    eager vLLM of the same shape (a real one here; the compile itself needs torch_sendnn). It
    writes nothing into the artifact. (That a compiled backend's answers pass against eager's:
    the real node's inductor pods, tests/realpods/test_output_check.py; an inductor compile
    here as well cost the local session ~3 minutes, issue 43.)"""
    art = tmp_path / "art"
    art.mkdir()
    settings = PrecompileSettings(model=str(tiny_model), artifact_dir=art,
                                  backend="sendnn_compile_only", max_model_len=512,
                                  max_num_seqs=4, max_num_batched_tokens=128)  # fmt: skip
    doc = record_references_on(settings, str(tiny_model), "eager")
    assert doc["source"] == "eager" and doc["recordedWith"]["backend"] == "eager", doc
    assert sorted(p.name for p in art.iterdir()) == [], "the eager run wrote into the artifact"
    answers.write(tmp_path, doc)
    eager, _ = answers.read(tmp_path) or ([], {})
    assert len(eager) == len(answers.DEFAULT_PROMPTS) + 2
    assert all(len(a.token_ids) == len(a.logprobs) > 0 for a in eager), eager


def _post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    return _post_raw(url, json.dumps(body).encode())


def _post_raw(url: str, data: bytes) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.slow
def test_an_engine_answering_as_its_artifacts_reference_serves_and_one_that_does_not_stops(
    tiny_model: Path, start_engine: Callable[..., EngineProcess], tmp_path: Path,
) -> None:
    """Issue 30, on the engine: the artifact's own answers pass the check before Ready; the
    output check's key is refused to the public; reference answers the engine does not give
    (here: the recorded probabilities raised to 0.9) stop it with OutputMismatch, naming the
    first diverging prompt and position, before it ever turned Ready. An engine told the
    artifact passed before (the operator's SPYRE_ENGINE_OUTPUT_VERIFIED) on the very files the
    answers were recorded from asks nothing: it turns Ready on those same answers."""
    art = tmp_path / "art"  # eager (inductor's: the real node's output-check test)
    precompile_eager(tiny_model, art, "--reference-answers", "record")
    serve = ["--model", str(tiny_model), "--artifact-dir", str(art), "--backend", "eager",
             *SHAPE]
    engine = start_engine(*serve)
    engine.wait_started(STARTUP_TIMEOUT)
    assert "Output check passed" in engine.log_path.read_text(), engine.log_tail()
    refs, _ = answers.read(art) or ([], {})
    status, body = _post(f"{engine.url}/v1/completions", {
        **answers.request_body("tiny-granite", refs[0].prompt_token_ids, 2, refs[0], 0.08)})
    assert status == 400 and "reserved" in json.dumps(body), (status, body)
    # Issue 44: the key spelled with a JSON escape, carrying a token id no vocabulary has (the
    # injector raised on it inside vLLM's worker and the engine core died: 500, then 502), is
    # refused too; the engine answers the next request, and one whose prompt names the key.
    bad = json.dumps({"expected_token_ids": [2**40], "expected_logprobs": [0.0],
                      "error_threshold": 0.1})
    escaped = json.dumps({"model": "tiny-granite", "prompt": [1, 2, 3], "max_tokens": 2,
                          "vllm_xargs": {"@key@": bad}}).replace(
        '"@key@"', '"golden\\u005ftoken_injector"').encode()
    assert answers.INJECTOR_KEY in json.loads(escaped)["vllm_xargs"], escaped
    status, body = _post_raw(f"{engine.url}/v1/completions", escaped)
    assert status == 400 and "reserved" in json.dumps(body), (status, body)
    status, body = _post(f"{engine.url}/v1/completions", {
        "model": "tiny-granite", "prompt": f"what is {answers.INJECTOR_KEY}?", "max_tokens": 2})
    assert status == 200, (status, body, engine.log_tail())
    engine.kill()

    ref_file = art / answers.REFERENCE_FILENAME
    original = ref_file.read_text()
    doc = json.loads(original)
    for p in doc["prompts"]:
        p["logprobs"] = [math.log(0.9)] * len(p["logprobs"])
    try:
        answers.write(art, doc)
        manifest.write_manifest(art)
        term = tmp_path / "term"
        wrong = start_engine(*serve, "--termination-log", str(term))
        assert wrong.wait_exit(STARTUP_TIMEOUT) == 1, wrong.log_tail()
        failure = parse_termination_message(term.read_text())
        assert isinstance(failure, FailureSummary) and failure.reason == "OutputMismatch", (
            term.read_text())
        first = (failure.output_check or {}).get("firstMismatch")
        assert isinstance(first, dict) and first["prompt"] == 0 and first["position"] == 0, (
            failure)
        assert "position 0" in failure.message, failure.message
        restarted = start_engine(*serve, env={
            "SPYRE_ENGINE_OUTPUT_VERIFIED": "artifact x passed before"})
        restarted.wait_started(STARTUP_TIMEOUT)
        log = restarted.log_path.read_text()
        assert "Output check skipped: artifact x passed before" in log, restarted.log_tail()
        assert "Output check passed" not in log, restarted.log_tail()
        restarted.kill()
    finally:
        ref_file.write_text(original)
        manifest.write_manifest(art)


#: The tiny model answers near-uniformly (each token ~0.2%): no comparison of probabilities tells
#: one such model from another. Its final norm scaled by 30 makes it as sure of its tokens as a
#: trained model is; ``perturb`` then puts noise on every weight, in place: another model of the
#: same shape and file size.
_SHARPEN = r"""
import os, sys, torch
from safetensors.torch import load_file, save_file
path, perturb = sys.argv[1], sys.argv[2] == "perturb"
t = load_file(path)
if perturb:
    torch.manual_seed(7)
    t = {k: (v + torch.randn_like(v) * (v.float().std() + 0.05)).to(v.dtype)
         if v.is_floating_point() else v for k, v in t.items()}
else:
    t["model.norm.weight"] = t["model.norm.weight"] * 30
save_file(t, path + ".tmp")
os.replace(path + ".tmp", path)
"""


@pytest.mark.slow
def test_weights_changed_under_an_eager_artifact_are_caught(
    tiny_model: Path, start_engine: Callable[..., EngineProcess], tmp_path: Path,
) -> None:
    """Issue 44, 6: an eager artifact records reference answers of its own, and a pod told the
    artifact passed before skips its check only on the same bytes: weights rewritten in place
    under the same name, size and modification time (a copy that keeps them) are checked, and
    the pod stops with OutputMismatch (before, eager had no reference and the stat fingerprint
    saw nothing)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = model / "model.safetensors"
    subprocess.run([sys.executable, "-c", _SHARPEN, str(weights), "sharpen"], check=True)
    art = tmp_path / "art"
    precompile_eager(model, art, "--reference-answers", "record")
    refs, doc = answers.read(art) or ([], {})
    assert len(refs) == len(answers.DEFAULT_PROMPTS) + 2 and doc["source"] == "eager", doc
    verified = {"SPYRE_ENGINE_OUTPUT_VERIFIED": "artifact x passed before"}
    serve = ["--model", str(model), "--artifact-dir", str(art), "--backend", "eager", *SHAPE]

    # the same files: asked together (a batch, the long prompt, the prefix repeat), the sharp
    # model answers as it did one prompt at a time
    same = start_engine(*serve)
    same.wait_started(STARTUP_TIMEOUT)
    assert "Output check passed: 8 prompts" in same.log_path.read_text(), same.log_tail()
    same.kill()

    st = weights.stat()
    subprocess.run([sys.executable, "-c", _SHARPEN, str(weights), "perturb"], check=True)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size
    term = tmp_path / "term"
    changed = start_engine(*serve, "--termination-log", str(term), env=verified)
    assert changed.wait_exit(STARTUP_TIMEOUT) == 1, changed.log_tail()
    log = changed.log_path.read_text()
    assert "the model's files are not those its reference" in log, changed.log_tail()
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "OutputMismatch", (
        term.read_text())
