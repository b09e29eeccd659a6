"""What the engine derives from its flags beats inherited env; which backends serve what.

Pure (no vLLM): part of ``make test-unit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from spyre_engine.launch import plugin_env, vllm_command
from spyre_engine.settings import PrecompileSettings, ServeSettings
from spyre_engine.summary import FailureSummary, parse_termination_message

# What engine/Containerfile bakes in (and what a hand-written Deployment may add).
BAKED = {
    "SENDNN_INFERENCE_DYNAMO_BACKEND": "sendnn",
    "TORCH_SENDNN_CACHE_ENABLE": "0",
    "MASTER_PORT": "29500",
    "SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS": "0",
}


def _serve(tmp_path: Path, **kw: object) -> ServeSettings:
    return ServeSettings.model_validate({"model": "/m", "artifact_dir": tmp_path, **kw})


def _pre(tmp_path: Path, **kw: object) -> PrecompileSettings:
    return PrecompileSettings.model_validate({"model": "/m", "artifact_dir": tmp_path, **kw})


@pytest.mark.parametrize("backend", ["inductor", "eager", "sendnn"])
def test_backend_flag_beats_inherited_backend(tmp_path: Path, backend: str) -> None:
    inherited = {**BAKED, "SENDNN_INFERENCE_DYNAMO_BACKEND": "sendnn_compile_only"}
    env = plugin_env(_serve(tmp_path, backend=backend), require_precompiled=True, base=inherited)
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == backend
    env = plugin_env(_pre(tmp_path, backend=backend), require_precompiled=False, base=inherited)
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == backend


def test_precompile_forces_the_sendnn_cache_on(tmp_path: Path) -> None:
    env = plugin_env(_pre(tmp_path), require_precompiled=False, base=BAKED)
    assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"
    assert env["TORCH_SENDNN_CACHE_DIR"] == str(tmp_path.resolve())
    env = plugin_env(_serve(tmp_path), require_precompiled=True, base=BAKED)
    assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"


def test_free_master_port_beats_a_baked_one(tmp_path: Path) -> None:
    ports = {
        plugin_env(_serve(tmp_path), require_precompiled=True, base=BAKED)["MASTER_PORT"]
        for _ in range(3)
    }
    assert "29500" not in ports
    assert all(p.isdigit() and 0 < int(p) < 65536 for p in ports)


def test_serve_requires_precompiled_and_disables_compilation_for_decoders(
    tmp_path: Path,
) -> None:
    # Decoders: the plugin itself sets DISABLE_COMPILATION when REQUIRE_PRECOMPILED_DECODERS=1,
    # and so does the engine. Pooling models: upstream's precompiled mode does not support
    # them and the plugin returns early (compilation_utils.py); they are not forced into it,
    # not even by an inherited value (tests/engine/test_catalog_plugin.py runs the plugin).
    for task, shapes in (("generate", None), ("embed", "64x4")):
        kw: dict[str, object] = {"task": task, "backend": "sendnn"}
        if shapes:
            kw["warmup_shapes"] = shapes
        inherited = {**BAKED, "DISABLE_COMPILATION": "true"}
        env = plugin_env(_serve(tmp_path, **kw), require_precompiled=True, base=inherited)
        assert env["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] == "1"
        assert env.get("DISABLE_COMPILATION") == (None if shapes else "true")
        # either way the graphs come from the artifact's torch_sendnn cache
        assert env["TORCH_SENDNN_CACHE_ENABLE"] == "1"
        assert env["TORCH_SENDNN_CACHE_DIR"] == str(tmp_path.resolve())
        pre = plugin_env(
            _pre(tmp_path, **kw),
            require_precompiled=False,
            base={**BAKED, "DISABLE_COMPILATION": "true"},
        )
        assert "DISABLE_COMPILATION" not in pre
        assert pre["SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS"] == "0"


def test_serve_refuses_the_compile_only_backend() -> None:
    with pytest.raises(ValidationError) as info:
        ServeSettings.model_validate(
            {"model": "/m", "artifact_dir": "/a", "backend": "sendnn_compile_only"}
        )
    text = str(info.value)
    assert "sendnn_compile_only" in text and "--backend sendnn" in text
    # Precompile accepts it: that is what it is for.
    assert (
        PrecompileSettings.model_validate(
            {"model": "/m", "artifact_dir": "/a", "backend": "sendnn_compile_only"}
        ).backend
        == "sendnn_compile_only"
    )


def test_serve_cli_refuses_the_compile_only_backend_with_a_reason(tmp_path: Path) -> None:
    term = tmp_path / "term"
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "serve", "--model", "/m"]
        + ["--artifact-dir", str(tmp_path), "--backend", "sendnn_compile_only"]
        + ["--termination-log", str(term)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "InvalidSettings"
    assert "sendnn_compile_only" in failure.message and "only compiles" in failure.message


def test_vllm_gets_time_to_shut_down(tmp_path: Path) -> None:
    """vLLM's shutdown(procs, timeout=0) SIGKILLs the engine core and TP workers at once."""
    for settings in (_serve(tmp_path), _pre(tmp_path)):
        cmd = vllm_command(settings, "/m", host="127.0.0.1", port=9)
        timeout = int(cmd[cmd.index("--shutdown-timeout") + 1])
        assert timeout >= 2


# ---------------------------------------------------------------- compile-only artifacts


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "granite"}')
    return model


def test_a_compile_only_artifact_is_served_by_sendnn_only(tmp_path: Path) -> None:
    from spyre_engine import catalog
    from spyre_engine.cli import ArtifactMismatch, select_entry

    model = _model(tmp_path)
    art = tmp_path / "art"
    shape = {"max_model_len": 4096, "max_num_seqs": 4, "max_num_batched_tokens": 1024}
    pre = _pre(art, backend="sendnn_compile_only", require_known_config=False, **shape)
    env = plugin_env(pre, require_precompiled=False, base=BAKED)
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == "sendnn_compile_only"
    entry = catalog.make_entry(pre, str(model), "2.6.3", {"model_type": "granite"}, env)
    assert entry["dynamo_backend"] == "sendnn_compile_only"
    catalog.add_entry(art, entry)
    entries = catalog.read_catalog(art)
    # The Deployment's server (same shape, --backend sendnn) finds it...
    assert select_entry(_serve(art, **shape), entries, str(model)) == entry
    # ...an inductor server does not (no inductor graphs in a sendnn artifact)...
    with pytest.raises(ArtifactMismatch, match="sendnn_compile_only, which --backend inductor"):
        select_entry(_serve(art, backend="inductor", **shape), entries, str(model))
    # ...and another chunk is another artifact (torch_sendnn would refuse it at warmup).
    with pytest.raises(ArtifactMismatch, match="chunk=512"):
        other = {**shape, "max_num_batched_tokens": None}
        select_entry(_serve(art, **other), entries, str(model))


def test_an_artifact_of_another_compiler_stack_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_sendnn loads only graphs its own stack compiled: a base image upgraded under the
    same image reference (same artifact key) must fail with ArtifactMismatch, not load them."""
    from spyre_engine import catalog
    from spyre_engine.cli import ArtifactMismatch, select_entry

    model = _model(tmp_path)
    art = tmp_path / "art"
    shape = {"max_model_len": 4096, "max_num_seqs": 4, "max_num_batched_tokens": 1024}
    pre = _pre(art, backend="sendnn_compile_only", require_known_config=False, **shape)
    # What this (CPU) machine has: no Spyre stack, recorded as absent.
    assert catalog.make_entry(pre, str(model), "2.6.3")["compiler_stack"] == {
        "torch_sendnn": None,
        "deeptools": None,
    }
    built = {"torch_sendnn": "1.2.0", "deeptools": "5.1.0"}
    entry = catalog.make_entry(pre, str(model), "2.6.3", {"model_type": "granite"}, stack=built)
    catalog.add_entry(art, entry)
    entries = catalog.read_catalog(art)
    monkeypatch.setattr(catalog, "compiler_stack", lambda: dict(built))
    assert select_entry(_serve(art, **shape), entries, str(model)) == entry
    monkeypatch.setattr(catalog, "compiler_stack", lambda: {**built, "torch_sendnn": "1.3.0"})
    with pytest.raises(ArtifactMismatch, match=r"torch_sendnn 1\.2\.0 \(running 1\.3\.0\)"):
        select_entry(_serve(art, **shape), entries, str(model))
    # A stack recorded as absent is a stack too (compiled where torch_sendnn was missing).
    assert catalog.stack_mismatch({**entry, "compiler_stack": {}}, built) is not None
    # Entries without a record (older, hand-written) and CPU backends' entries are not checked.
    assert catalog.stack_mismatch({k: v for k, v in entry.items() if k != "compiler_stack"},
                                  built) is None  # fmt: skip
    assert catalog.stack_mismatch({**entry, "dynamo_backend": "inductor"}, {}) is None


FP8_CONFIG = {
    "model_type": "granite",
    "quantization_config": {"quant_method": "fp8", "format": "float-quantized"},
}


def test_a_quantized_model_is_not_compiled_off_the_cards(tmp_path: Path) -> None:
    """Upstream: sendnn_compile_only does not work for quantized (FP8) models. Refused before
    vLLM starts with UnsupportedConfiguration, which the operator shows in status; the message
    says what to do."""
    model = tmp_path / "fp8"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(FP8_CONFIG))
    term = tmp_path / "term"
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", str(model)]
        + ["--artifact-dir", str(tmp_path / "art"), "--backend", "sendnn_compile_only"]
        + ["--no-require-known-config", "--termination-log", str(term)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    failure = parse_termination_message(term.read_text())
    assert proc.returncode == 1 and isinstance(failure, FailureSummary), proc.stderr[-2000:]
    assert failure.reason == "UnsupportedConfiguration"
    assert "quantized (fp8)" in failure.message
    assert "precompile.onCards: true" in failure.message
    assert "Starting vLLM" not in proc.stderr + proc.stdout


def test_quantized_models_compile_on_the_cards_and_others_anywhere(tmp_path: Path) -> None:
    from spyre_engine.precompile import check_compile_only, quantization

    assert quantization(FP8_CONFIG) == "fp8"
    assert quantization({"text_config": FP8_CONFIG}) == "fp8"  # multimodal: the text model's
    assert quantization({"model_type": "granite"}) is None
    check_compile_only(_pre(tmp_path, backend="sendnn"), FP8_CONFIG)  # on the cards: fine
    check_compile_only(_pre(tmp_path, backend="sendnn_compile_only"), {"model_type": "granite"})


def test_the_catalog_compares_types_and_accepts_the_empty_dict(tmp_path: Path) -> None:
    from spyre_engine import catalog

    (tmp_path / catalog.CATALOG_FILENAME).write_text("{}")
    assert catalog.read_catalog(tmp_path) == []
    s = _serve(tmp_path, max_model_len=512)
    entry = catalog.make_entry(s, "/m", "2.6.3")
    assert catalog.add_entry(tmp_path, entry) is True
    assert catalog.read_catalog(tmp_path) == [entry]
    wanted = catalog.entry_data(s, "/m")
    stringly = {**entry, "data": {**entry["data"], "NUM_AIUS": "1"}}
    assert catalog.find_entry([stringly], wanted) is None
    # Keys only torch_sendnn reads may be missing (hand-written or upstream catalogs)...
    upstream = {
        "sendnn_inference_version": "2.6.3",
        "data": {k: v for k, v in entry["data"].items() if k not in catalog.OPTIONAL_KEYS},
    }
    assert catalog.find_entry([upstream], wanted) == upstream
    # ...but when present they must agree.
    chunked = {**entry, "data": {**entry["data"], "VLLM_DT_CHUNK_LEN": 1024}}
    assert catalog.find_entry([chunked], wanted) is None


def test_sendnn_caps_unknown_configurations_in_the_entry(tmp_path: Path) -> None:
    from spyre_engine import catalog

    s = _serve(tmp_path, max_model_len=65536, max_num_seqs=64)
    data = catalog.entry_data(s, "/m", {"model_type": "granite"}, env={})
    assert (data["VLLM_DT_MAX_CONTEXT_LEN"], data["VLLM_DT_MAX_BATCH_SIZE"]) == (32768, 32)
    assert data["VLLM_DT_MAX_BATCH_TKV_LIMIT"] == 131072
    cpu = _serve(tmp_path, max_model_len=65536, max_num_seqs=64, backend="inductor")
    data = catalog.entry_data(cpu, "/m", {"model_type": "granite"}, env={})
    assert (data["VLLM_DT_MAX_CONTEXT_LEN"], data["VLLM_DT_MAX_BATCH_SIZE"]) == (65536, 64)
    pooling = _serve(tmp_path, task="embed", warmup_shapes="64x4,128x2", max_model_len=1024)
    data = catalog.entry_data(pooling, "/m", {}, env={})
    assert data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == "64,128"
    assert "VLLM_DT_CHUNK_LEN" not in data


# ---------------------------------------------------------------- known configurations

SITE_MODELS = {
    "org/decoder": {
        "architecture": {"model_type": "granite", "hidden_size": 4096},
        "continuous_batching_configs": [
            {"tp_size": 1, "max_model_len": 8192, "max_num_seqs": 4},
            {"tp_size": 4, "max_model_len": 32768, "max_num_seqs": 32},
            {
                "tp_size": 4,
                "max_model_len": 16384,
                "max_num_seqs": 4,
                "device_config": {"env_vars": {"VLLM_DT_MAX_BATCH_TKV_LIMIT": 65536}},
            },
        ],
    },
    "org/decoder-fp8": {
        "architecture": {
            "model_type": "granite",
            "hidden_size": 4096,
            "quantization_config": {"format": "float-quantized"},
        },
        "continuous_batching_configs": [{"tp_size": 4, "max_model_len": 4096, "max_num_seqs": 8}],
    },
    "org/embedder": {
        "architecture": {"model_type": "roberta"},
        "static_batching_configs": [
            {"tp_size": 1, "warmup_shapes": [{"prompt_len": 512, "batch_size": 64}]}
        ],
    },
}


def test_known_configuration_check_and_nearest_shapes() -> None:
    from spyre_engine.known_configs import check_configuration

    decoder = {"model_type": "granite", "hidden_size": 4096}
    assert check_configuration(decoder, 4, 32768, 32, models=SITE_MODELS).known
    check = check_configuration(decoder, 4, 32768, 16, models=SITE_MODELS)
    assert not check.known and check.model == "org/decoder"
    assert [str(s) for s in check.nearest] == [
        "tp=4 maxModelLen=32768 maxNumSeqs=32",
        "tp=4 maxModelLen=16384 maxNumSeqs=4",
        "tp=1 maxModelLen=8192 maxNumSeqs=4",
    ]
    # The most specific pattern wins (a quantized variant over its base model).
    fp8 = {**decoder, "quantization_config": {"format": "float-quantized", "x": 1}}
    assert check_configuration(fp8, 4, 4096, 8, models=SITE_MODELS).model == "org/decoder-fp8"
    # Pooling: the warmup shapes must be a subset of a listed static config of that tp.
    roberta = {"model_type": "roberta"}
    assert check_configuration(roberta, 1, 512, 64, [(512, 64)], models=SITE_MODELS).known
    assert not check_configuration(roberta, 1, 512, 8, [(512, 8)], models=SITE_MODELS).known
    unknown = check_configuration({"model_type": "llama"}, 1, 2048, 4, models=SITE_MODELS)
    assert not unknown.known and unknown.model is None and "org/decoder" in unknown.message
    assert "no model_configs.yaml" in check_configuration(decoder, 1, 1, 1, models={}).message


def test_effective_shape_applies_a_known_configurations_device_env(tmp_path: Path) -> None:
    from spyre_engine.known_configs import effective_shape

    decoder = {"model_type": "granite", "hidden_size": 4096}
    s = _serve(tmp_path, tensor_parallel_size=4, max_model_len=16384, max_num_seqs=4)
    shape = effective_shape(s, decoder, {}, models=SITE_MODELS)
    assert shape.known is not None and shape.known.known
    assert shape.max_batch_tkv_limit == 65536
    # An inherited limit wins over the registry's (the configurator never overrides).
    shape = effective_shape(s, decoder, {"VLLM_DT_MAX_BATCH_TKV_LIMIT": "1000"}, models=SITE_MODELS)
    assert shape.max_batch_tkv_limit == 1000


# ---------------------------------------------------------------- what the plugin logged


def test_precompile_records_what_the_plugin_logged_it_configured(tmp_path: Path) -> None:
    from spyre_engine import catalog
    from spyre_engine.launch import Child
    from spyre_engine.precompile import record_what_was_compiled

    line = (
        "INFO 11-22 15:49:16 [platform.py:414] Configurations for Spyre. max_model_len=32768, "
        "max_num_seqs=32, block_size=64, max_num_batched_tokens=1024, "
        "enable_chunked_prefill=True, enable_prefix_caching=True"
    )
    child = Child([sys.executable, "-c", f"print({line!r})"], env=dict(os.environ))
    child.proc.wait(timeout=60)
    assert child.stop() == 0
    assert child.spyre_config == {
        "max_model_len": 32768,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 1024,
    }
    # A prediction that disagrees with the plugin's own line is corrected to what was compiled.
    s = _pre(tmp_path, max_model_len=65536, max_num_seqs=64, backend="inductor")
    data = catalog.entry_data(s, "/m", {}, env={})
    assert data["VLLM_DT_MAX_CONTEXT_LEN"] == 65536
    record_what_was_compiled(data, child.spyre_config, pooling=False)
    assert (data["VLLM_DT_MAX_CONTEXT_LEN"], data["VLLM_DT_MAX_BATCH_SIZE"]) == (32768, 32)
    assert data["VLLM_DT_CHUNK_LEN"] == 1024


def test_flex_device_follows_the_backend(tmp_path: Path) -> None:
    image = {**BAKED, "FLEX_DEVICE": "PF"}
    pre = _pre(tmp_path, backend="sendnn_compile_only")
    assert plugin_env(pre, require_precompiled=False, base=image)["FLEX_DEVICE"] == "COMPILE"
    # The server keeps the image's device, but never a leaked compile-only one.
    assert plugin_env(_serve(tmp_path), require_precompiled=True, base=image)["FLEX_DEVICE"] == "PF"
    leaked = {**BAKED, "FLEX_DEVICE": "COMPILE"}
    assert "FLEX_DEVICE" not in plugin_env(_serve(tmp_path), require_precompiled=True, base=leaked)
