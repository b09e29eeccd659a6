"""The content-addressed artifact key.

The key is a hash over everything that changes the compiled graphs, and nothing else. Two
SpyreModels with the same key share one precompile Job and one artifact directory
(``<cache>/artifacts/<key>/``) on the same cache claim.

In the key:
  - ``spec.model.uri`` (including ``@revision``) — different weights, different graphs.
  - ``spec.task`` — pooling models compile static warmup shapes, generate models chunked prefill.
  - every ``spec.compile`` field: tensorParallelSize, maxModelLen, maxNumSeqs,
    maxNumBatchedTokens, warmupShapes, backend — as resolved (:mod:`.shapes`): fields the spec
    omits are hashed with the value the operator chose, so an explicit shape equal to the
    chosen one is the same artifact, and a new supported list that chooses otherwise is not.
  - ``spec.engine.image`` — the compiler (torch, the plugin, the Spyre stack) lives in the image.
    The operator cannot read the stack's versions (torch_sendnn, deeptools) before the Job
    runs; the image reference is what it knows of them. The engine records the versions in the
    catalog entry and a sendnn server refuses an artifact another stack compiled
    (``ArtifactMismatch``: a base upgraded under a reused tag keeps this key).
  - environment variables the plugin and the Spyre compiler read at compile time, when set in
    ``spec.serving.env`` (see :data:`COMPILE_ENV_NAMES` and :data:`COMPILE_ENV_PREFIXES`).
    They are also passed to the precompile Job.
  - the serving pods' whole CPUs (:func:`engine_cpus`), when ``serving.resources`` gives a
    cpu: the operator sets them as ``SENDNN_INFERENCE_NUM_CPUS`` in the precompile Job and the
    serving pods alike. The plugin (sendnn_inference/platform.py, ``get_cpu_count`` and
    ``_check_threading_config``) divides that count among its tensor-parallel workers and sets
    each worker's ``DT_PARALLEL_THREADS`` from it ("affects the compilation during warmup"), in
    ``sendnn_compile_only`` too; without it each pod counts its own cgroup limit or node, and
    a CPU node and a card node count differently. One Job builds the artifact of every model
    with its key, so a value that may shape the compile is a key input like the user's own
    ``DT_*`` variables. Absent (no serving cpu) it is not hashed: those keys stay as before.

Not in the key (changing them only rolls the Deployment): replicas, resources but the serving
cpu, serving env that does not affect compilation, extraArgs, prefixCaching, port, shutdown
grace period, scheduling, the precompile Job's limits, annotations and maxLoadProcesses (how
many workers compile at once, not what they compile), and the cache claim (a different claim
gets its own Job, named from claim and key, but the same key).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from ..api.v1alpha1 import OPERATOR_ENV, EnvVar, SpyreModelSpec
from .quantity import parse_quantity
from .shapes import resolve_compile

#: Bump when the key's inputs change meaning, so old artifacts are not reused by mistake.
KEY_SCHEMA = "spyre-artifact/v1"

#: Plugin variables that change what gets compiled (sendnn_inference/envs.py, 2.6.x).
COMPILE_ENV_NAMES = frozenset(
    {
        "SENDNN_INFERENCE_DYNAMO_BACKEND",
        "SENDNN_INFERENCE_SIMPLE_COMPILE_BACKEND",
        "SENDNN_INFERENCE_WARMUP_PROMPT_LENS",
        "SENDNN_INFERENCE_WARMUP_BATCH_SIZES",
        "SENDNN_INFERENCE_CP_INTERLEAVE_STEPS",
        "SENDNN_INFERENCE_MODEL_CONFIG_FILE",
        # 0 keeps the plugin from setting DT_PARALLEL_THREADS from SENDNN_INFERENCE_NUM_CPUS
        "SENDNN_INFERENCE_UPDATE_THREAD_CONFIG",
    }
)
#: Prefixes of the Spyre compiler's and runtime's graph-shaping variables.
COMPILE_ENV_PREFIXES = ("DT_", "FLEX_", "VLLM_DT_", "TORCH_SENDNN_", "SENCORES")
#: Set by the operator itself (the API rejects them in serving.env); never part of the key.
OPERATOR_ENV_NAMES = frozenset(OPERATOR_ENV)


def is_compile_env(name: str) -> bool:
    """Whether an environment variable changes compiled graphs."""
    if name in OPERATOR_ENV_NAMES:
        return False
    return name in COMPILE_ENV_NAMES or name.startswith(COMPILE_ENV_PREFIXES)


def compile_env(spec: SpyreModelSpec) -> list[EnvVar]:
    """The serving env entries that affect compilation, sorted by name."""
    return sorted(
        (e for e in spec.serving.env or [] if is_compile_env(e.name)), key=lambda e: e.name
    )


def engine_cpus(spec: SpyreModelSpec) -> int | None:
    """The whole CPUs of a serving pod (its cpu limit, else its request, rounded up), which the
    operator gives the plugin as ``SENDNN_INFERENCE_NUM_CPUS`` in the precompile Job and the
    serving pods of the artifact; None when serving.resources gives no cpu."""
    res = spec.serving.resources
    for quantities in (res.limits, res.requests) if res else ():
        if quantities and "cpu" in quantities:
            cpus = parse_quantity(quantities["cpu"])
            if cpus is not None and cpus > 0:
                return max(1, math.ceil(cpus))
    return None


def key_inputs(spec: SpyreModelSpec) -> dict[str, Any]:
    """The canonical document the key hashes (also useful to explain a key)."""
    c = resolve_compile(spec).compile
    cpus = engine_cpus(spec)
    site: dict[str, Any] = {}
    # Only when set, so that keys of existing artifacts do not change.
    if not c.require_known_configuration:
        site["requireKnownConfiguration"] = False
    if c.model_config_file is not None:
        site["modelConfigFile"] = [c.model_config_file.name, c.model_config_file.key]
    return {
        **({"site": site} if site else {}),
        "schema": KEY_SCHEMA,
        "model": spec.model.uri,
        "task": str(spec.task),
        "compile": {
            "tensorParallelSize": c.tensor_parallel_size,
            "maxModelLen": c.max_model_len,
            "maxNumSeqs": c.max_num_seqs,
            "maxNumBatchedTokens": c.max_num_batched_tokens,
            "warmupShapes": [[w.prompt_len, w.batch_size] for w in c.warmup_shapes or []],
            "backend": str(c.backend),
        },
        "image": spec.engine.image,
        "env": [e.model_dump(by_alias=True, exclude_none=True) for e in compile_env(spec)],
        # Only when set, so that keys of models without a serving cpu do not change.
        **({"engineCpus": cpus} if cpus is not None else {}),
    }


def artifact_key(spec: SpyreModelSpec) -> str:
    """A stable 32-hex-digit key over everything that changes the compiled graphs."""
    doc = json.dumps(key_inputs(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:32]
