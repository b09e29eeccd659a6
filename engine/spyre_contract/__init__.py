"""What the operator and the engine say to each other, spelled once.

The operator writes ``spyre-engine``'s command line and part of its environment into the pods it
builds, and reads back what the engine says: the one JSON line of its termination log, its
health and report paths. Each of those names lives here; both sides import it (issue 49, 4).

Shipped in both images (operator/Containerfile, engine/Containerfile, engine/Containerfile.layer)
and importing nothing but the standard library, so the operator's image needs neither pydantic
models of the engine nor torch, and the layer image's stdlib-only checks (compat.py) can use it.
tests/unit/test_contract.py keeps it so: stdlib only, every name used by both sides, every flag
one the engine's parser takes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Final


class Task(StrEnum):
    """What the model serves."""

    GENERATE = "generate"
    EMBED = "embed"
    SCORE = "score"
    RERANK = "rerank"


#: The pooling tasks: static warmup shapes instead of a decoder's continuous batching.
POOLING_TASKS: Final = frozenset({Task.EMBED, Task.SCORE, Task.RERANK})


class Backend(StrEnum):
    """The torch dynamo backend the Spyre plugin compiles with."""

    SENDNN = "sendnn"
    SENDNN_COMPILE_ONLY = "sendnn_compile_only"
    INDUCTOR = "inductor"
    EAGER = "eager"


#: The backend that runs on Spyre cards.
CARD_BACKEND: Final = Backend.SENDNN
#: Compiles for Spyre without cards (torch_sendnn with FLEX_DEVICE=COMPILE); precompile only.
COMPILE_ONLY_BACKEND: Final = Backend.SENDNN_COMPILE_ONLY
#: The backends that read and write torch_sendnn's cache: an artifact built with either is
#: served with sendnn.
SENDNN_BACKENDS: Final = frozenset({Backend.SENDNN, Backend.SENDNN_COMPILE_ONLY})

# spyre-engine's commands the operator runs.
PRECOMPILE: Final = "precompile"
SERVE: Final = "serve"
GC: Final = "gc"

# Its flags the operator writes (the engine's are its settings' fields, ``foo_bar`` as
# ``--foo-bar``: ``flag``); each is one of the engine's (tests/unit/test_contract.py).
MODEL: Final = "--model"
SERVED_NAME: Final = "--served-name"
TASK: Final = "--task"
TENSOR_PARALLEL_SIZE: Final = "--tensor-parallel-size"
MAX_MODEL_LEN: Final = "--max-model-len"
MAX_NUM_SEQS: Final = "--max-num-seqs"
MAX_NUM_BATCHED_TOKENS: Final = "--max-num-batched-tokens"
BACKEND: Final = "--backend"
WARMUP_SHAPES: Final = "--warmup-shapes"
HF_CACHE_DIR: Final = "--hf-cache-dir"
ARTIFACT_DIR: Final = "--artifact-dir"
ARTIFACT_KEY: Final = "--artifact-key"
TERMINATION_LOG: Final = "--termination-log"
NO_REQUIRE_KNOWN_CONFIG: Final = "--no-require-known-config"
REFERENCE_ANSWERS: Final = "--reference-answers"
PORT: Final = "--port"
METRICS_PORT: Final = "--metrics-port"
DRAIN_TIMEOUT: Final = "--drain-timeout"
PREFIX_CACHING: Final = "--prefix-caching"
NO_PREFIX_CACHING: Final = "--no-prefix-caching"
MAX_IN_FLIGHT: Final = "--max-in-flight"
BODY_TIMEOUT: Final = "--body-timeout"
OUTPUT_CHECK: Final = "--output-check"
CANARY_SECONDS: Final = "--canary-seconds"
CANARY_MAX_ERROR_RATIO: Final = "--canary-max-error-ratio"
CANARY_MIN_REQUESTS: Final = "--canary-min-requests"
CANARY_MAX_MEAN_LATENCY: Final = "--canary-max-mean-latency"
CACHE_ROOT: Final = "--cache-root"
REMOVE: Final = "--remove"
KEEP: Final = "--keep"
ORPHANS_UNUSED_FOR: Final = "--orphans-unused-for"
CLAIM: Final = "--claim"
NAMESPACE: Final = "--namespace"
#: What follows goes to vLLM as it is (serving.extraArgs).
PASSTHROUGH: Final = "--"

#: Every setting is also the variable ENV_PREFIX + its field in capitals (``env_name``).
ENV_PREFIX: Final = "SPYRE_ENGINE_"


def flag(field: str) -> str:
    """The flag of an engine setting: ``artifact_dir`` -> ``--artifact-dir``."""
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    """The environment variable of an engine setting: ``keep_models`` ->
    ``SPYRE_ENGINE_KEEP_MODELS``."""
    return ENV_PREFIX + field.upper()


#: serve: the artifact passed its output check before (the operator resolves it from the
#: model's ConfigMap when the container starts).
OUTPUT_VERIFIED_ENV: Final = env_name("output_verified")
#: gc: the hf:// models the claim's models name, a JSON list. A variable, not a flag: an engine
#: image older than the sweep ignores it, where it would refuse an unknown flag.
KEEP_MODELS_ENV: Final = env_name("keep_models")


def sendnn_cache_env(backend: str, artifact_dir: str) -> dict[str, str]:
    """The Spyre plugin's backend and torch_sendnn's cache for ``--backend`` and
    ``--artifact-dir``: the engine sets them from its flags whatever it inherits, the operator
    writes the same on the pod (``kubectl describe`` shows them; a pod template without them
    would roll every Deployment an earlier operator wrote)."""
    return {
        "TORCH_SENDNN_CACHE_ENABLE": "1",
        "TORCH_SENDNN_CACHE_DIR": artifact_dir,
        "SENDNN_INFERENCE_DYNAMO_BACKEND": backend,
    }


#: Where every command writes its one JSON line (the container's terminationMessagePath).
TERMINATION_LOG_PATH: Final = "/dev/termination-log"

# The fields of that line. precompile's success:
KEY: Final = "key"
PATH: Final = "path"
COMPILE_SECONDS: Final = "compileSeconds"
SIZE_BYTES: Final = "sizeBytes"
VERSIONS: Final = "versions"
MODEL_REVISION: Final = "modelRevision"
REFERENCES: Final = "references"
# Any command's failure (and serve's refusals):
REASON: Final = "reason"
MESSAGE: Final = "message"
OUTPUT_CHECK_SUMMARY: Final = "outputCheck"
# gc's summary:
REMOVED: Final = "removed"
SKIPPED: Final = "skipped"
FREED_BYTES: Final = "freedBytes"

# Failure reasons. CamelCase, like Kubernetes condition reasons; the operator carries those a
# user must act on into its conditions.
INVALID_SETTINGS: Final = "InvalidSettings"
MODEL_NOT_FOUND: Final = "ModelNotFound"
MODEL_ACCESS_DENIED: Final = "ModelAccessDenied"
#: The download failed for another reason than the repository (DNS, proxy, TLS, timeout, the
#: hub's 5xx, a full claim): the message names the cause and the setting that fixes it.
MODEL_DOWNLOAD_FAILED: Final = "ModelDownloadFailed"
#: serve: no catalog entry for its shape.
ARTIFACT_MISMATCH: Final = "ArtifactMismatch"
#: precompile: the artifact would not fit on the cache claim, by the size of the last one of
#: its shape there; nothing was compiled.
INSUFFICIENT_CACHE_SPACE: Final = "InsufficientCacheSpace"
#: The artifact dir does not match its manifest (missing, truncated, changed) or has none.
ARTIFACT_CORRUPT: Final = "ArtifactCorrupt"
COMPILE_FAILED: Final = "CompileFailed"
ENGINE_FAILED: Final = "EngineFailed"
CATALOG_ERROR: Final = "CatalogError"
#: Stopped by a signal (a drain, a node shutting down).
TERMINATED: Final = "Terminated"
UNSUPPORTED_CONFIGURATION: Final = "UnsupportedConfiguration"
#: The image's vLLM or sendnn-inference is not a version this spyre-engine supports.
UNSUPPORTED_BASE: Final = "UnsupportedBase"
#: gc: the API server could not be asked which artifacts are in use; nothing was removed.
IN_USE_UNKNOWN: Final = "InUseUnknown"
#: serve: the engine's answers left the artifact's reference answers.
OUTPUT_MISMATCH: Final = "OutputMismatch"
#: serve as a canary: its own requests broke the model's bounds.
CANARY_FAILED: Final = "CanaryFailed"

# serve's paths: the kubelet's probes, and the reports the operator reads from each pod.
STARTUP_PATH: Final = "/health/startup"
READY_PATH: Final = "/health/ready"
LIVE_PATH: Final = "/health/live"
#: A canary's own count of the requests it judged.
CANARY_REPORT_PATH: Final = "/health/canary"
#: What a pod served since Ready.
SERVED_REPORT_PATH: Final = "/health/served"


def json_objects_last_first(text: str) -> Iterator[dict[str, Any]]:
    """The lines of ``text`` that are JSON objects, the last first.

    A termination message may be cut short by the kubelet or carry the log's tail before the
    line (FallbackToLogsOnError), so both sides read it from its end.
    """
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield doc
