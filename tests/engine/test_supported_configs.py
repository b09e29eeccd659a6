"""The plugin's own model registry, on vLLM's own config object, against what we compute.

- ``known_configs.check_configuration`` (the pure check serve uses before vLLM is imported)
  agrees with ``known_configs.plugin_check`` (the plugin's registry, which precompile uses) on
  every entry of the installed ``model_configs.yaml``: each listed shape, and one it does not
  list. Mistral-Small-3.2 and Ministral-3 come in Mistral's format, as their repositories do
  (``config.json`` says ``mistral3``; vLLM presents them as ``pixtral``).
- every shape the operator chooses for a listed model, and every shipped or documented
  SpyreModel, is one the plugin's registry accepts.
- an empty ``SENDNN_INFERENCE_MODEL_CONFIG_FILE`` is an error, as in the plugin.

Model directories hold only the configuration files (vLLM's config loading reads no weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_engine import known_configs
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired import shapes

from tests.documented_models import documented_models

pytestmark = pytest.mark.engine

PLUGIN_MODELS = known_configs.load_models(known_configs.default_config_file())


def _hf_dict(pattern: dict[str, Any]) -> dict[str, Any]:
    """A config.json holding the entry's architecture pattern."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in pattern.items()}
    if doc["model_type"] in ("granite", "llama", "granitemoehybrid", "granite_swa"):
        doc.setdefault("architectures", ["GraniteForCausalLM"])
    return doc


def _model_dir(root: Path, name: str, pattern: dict[str, Any]) -> Path:
    """The entry's model as its repository ships it (config files only)."""
    path = root / name.replace("/", "--")
    path.mkdir(parents=True, exist_ok=True)
    if pattern["model_type"] != "pixtral":
        (path / "config.json").write_text(json.dumps(_hf_dict(pattern)))
        return path
    # Mistral's format: params.json + consolidated.safetensors, and an HF config.json saying
    # mistral3 (what known_configs reads).
    text, vision = pattern["text_config"], pattern["vision_config"]
    params = {
        "dim": text["hidden_size"],
        "n_layers": text["num_hidden_layers"],
        "n_heads": text["num_attention_heads"],
        "n_kv_heads": text["num_key_value_heads"],
        "vocab_size": text["vocab_size"],
        "max_position_embeddings": text["max_position_embeddings"],
        "head_dim": 128,
        "hidden_dim": 4 * text["hidden_size"],
        "norm_eps": 1e-5,
        "rope_theta": 1e9,
        "dtype": "bfloat16",
        "vision_encoder": {**vision, "image_size": 1540, "patch_size": 14},
    }
    (path / "params.json").write_text(json.dumps(params))
    (path / "consolidated.safetensors").write_bytes(b"")
    hf = {
        "model_type": "mistral3",
        "architectures": ["Mistral3ForConditionalGeneration"],
        "text_config": {"model_type": "mistral", **text},
        "vision_config": {"model_type": "pixtral", **vision},
    }
    (path / "config.json").write_text(json.dumps(hf))
    return path


def _skip_unless_vllm_reads(model: Path) -> None:
    """vLLM here does not know every model type the list names (granite_swa: the entry of a
    prerelease model whose id is still a placeholder); the plugin cannot match those either."""
    from vllm.transformers_utils.config import get_config

    try:
        get_config(str(model), trust_remote_code=False)
    except ValueError as exc:
        if "does not recognize this architecture" not in str(exc):
            raise
        pytest.skip(f"vLLM here cannot load this model type: {str(exc)[:120]}")


def _cases(entry: dict[str, Any]) -> list[tuple[int, int, int, list[tuple[int, int]] | None]]:
    """Each listed shape of the entry, and one near it that is not listed."""
    out: list[tuple[int, int, int, list[tuple[int, int]] | None]] = []
    for cb in entry.get("continuous_batching_configs") or []:
        tp, length, seqs = cb["tp_size"], cb["max_model_len"], cb["max_num_seqs"]
        out += [(tp, length, seqs, None), (tp, length, seqs * 2, None)]
    for sb in entry.get("static_batching_configs") or []:
        warm = [(w["prompt_len"], w["batch_size"]) for w in sb["warmup_shapes"]]
        out += [(sb["tp_size"], 512, 4, warm), (sb["tp_size"], 512, 4, [(64, 3)])]
    return out


@pytest.mark.parametrize("name", sorted(PLUGIN_MODELS))
def test_pure_check_agrees_with_the_plugins_registry(name: str, tmp_path: Path) -> None:
    entry = PLUGIN_MODELS[name]
    model = _model_dir(tmp_path, name, entry["architecture"])
    _skip_unless_vllm_reads(model)
    config_json = known_configs.read_config_json(model)
    env: dict[str, str] = {}
    for tp, length, seqs, warm in _cases(entry):
        plugin = known_configs.plugin_check(model, tp, length, seqs, warm, env)
        pure = known_configs.check_configuration(config_json, tp, length, seqs, warm)
        assert (pure.known, pure.model) == (plugin.known, plugin.model), (
            name, tp, length, seqs, warm, pure.message, plugin.message,
        )
        # the entry's own shapes are known (this is the entry vLLM's config matched)
        if warm is None and any(
            cb["tp_size"] == tp and cb["max_model_len"] == length and cb["max_num_seqs"] == seqs
            for cb in entry.get("continuous_batching_configs") or []
        ):
            assert plugin.known, plugin.message


def test_mistral_format_models_are_known(tmp_path: Path) -> None:
    """Mistral-Small-3.2 at TP 4: its config.json says mistral3, the plugin sees pixtral."""
    name = "mistralai/Mistral-Small-3.2-24B-Instruct-2506"
    model = _model_dir(tmp_path, name, PLUGIN_MODELS[name]["architecture"])
    assert json.loads((model / "config.json").read_text())["model_type"] == "mistral3"
    check = known_configs.check_configuration(known_configs.read_config_json(model), 4, 32768, 32)
    assert check.known and check.model == name, check.message
    assert known_configs.plugin_check(model, 4, 32768, 32, None, {}).known


def test_an_empty_model_config_file_variable_is_an_error(tmp_path: Path) -> None:
    name = "ibm-granite/granite-3.3-8b-instruct"
    model = _model_dir(tmp_path, name, PLUGIN_MODELS[name]["architecture"])
    with pytest.raises(ValueError, match="set but empty"):  # the pure side too: no fallback
        known_configs.config_file({known_configs.MODEL_CONFIG_FILE_ENV: ""})
    with pytest.raises(Exception):  # noqa: B017 - whatever the plugin raises
        known_configs.plugin_check(
            model, 1, 8192, 4, None, {known_configs.MODEL_CONFIG_FILE_ENV: ""}
        )
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"models": {name: PLUGIN_MODELS[name]}}))
    env = {known_configs.MODEL_CONFIG_FILE_ENV: str(site)}
    assert known_configs.plugin_check(model, 1, 8192, 4, None, env).known


def _plugin_accepts(tmp_path: Path, spec: SpyreModelSpec) -> Any:
    r = shapes.resolve_compile(spec)
    assert r.refusal is None and r.supported_model, r.refusal
    c = r.compile
    model = _model_dir(
        tmp_path, r.supported_model, PLUGIN_MODELS[r.supported_model]["architecture"]
    )
    _skip_unless_vllm_reads(model)
    warm = [(w.prompt_len, w.batch_size) for w in c.warmup_shapes or []] or None
    return known_configs.plugin_check(
        model, c.tensor_parallel_size or 0, c.max_model_len or 0, c.max_num_seqs or 0, warm, {}
    )


@pytest.mark.parametrize("name", sorted(PLUGIN_MODELS))
def test_the_shape_the_operator_chooses_is_one_the_plugin_accepts(
    name: str, tmp_path: Path
) -> None:
    pooling = bool(PLUGIN_MODELS[name].get("static_batching_configs"))
    spec = SpyreModelSpec.model_validate(
        {"model": {"uri": f"hf://{name}"}, **({"task": "embed"} if pooling else {})}
    )
    check = _plugin_accepts(tmp_path, spec)
    # the entry the operator predicts the plugin matches (an identical architecture listed
    # earlier wins there) is the one the plugin's registry matched
    assert check.known and check.model == shapes.plugin_entry(name, PLUGIN_MODELS), check.message


@pytest.mark.parametrize(
    "where,doc", documented_models(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_documented_spyremodels_pass_the_plugins_check(
    where: str, doc: dict[str, Any], tmp_path: Path
) -> None:
    spec = SpyreModelSpec.model_validate(doc["spec"])
    if not shapes.checks_known(spec):
        pytest.skip(f"{where}: backend {spec.compile.backend} is not checked by the plugin")
    check = _plugin_accepts(tmp_path, spec)
    assert check.known, f"{where}: {check.message}"


def _precompile_settings(model: Path, tmp_path: Path, **kw: Any) -> Any:
    from spyre_engine.settings import PrecompileSettings

    return PrecompileSettings.model_validate(
        {"model": str(model), "artifact_dir": tmp_path / "art", "backend": "sendnn_compile_only",
         "require_known_config": True, **kw}
    )


def test_precompile_asks_the_plugins_registry(tmp_path: Path) -> None:
    """Mistral-Small-3.2 at a listed shape is compiled (the check on its config.json refused
    it); an unlisted shape is refused naming the listed ones; an empty
    SENDNN_INFERENCE_MODEL_CONFIG_FILE is the plugin's error, not its bundled file."""
    from spyre_engine.launch import plugin_env
    from spyre_engine.precompile import PrecompileError, check_known

    name = "mistralai/Mistral-Small-3.2-24B-Instruct-2506"
    model = _model_dir(tmp_path, name, PLUGIN_MODELS[name]["architecture"])
    ok = _precompile_settings(model, tmp_path, tensor_parallel_size=4, max_model_len=32768,
                              max_num_seqs=32)
    env = plugin_env(ok, require_precompiled=False)
    check_known(ok, str(model), env)
    bad = _precompile_settings(model, tmp_path, tensor_parallel_size=4, max_model_len=32768,
                               max_num_seqs=4)
    with pytest.raises(PrecompileError) as refused:
        check_known(bad, str(model), env)
    assert refused.value.reason == "UnsupportedConfiguration"
    assert "tp=4 maxModelLen=32768 maxNumSeqs=32" in refused.value.message
    with pytest.raises(PrecompileError) as empty:
        check_known(ok, str(model), {**env, known_configs.MODEL_CONFIG_FILE_ENV: ""})
    assert empty.value.reason == "UnsupportedConfiguration"
    assert "cannot check" in empty.value.message
