"""The artifact key: stable under defaulting and field order, sensitive to compile inputs only."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.key import artifact_key, is_compile_env

from .samples import ALL, GENERATE


def key(spec: dict[str, Any]) -> str:
    return artifact_key(SpyreModelSpec.model_validate(spec))


def test_key_is_stable_under_explicit_defaults() -> None:
    """Defaults, and the shape chosen from the plugin's list, spelt out: the same key."""
    explicit = {
        "model": GENERATE["model"],
        "task": "generate",
        "compile": {"tensorParallelSize": 1, "maxModelLen": 8192, "maxNumSeqs": 4,
                    "maxNumBatchedTokens": 1024, "backend": "sendnn"},
        "engine": {"image": SpyreModelSpec.model_validate(GENERATE).engine.image},
        "replicas": 1,
    }
    assert key(explicit) == key(GENERATE)


def test_key_is_stable_under_field_order() -> None:
    spec = ALL["generate-tp4"]
    reordered = dict(reversed(list(spec.items())))
    reordered["compile"] = dict(reversed(list(spec["compile"].items())))
    assert key(reordered) == key(spec)


@pytest.mark.parametrize(
    "path,value",
    [
        (("replicas",), 7),
        (("serving", "prefixCaching"), False),
        (("serving", "extraArgs"), ["--disable-log-stats"]),
        (("serving", "port"), 9000),
        (("serving", "resources"), {"limits": {"memory": "1Gi"}}),
        (("serving", "env"), [{"name": "LOG_LEVEL", "value": "info"}]),
        (("serving", "shutdownGracePeriodSeconds"), 90),
        (("accelerator", "schedulerName"), ""),
        (("accelerator", "resourceName"), "ibm.com/spyre_pf"),
        (("precompile", "backoffLimit"), 4),
        (("cache", "claimName"), "other"),
        (("model", "servedName"), "alias"),
    ],
)
def test_non_compile_fields_do_not_change_the_key(path: tuple[str, ...], value: Any) -> None:
    spec = copy.deepcopy(GENERATE)
    node = spec
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    assert key(spec) == key(GENERATE)


@pytest.mark.parametrize(
    "path,value",
    [
        (("model", "uri"), "hf://ibm-granite/granite-3.3-8b-instruct@ffff"),
        (("compile", "tensorParallelSize"), 2),
        (("compile", "maxModelLen"), 3072),
        (("compile", "maxNumSeqs"), 16),
        (("compile", "maxNumBatchedTokens"), 512),
        (("compile", "backend"), "inductor"),
        (("engine", "image"), "registry.example/engine:2"),
        (("serving", "env"), [{"name": "DT_OPT", "value": "x"}]),
        (("serving", "env"), [{"name": "SENDNN_INFERENCE_WARMUP_PROMPT_LENS", "value": "64"}]),
    ],
)
def test_compile_fields_change_the_key(path: tuple[str, ...], value: Any) -> None:
    spec = copy.deepcopy(GENERATE)
    node = spec
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value
    assert key(spec) != key(GENERATE)


def test_task_and_warmup_shapes_change_the_key() -> None:
    embed = copy.deepcopy(ALL["embed"])
    base = key(embed)
    embed["compile"]["warmupShapes"][0]["batchSize"] = 8
    assert key(embed) != base
    embed2 = copy.deepcopy(ALL["embed"])
    embed2["task"] = "rerank"
    assert key(embed2) != base


def test_operator_owned_env_is_not_compile_env() -> None:
    assert not is_compile_env("TORCH_SENDNN_CACHE_DIR")
    assert is_compile_env("TORCH_SENDNN_LOG")
    assert is_compile_env("DT_OPT")
    assert not is_compile_env("HF_TOKEN")


def test_key_shape() -> None:
    k = key(GENERATE)
    assert len(k) == 32 and all(c in "0123456789abcdef" for c in k)
