"""Engine settings: pydantic models filled from flags and ``SPYRE_ENGINE_*`` environment variables.

Every field ``foo_bar`` is the flag ``--foo-bar`` and the variable ``SPYRE_ENGINE_FOO_BAR``
(spyre_contract ``flag``, ``env_name``); a flag beats the variable. Pure (no vLLM/torch): read
before vLLM is imported. The operator does not import it (its image has no pydantic models of the
engine): the flags it writes are spyre_contract's, each one of these fields
(tests/unit/test_contract.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The names the operator shares (tasks, backends, how a field is a flag and a variable).
from spyre_contract import COMPILE_ONLY_BACKEND as COMPILE_ONLY_BACKEND
from spyre_contract import ENV_PREFIX as ENV_PREFIX
from spyre_contract import POOLING_TASKS as POOLING_TASKS
from spyre_contract import SENDNN_BACKENDS as SENDNN_BACKENDS
from spyre_contract import TERMINATION_LOG_PATH
from spyre_contract import Backend as Backend
from spyre_contract import Task as Task
from spyre_contract import env_name as env_name
from spyre_contract import flag as _flag

# The plugin prefills in chunks and pads prompts to multiples of 64 tokens.
SPYRE_BLOCK = 64

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


class WarmupShape(BaseModel):
    """One static shape a pooling model is compiled for: prompt length x batch size."""

    model_config = ConfigDict(frozen=True)

    prompt_len: int = Field(ge=SPYRE_BLOCK, description="Padded prompt length in tokens")
    batch_size: int = Field(ge=1, description="Number of sequences in the batch")

    def __str__(self) -> str:
        return f"{self.prompt_len}x{self.batch_size}"


def parse_warmup_shapes(value: str | Sequence[Any] | None) -> list[WarmupShape]:
    """Parse ``"64x4,128x2"`` (promptLen x batchSize) into shapes; accepts lists as well."""
    if value is None:
        return []
    if isinstance(value, str):
        shapes = []
        for part in value.split(","):
            if not part.strip():
                continue
            match = _SHAPE_RE.match(part)
            if not match:
                raise ValueError(f"warmup shape {part.strip()!r} is not PROMPTLENxBATCHSIZE")
            shapes.append(WarmupShape(prompt_len=int(match[1]), batch_size=int(match[2])))
        return shapes
    return [s if isinstance(s, WarmupShape) else WarmupShape.model_validate(s) for s in value]


def format_warmup_shapes(shapes: Sequence[WarmupShape]) -> str:
    """Inverse of :func:`parse_warmup_shapes`."""
    return ",".join(str(s) for s in shapes)


class EngineSettings(BaseModel):
    """Settings of ``precompile`` and ``serve``: what model, which shape, where the graphs are."""

    # Tasks and backends as their plain names (the contract's enums only check them).
    model_config = ConfigDict(extra="forbid", validate_default=True, use_enum_values=True)

    model: str = Field(
        description="Model: a local path, pvc://CLAIM/PATH (under --pvc-root) or "
        "hf://ORG/NAME[@REVISION] (downloaded into --hf-cache-dir)"
    )
    served_name: str | None = Field(
        None, description="Model name in the OpenAI API (default: the model's directory name)"
    )
    task: Task = Field(
        Task.GENERATE, description="generate, or a pooling task: embed, score, rerank"
    )
    artifact_dir: Path = Field(
        description="Directory holding the compiled graphs and pre_compiled_cache_catalog.json"
    )
    artifact_key: str | None = Field(
        None, description="Opaque key of the artifact (reported in summary and metrics)"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="Number of Spyre cards (AIUs)")
    max_model_len: int = Field(2048, ge=SPYRE_BLOCK, description="Maximum context length")
    max_num_seqs: int = Field(4, ge=1, description="Maximum batch size (decoders)")
    max_num_batched_tokens: int | None = Field(
        None, ge=SPYRE_BLOCK, description="Prefill chunk size; a multiple of 64"
    )
    warmup_shapes: list[WarmupShape] = Field(
        default_factory=list, description="Pooling only: static shapes, e.g. 64x4,128x2"
    )
    backend: Backend = Field(
        Backend.SENDNN, description="Dynamo backend: sendnn, sendnn_compile_only, inductor, eager"
    )
    termination_log: Path | None = Field(
        Path(TERMINATION_LOG_PATH), description="Where the one-line JSON summary is written"
    )
    hf_cache_dir: Path | None = Field(None, description="Download directory for hf:// models")
    pvc_root: Path = Field(
        Path("/mnt/pvc"), description="Mount root that pvc://CLAIM/PATH is under"
    )
    vllm_args: list[str] = Field(
        default_factory=list, description="Extra vLLM arguments (after --; env: shell words)"
    )

    @field_validator("warmup_shapes", mode="before")
    @classmethod
    def _shapes(cls, value: Any) -> list[WarmupShape]:
        return parse_warmup_shapes(value)

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _words(cls, value: Any) -> Any:
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model must not be empty")
        if value.startswith("hf://") and not value[5:].split("@")[0].strip("/"):
            raise ValueError("hf:// model needs ORG/NAME")
        return value

    @model_validator(mode="after")
    def _shape_rules(self) -> EngineSettings:
        if self.is_pooling:
            if not self.warmup_shapes:
                raise ValueError(f"task {self.task} needs --warmup-shapes (e.g. 64x4)")
            for shape in self.warmup_shapes:
                if shape.prompt_len % SPYRE_BLOCK:
                    raise ValueError(
                        f"--warmup-shapes prompt length {shape.prompt_len} is not a multiple of 64"
                    )
                if shape.prompt_len > self.max_model_len:
                    raise ValueError(
                        f"warmup prompt length {shape.prompt_len} exceeds max model len "
                        f"{self.max_model_len}"
                    )
        elif self.warmup_shapes:
            raise ValueError("--warmup-shapes is for pooling tasks only (embed, score, rerank)")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens % SPYRE_BLOCK:
            raise ValueError(
                f"--max-num-batched-tokens {self.max_num_batched_tokens} is not a multiple of 64"
            )
        return self

    @property
    def is_pooling(self) -> bool:
        """True for embed/score/rerank, which use static warmup shapes instead of a decoder."""
        return self.task in POOLING_TASKS


class PrecompileSettings(EngineSettings):
    """Settings of ``spyre-engine precompile``."""

    compile_timeout: float = Field(3600.0, gt=0, description="Give up compiling after SECONDS")
    require_known_config: bool = Field(
        True,
        description="sendnn backends: refuse a model x shape that is not in the plugin's "
        "model_configs.yaml (SENDNN_INFERENCE_REQUIRE_KNOWN_CONFIG=1); --no-require-known-config "
        "lets the plugin cap it instead",
    )
    reference_answers: Literal["record", "off"] = Field(
        "record",
        description="Record the artifact's reference answers (a greedy generation of a small "
        "prompt set: token ids and logprobs; decoders only) that serving engines check their "
        "own answers against before they turn Ready",
    )
    reference_max_tokens: int = Field(
        16, ge=1, le=128, description="Tokens generated per reference prompt"
    )


class ServeSettings(EngineSettings):
    """Settings of ``spyre-engine serve``."""

    host: str = Field("0.0.0.0", description="Address the public port binds to")
    port: int = Field(8000, ge=1, le=65535, description="Public port (API, metrics, probes)")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve /metrics on this port alone (the public port then answers 404 "
        "there), so a NetworkPolicy can admit Prometheus to the metrics and to nothing else",
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="On SIGTERM, let in-flight requests run this many SECONDS"
    )
    prefix_caching: bool = Field(True, description="Enable vLLM prefix caching")
    internal_port: int | None = Field(
        None, ge=1, le=65535, description="Loopback port of the vLLM server (default: a free one)"
    )
    verify_artifact: Literal["checksums", "sizes", "off"] = Field(
        "checksums",
        description="Before loading, check the artifact against the manifest precompile wrote: "
        "sizes and sha256 (checksums), sizes only (sizes; reads no file), or not at all (off)",
    )
    output_check: Literal["enforce", "warn", "off"] = Field(
        "enforce",
        description="Before turning Ready, answer the artifact's reference prompts and compare "
        "(answers.py): a mismatch stops the engine with OutputMismatch (enforce), is logged "
        "(warn), or nothing is asked (off). An artifact without reference answers is served",
    )
    output_verified: str | None = Field(
        None,
        description="This artifact passed its output check before (the operator says where, "
        "from the model's <model>-output-check ConfigMap): the check is skipped if the model's "
        "files are those its reference answers were recorded from, else it runs",
    )
    output_check_tolerance: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Largest difference of a token's probability from the reference's "
        "(default: upstream's, 0.08; 0.17 for a quantized model)",
    )

    canary_seconds: float = Field(
        0.0,
        ge=0,
        description="Serve as a canary for this many SECONDS from Ready (canary.py): while the "
        "window is open, inference requests breaking the bounds below stop the engine with "
        "CanaryFailed (readiness fails first, then it drains). 0: not a canary",
    )
    canary_max_error_ratio: float = Field(
        0.05, ge=0, le=1, description="Canary bound: the largest share of server errors (5xx)"
    )
    canary_min_requests: int = Field(
        10, ge=1, description="Canary: requests answered before the bounds are judged"
    )
    canary_max_mean_latency: float | None = Field(
        None, gt=0, description="Canary bound: the largest mean request latency in SECONDS"
    )
    max_in_flight: int | None = Field(
        None,
        ge=1,
        le=100000,
        description="Requests in flight at once on this pod; past it the engine answers 429 "
        "with Retry-After at once (default: 8 x --max-num-seqs, at least 64)",
    )
    body_timeout: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="SECONDS a client may take to send its request body; past it 408 and the "
        "connection is closed (a slow client no longer holds a request slot)",
    )
    fault_error_ratio: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Tests and chaos drills: answer this share of inference requests (POST "
        "/v1/...) with HTTP 500 without forwarding them, evenly (every 1/RATIO-th). 0: none",
    )

    @model_validator(mode="after")
    def _distinct_ports(self) -> ServeSettings:
        if self.metrics_port is not None and self.metrics_port in (self.port, self.internal_port):
            raise ValueError(
                f"--metrics-port {self.metrics_port} must differ from --port and --internal-port"
            )
        return self

    @model_validator(mode="after")
    def _serving_backend(self) -> ServeSettings:
        if self.backend == COMPILE_ONLY_BACKEND:
            raise ValueError(
                f"--backend {COMPILE_ONLY_BACKEND} only compiles (the plugin sets "
                "FLEX_DEVICE=COMPILE, so nothing runs on the cards): precompile with it, then "
                "serve its artifact with --backend sendnn"
            )
        return self


class CacheSettings(BaseModel):
    """Settings of ``spyre-engine usage`` and ``spyre-engine gc`` (the cache volume's root)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    cache_root: Path = Field(
        Path("/cache"), description="Root of the cache volume (artifacts are in <root>/artifacts)"
    )
    remove: list[str] = Field(
        default_factory=list, description="gc: artifact keys to remove, comma-separated"
    )
    keep: list[str] = Field(
        default_factory=list,
        description="gc: every artifact key a SpyreModel or a Deployment still knows, "
        "comma-separated (with --orphans-unused-for: any other dir is an orphan)",
    )
    orphans_unused_for: float | None = Field(
        None,
        ge=0,
        description="gc: also remove orphans (dirs not in --keep or --remove) this many "
        "seconds after a gc first found them; unset: leave them",
    )
    keep_models: list[str] | None = Field(
        None,
        description="gc: every hf:// model (ORG/NAME[@REVISION]) a SpyreModel on the claim "
        "names, comma-separated (with --orphans-unused-for: other downloaded models, and old "
        "snapshots of these, are removed from <root>/hub once unnamed that long); unset: "
        "downloaded models are left alone",
    )
    claim: str | None = Field(
        None,
        description="gc: the cache claim's PVC name; set, each removal first asks the API "
        "server whether a pod, Job or Deployment of --namespace uses the key on this claim "
        "now (and removes nothing if it cannot tell); unset: no such check",
    )
    namespace: str | None = Field(
        None,
        description="gc: the namespace of --claim (default: the pod's own, from its "
        "ServiceAccount)",
    )
    termination_log: Path | None = Field(
        Path(TERMINATION_LOG_PATH), description="Where the one-line JSON summary is written"
    )

    @field_validator("remove", "keep", "keep_models", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> Any:
        """Comma-separated, or a JSON array of strings (what the operator sets in
        SPYRE_ENGINE_KEEP_MODELS: an empty list is a list, where an empty variable is unset)."""
        if isinstance(value, str) and value.strip().startswith("["):
            doc = json.loads(value)
            if not isinstance(doc, list) or not all(isinstance(k, str) for k in doc):
                raise ValueError("a JSON list must hold strings only")
            return doc
        if isinstance(value, str):
            return [k for k in (p.strip() for p in value.split(",")) if k]
        return value


def add_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Add one flag per settings field; defaults are suppressed so env and model defaults apply."""
    for name, info in model.model_fields.items():
        help_text = f"{info.description or ''} [env {env_name(name)}]"
        if name == "vllm_args":
            continue  # taken from after "--"
        kind = info.annotation
        choices: Sequence[str] | None = (
            get_args(kind) if get_origin(kind) is Literal
            else [m.value for m in kind] if isinstance(kind, type) and issubclass(kind, Enum)
            else None
        )
        if info.annotation is bool:
            parser.add_argument(
                _flag(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                _flag(name), dest=name, default=argparse.SUPPRESS, choices=choices, help=help_text
            )


def settings_from_sources(
    model: type[EngineSettings],
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
) -> Any:
    """Build settings: flag value if given, else ``SPYRE_ENGINE_<FIELD>`` if set, else default."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name in model.model_fields:
        if name in flags and flags[name] is not None:
            values[name] = flags[name]
        elif env_name(name) in env:
            raw = env[env_name(name)]
            if raw == "" and model.model_fields[name].annotation is not str:
                continue
            values[name] = raw
    return model.model_validate(values)


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Split ``argv`` at the first ``--``: (our args, vLLM args or None when absent)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, None
