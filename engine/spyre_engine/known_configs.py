"""The plugin's known configurations and the shape it actually compiles, without vLLM or torch.

``sendnn_inference/config/model_configs.yaml`` lists, per model (matched on its HF
``config.json``), the tensor-parallel x max-model-len x max-num-seqs combinations (decoders) and
warmup shapes (pooling) that run on Spyre, with device settings (``VLLM_DT_MAX_BATCH_TKV_LIMIT``,
``num_gpu_blocks_override``). With a ``sendnn`` backend the plugin (``platform.py``,
``check_and_update_config``) applies them, or, for an unknown configuration, caps
``max_num_seqs`` at 32 and ``max_model_len`` at 32K (and raises instead when
``SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG=1``).

Pure (PyYAML and the standard library; the plugin's YAML is located without importing the
plugin) so ``precompile`` can call :func:`check_configuration` before vLLM starts, and
``serve`` can compute the catalog values the plugin will look up before vLLM is imported. The
operator does not import it: it reads the same YAML with its own parser
(operator/spyre_operator/desired/shapes.py) to fill in and check shapes before it creates anything.
``tests/engine/test_catalog_plugin.py`` checks this module against the plugin's own code.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spyre_engine.settings import SENDNN_BACKENDS, EngineSettings

# platform.py: used for configurations the registry does not know (decoders only).
DEFAULT_MAX_MODEL_LEN = 32 * 1024
DEFAULT_MAX_NUM_SEQS = 32
DEFAULT_TKV_LIMIT = 131072
# platform.py SpyrePlatform.DEFAULT_CHUNK_SIZE: the plugin's --max-num-batched-tokens default.
DEFAULT_CHUNK_SIZE = 512

MODEL_CONFIG_FILE_ENV = "SENDNN_INFERENCE_MODEL_CONFIG_FILE"


def default_config_file() -> Path | None:
    """The plugin's bundled ``model_configs.yaml`` (None when the plugin is not installed)."""
    spec = importlib.util.find_spec("sendnn_inference")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "config" / "model_configs.yaml"
    return path if path.is_file() else None


def config_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The file the plugin reads: ``$SENDNN_INFERENCE_MODEL_CONFIG_FILE``, else the bundled one.

    Set but empty is an error, as in the plugin (model_registry.py takes any value that is not
    None as the path, and fails to open ``""``); it never means the bundled file.
    """
    env = os.environ if env is None else env
    if MODEL_CONFIG_FILE_ENV in env:
        if not env[MODEL_CONFIG_FILE_ENV]:
            raise ValueError(
                f"{MODEL_CONFIG_FILE_ENV} is set but empty: the plugin fails on it (it does not "
                "fall back to its bundled model_configs.yaml); unset it or name a file"
            )
        return Path(env[MODEL_CONFIG_FILE_ENV])
    return default_config_file()


def load_models(path: Path | str | None = None) -> dict[str, dict[str, Any]]:
    """The ``models`` section of a model_configs.yaml (``{}`` when there is no file)."""
    path = config_file() if path is None else Path(path)
    if path is None:
        return {}
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return dict(data.get("models") or {})


@dataclass(frozen=True)
class SupportedShape:
    """One supported combination of a known model."""

    tensor_parallel_size: int
    max_model_len: int | None = None  # decoders
    max_num_seqs: int | None = None  # decoders
    warmup_shapes: tuple[tuple[int, int], ...] = ()  # pooling: (prompt_len, batch_size)
    device_env: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    num_gpu_blocks_override: int | None = field(default=None, compare=False, hash=False)

    def __str__(self) -> str:
        if self.warmup_shapes:
            shapes = ",".join(f"{p}x{b}" for p, b in self.warmup_shapes)
            return f"tp={self.tensor_parallel_size} warmup={shapes}"
        return (
            f"tp={self.tensor_parallel_size} maxModelLen={self.max_model_len} "
            f"maxNumSeqs={self.max_num_seqs}"
        )


@dataclass(frozen=True)
class ConfigurationCheck:
    """Whether a model x shape is one of the plugin's known configurations."""

    known: bool
    model: str | None  # the model_configs.yaml entry the config.json matched, if any
    message: str
    nearest: tuple[SupportedShape, ...] = ()  # the closest supported shapes, best first
    matched: SupportedShape | None = None


def _has(config: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    if key in config:
        return True, config[key]
    return False, None


def _matches(config: Mapping[str, Any], pattern: Mapping[str, Any]) -> bool:
    """model_matcher.py ModelMatcher.matches on a config.json dict."""
    if config.get("model_type") != pattern.get("model_type"):
        return False
    for key, expected in pattern.items():
        if key == "model_type":
            continue
        present, actual = _has(config, key)
        if not present:
            return False
        if isinstance(expected, dict):
            if not isinstance(actual, Mapping):
                return False
            for sub_key, sub_expected in expected.items():
                sub_present, sub_actual = _has(actual, sub_key)
                if not sub_present or sub_actual != sub_expected:
                    return False
        elif actual != expected:
            return False
    return True


def _field_count(pattern: Mapping[str, Any]) -> int:
    attributes = {k: v for k, v in pattern.items() if k != "model_type"}
    return len(attributes) + sum(len(v) for v in attributes.values() if isinstance(v, dict))


def match_model(
    config_json: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]]
) -> tuple[str, Mapping[str, Any]] | None:
    """The registry entry for a config.json: the matching pattern with the most fields."""
    best: tuple[str, Mapping[str, Any]] | None = None
    best_count = -1
    for name, spec in models.items():
        pattern = spec.get("architecture") or {}
        if _matches(config_json, pattern) and _field_count(pattern) > best_count:
            best, best_count = (name, spec), _field_count(pattern)
    return best


def supported_shapes(spec: Mapping[str, Any]) -> list[SupportedShape]:
    """Every supported combination of one model entry."""
    shapes = []
    for cb in spec.get("continuous_batching_configs") or []:
        device = cb.get("device_config") or {}
        shapes.append(
            SupportedShape(
                tensor_parallel_size=int(cb["tp_size"]),
                max_model_len=int(cb["max_model_len"]),
                max_num_seqs=int(cb["max_num_seqs"]),
                device_env={k: str(v) for k, v in (device.get("env_vars") or {}).items()},
                num_gpu_blocks_override=device.get("num_gpu_blocks_override"),
            )
        )
    for sb in spec.get("static_batching_configs") or []:
        shapes.append(
            SupportedShape(
                tensor_parallel_size=int(sb["tp_size"]),
                warmup_shapes=tuple(
                    (int(w["prompt_len"]), int(w["batch_size"])) for w in sb["warmup_shapes"]
                ),
            )
        )
    return shapes


def _distance(shape: SupportedShape, tp: int, max_model_len: int, max_num_seqs: int) -> float:
    tp_cost = 0.0 if shape.tensor_parallel_size == tp else 100.0
    tp_cost += abs(math.log2(shape.tensor_parallel_size / tp))
    if shape.max_model_len is None or shape.max_num_seqs is None:
        return 1000.0 + tp_cost
    return (
        tp_cost
        + abs(math.log2(shape.max_model_len / max_model_len))
        + abs(math.log2(shape.max_num_seqs / max_num_seqs))
    )


def check_configuration(
    config_json: Mapping[str, Any],
    tensor_parallel_size: int,
    max_model_len: int,
    max_num_seqs: int,
    warmup_shapes: Sequence[tuple[int, int]] | None = None,
    *,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    nearest: int = 3,
) -> ConfigurationCheck:
    """Is this model (its ``config.json`` as a dict) x shape a known configuration?

    Decoders: known when (tp, max_model_len, max_num_seqs) is listed for the model. Pooling
    (``warmup_shapes`` given, as (prompt_len, batch_size)): known when the shapes are a subset of
    a listed static-batching config of that tp. If not known, ``nearest`` lists the closest
    supported shapes of the model (same tp first). Mirrors model_registry.py
    ``get_configurator_for_runtime``; ``models`` defaults to the plugin's YAML.
    """
    models = load_models() if models is None else models
    if not models:
        return ConfigurationCheck(
            known=False,
            model=None,
            message="no model_configs.yaml to check against (sendnn-inference is not installed "
            f"here and {MODEL_CONFIG_FILE_ENV} is not set)",
        )
    found = match_model(config_json, models)
    if found is None:
        return ConfigurationCheck(
            known=False,
            model=None,
            message=f"model_type={config_json.get('model_type')!r} with this architecture is not "
            f"in the plugin's model_configs.yaml (it knows: {', '.join(sorted(models))})",
        )
    name, spec = found
    return _check_entry(
        name, spec, tensor_parallel_size, max_model_len, max_num_seqs, warmup_shapes, nearest
    )


def _check_entry(
    name: str,
    spec: Mapping[str, Any],
    tensor_parallel_size: int,
    max_model_len: int,
    max_num_seqs: int,
    warmup_shapes: Sequence[tuple[int, int]] | None,
    nearest: int = 3,
) -> ConfigurationCheck:
    """Whether one model entry lists the shape; if not, its closest supported shapes."""
    shapes = supported_shapes(spec)
    if warmup_shapes:
        wanted = set(warmup_shapes)
        for shape in shapes:
            if (
                shape.warmup_shapes
                and shape.tensor_parallel_size == tensor_parallel_size
                and wanted <= set(shape.warmup_shapes)
            ):
                return ConfigurationCheck(True, name, f"known configuration of {name}", (), shape)
        candidates = sorted(
            (s for s in shapes if s.warmup_shapes),
            key=lambda s: abs(math.log2(s.tensor_parallel_size / tensor_parallel_size)),
        )
        requested = ",".join(f"{p}x{b}" for p, b in warmup_shapes)
        what = f"tp={tensor_parallel_size} warmup={requested}"
    else:
        for shape in shapes:
            if (
                shape.max_model_len is not None
                and shape.tensor_parallel_size == tensor_parallel_size
                and shape.max_model_len == max_model_len
                and shape.max_num_seqs == max_num_seqs
            ):
                return ConfigurationCheck(True, name, f"known configuration of {name}", (), shape)
        candidates = sorted(
            (s for s in shapes if s.max_model_len is not None),
            key=lambda s: _distance(s, tensor_parallel_size, max_model_len, max_num_seqs),
        )
        what = f"tp={tensor_parallel_size} maxModelLen={max_model_len} maxNumSeqs={max_num_seqs}"
    best = tuple(candidates[:nearest])
    return ConfigurationCheck(
        known=False,
        model=name,
        message=f"{name} is not supported with {what}; supported: "
        + ("; ".join(str(s) for s in best) or "none of this kind"),
        nearest=best,
    )


@dataclass(frozen=True)
class EffectiveShape:
    """What the plugin configures for a shape: the values it compiles and matches against."""

    max_model_len: int
    max_num_seqs: int
    chunk_len: int | None  # VLLM_DT_CHUNK_LEN (decoders)
    max_batch_tkv_limit: int  # VLLM_DT_MAX_BATCH_TKV_LIMIT
    known: ConfigurationCheck | None  # None unless a sendnn backend (the registry is sendnn-only)

    @property
    def dt_max_batch_size(self) -> int:
        """The ``VLLM_DT_MAX_BATCH_SIZE`` env torch_sendnn compiles for: ``max(seqs, 2)``."""
        return max(self.max_num_seqs, 2)


def is_mistral_format(model_path: str | Path) -> bool:
    """vLLM's ``get_config`` (config_format auto) reads this model in Mistral's format: its
    files include ``consolidated*.safetensors`` and ``params.json``."""
    path = Path(model_path)
    return (path / "params.json").is_file() and any(path.glob("consolidated*.safetensors"))


def read_config_json(model_path: str | Path) -> dict[str, Any]:
    """The model's ``config.json`` as vLLM presents it to the plugin (``{}`` when missing).

    vLLM loads a Mistral-format model's multimodal config as ``pixtral``
    (vllm/transformers_utils/configs/mistral.py ``_remap_mistral_vision_args``), the
    ``model_type`` the plugin's entries for Mistral-Small-3.2 and Ministral-3 match; the
    ``config.json`` of those repositories says ``mistral3``.
    """
    try:
        data = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if data.get("model_type") == "mistral3" and is_mistral_format(model_path):
        data = {**data, "model_type": "pixtral"}
    return data


def plugin_check(
    model_path: str | Path,
    tensor_parallel_size: int,
    max_model_len: int,
    max_num_seqs: int,
    warmup_shapes: Sequence[tuple[int, int]] | None,
    env: Mapping[str, str],
) -> ConfigurationCheck:
    """The plugin's own verdict: its model registry (``get_configurator_for_runtime``, as
    ``platform.py`` ``check_and_update_config`` calls it) on vLLM's own config object.

    Imports vLLM and the plugin (seconds): for precompile, not serve's start-up path. The
    registry reads ``SENDNN_INFERENCE_MODEL_CONFIG_FILE`` from ``env`` the way the plugin does
    (an empty value is an error there, and here). Raises what the plugin raises.
    """
    from types import SimpleNamespace

    from sendnn_inference import envs as plugin_envs
    from sendnn_inference.config.model_registry import ModelConfigRegistry
    from vllm.transformers_utils.config import get_config

    hf_config = get_config(str(model_path), trust_remote_code=False)
    registry = ModelConfigRegistry()  # not the process-wide one: read with this env
    saved = os.environ.get(MODEL_CONFIG_FILE_ENV)
    try:
        os.environ.pop(MODEL_CONFIG_FILE_ENV, None)
        if MODEL_CONFIG_FILE_ENV in env:
            os.environ[MODEL_CONFIG_FILE_ENV] = env[MODEL_CONFIG_FILE_ENV]
        plugin_envs.clear_env_cache()
        registry.initialize()
    finally:
        os.environ.pop(MODEL_CONFIG_FILE_ENV, None)
        if saved is not None:
            os.environ[MODEL_CONFIG_FILE_ENV] = saved
        plugin_envs.clear_env_cache()
    model_config = SimpleNamespace(
        hf_config=hf_config, model=str(model_path), max_model_len=max_model_len
    )
    vllm_config = SimpleNamespace(
        model_config=model_config,
        parallel_config=SimpleNamespace(world_size=tensor_parallel_size),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )
    warmup = list(warmup_shapes) if warmup_shapes else None
    matched = registry.find_matching_model(model_config)  # type: ignore[arg-type]
    if matched is None:
        return ConfigurationCheck(
            known=False,
            model=None,
            message=f"model_type={getattr(hf_config, 'model_type', None)!r} with this "
            "architecture matches no entry of the plugin's model_configs.yaml (it knows: "
            f"{', '.join(sorted(registry.list_models()))})",
        )
    entry = {
        "continuous_batching_configs": [
            {"tp_size": c.tp_size, "max_model_len": c.max_model_len, "max_num_seqs": c.max_num_seqs}
            for c in matched.continuous_batching_configs
        ],
        "static_batching_configs": [
            {
                "tp_size": c.tp_size,
                "warmup_shapes": [
                    {"prompt_len": w.prompt_len, "batch_size": w.batch_size}
                    for w in c.warmup_shapes
                ],
            }
            for c in matched.static_batching_configs
        ],
    }
    listed = _check_entry(
        matched.name, entry, tensor_parallel_size, max_model_len, max_num_seqs, warmup
    )
    known = registry.get_configurator_for_runtime(vllm_config, warmup) is not None  # type: ignore[arg-type]
    if known != listed.known:  # the plugin decides; the message still names the shapes
        return ConfigurationCheck(known, matched.name, listed.message, listed.nearest, None)
    return listed


def effective_shape(
    settings: EngineSettings,
    config_json: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    models: Mapping[str, Mapping[str, Any]] | None = None,
) -> EffectiveShape:
    """The shape the plugin's ``check_and_update_config`` ends up with for these settings.

    ``env`` is the environment vLLM runs in (only ``VLLM_DT_MAX_BATCH_TKV_LIMIT`` and
    ``SENDNN_INFERENCE_MODEL_CONFIG_FILE`` matter). Pooling: max len and seqs are the largest
    warmup prompt length and batch size, whatever the flags say.
    """
    env = os.environ if env is None else env
    if settings.is_pooling:
        max_model_len = max(s.prompt_len for s in settings.warmup_shapes)
        max_num_seqs = max(s.batch_size for s in settings.warmup_shapes)
        chunk_len = None
    else:
        max_model_len = settings.max_model_len
        max_num_seqs = settings.max_num_seqs
        chunk_len = settings.max_num_batched_tokens or DEFAULT_CHUNK_SIZE
    tkv_env = env.get("VLLM_DT_MAX_BATCH_TKV_LIMIT") or None
    check = None
    if settings.backend in SENDNN_BACKENDS:
        if models is None:
            path = config_file(env)
            models = load_models(path) if path is not None else {}
        warmup = [(s.prompt_len, s.batch_size) for s in settings.warmup_shapes] or None
        check = check_configuration(
            config_json,
            settings.tensor_parallel_size,
            max_model_len,
            max_num_seqs,
            warmup,
            models=models,
        )
        if check.known and check.matched is not None:
            # The configurator sets the device env only where not already set.
            tkv_env = tkv_env or check.matched.device_env.get("VLLM_DT_MAX_BATCH_TKV_LIMIT")
        elif not settings.is_pooling:
            max_num_seqs = min(max_num_seqs, DEFAULT_MAX_NUM_SEQS)
            max_model_len = min(max_model_len, DEFAULT_MAX_MODEL_LEN)
            tkv_env = str(min(DEFAULT_TKV_LIMIT, int(tkv_env or DEFAULT_TKV_LIMIT)))
    tkv = int(tkv_env) if tkv_env else max_model_len * max_num_seqs
    return EffectiveShape(max_model_len, max_num_seqs, chunk_len, tkv, check)
