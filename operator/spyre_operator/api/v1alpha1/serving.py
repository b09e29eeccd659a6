"""How a model serves: environment, resources, rollout, the API key, allowed clients, the
canary and ``spec.serving``."""

from __future__ import annotations

from typing import Annotated, Literal

import spyre_contract as contract
from pydantic import ConfigDict, Field, model_validator

from .common import ApiModel, FreeForm, Quantity, cel, keys_are_qualified_names


class EnvVar(ApiModel):
    """An environment variable for the engine container (as in a Pod spec)."""

    name: str = Field(description="Variable name.", min_length=1, max_length=253)
    value: str | None = Field(default=None, description="Literal value.")
    value_from: FreeForm | None = Field(
        default=None,
        description="Source for the value (secretKeyRef, configMapKeyRef, fieldRef, ...).",
    )


class ResourceRequirements(ApiModel):
    """Compute resources (as in a Pod spec); Spyre cards are added by the operator."""

    # Bounded, like every string a CEL rule reads: the API server refuses a CRD whose rules
    # could cost too much on the largest object.
    requests: dict[str, Quantity] | None = Field(
        default=None, description="Minimum resources.", max_length=32
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, description="Maximum resources.", max_length=32
    )


class RolloutSpec(ApiModel):
    """How the serving Deployment replaces pods. Cards are scarce, so surge is 0 by default."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    # absent fields take their defaults (maxUnavailable 1) after this check
                    "(has(self.maxSurge) && self.maxSurge > 0) || !has(self.maxUnavailable) "
                    "|| self.maxUnavailable > 0",
                    "serving.rollout: maxSurge and maxUnavailable cannot both be 0 (the "
                    "Deployment could never replace a pod); set maxUnavailable: 1, or maxSurge: "
                    "1 if a spare card exists",
                )
            ]
        }
    )

    max_surge: int = Field(default=0, ge=0, description="Extra pods above replicas during a roll.")
    max_unavailable: int = Field(
        default=1, ge=0, description="Pods that may be unavailable during a roll."
    )

    @model_validator(mode="after")
    def _can_roll(self) -> RolloutSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0")
        return self


#: vLLM options the engine sets from spec. The admission rule refuses them as vLLM reads them:
#: underscores for dashes, ``=VALUE`` or not, ``-tp``, and abbreviations (``--max-num-seq``,
#: MANAGED_ARG_ABBREVIATIONS). ``--config FILE`` is beyond a pattern: the engine refuses it with
#: vLLM's own parser (engine/spyre_engine/vllm_args.py), which the pod's status then shows.
MANAGED_ARGS = (
    "--model",
    "--served-model-name",
    "--tensor-parallel-size",
    "-tp",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--port",
    "--host",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--runner",
    "--convert",
    "--shutdown-timeout",
    # Secrets: in args they land in the pod spec, status.servedSpec and the engine's log.
    "--api-key",
    "--hf-token",
)
#: vLLM accepts any unambiguous abbreviation of a long option (``--max-model-l``): the shortest
#: one of each managed option among the installed vLLM's ``serve`` options (``--model`` has none:
#: every prefix is shared with ``--model-impl`` and others). Every longer prefix is refused too.
#: tests/engine/test_vllm_args.py checks them against vLLM's parser: each refused prefix sets
#: the managed option or is ambiguous, and no other vLLM option is refused.
MANAGED_ARG_ABBREVIATIONS = {
    "--served-model-name": len("--ser"),
    "--tensor-parallel-size": len("--te"),
    "--max-model-len": len("--max-m"),
    "--max-num-seqs": len("--max-num-se"),
    "--max-num-batched-tokens": len("--max-num-b"),
    "--port": len("--por"),
    "--host": len("--ho"),
    "--enable-prefix-caching": len("--enable-pre"),
    "--no-enable-prefix-caching": len("--no-enable-pre"),
    "--runner": len("--ru"),
    "--convert": len("--conv"),
    "--shutdown-timeout": len("--shu"),
    "--api-key": len("--api-k"),
    "--hf-token": len("--hf-t"),
}


def _spelled(option: str) -> str:
    """``option`` as vLLM reads it: ``_`` for ``-`` after the leading dashes, and (for a long
    option with an abbreviation) any prefix at least that long."""
    if not option.startswith("--"):
        return option
    shortest = MANAGED_ARG_ABBREVIATIONS.get(option, len(option))

    def chars(text: str) -> list[str]:
        return ["[-_]" if c == "-" else c for c in text]

    head = "--" + "".join(chars(option[2:shortest]))
    tail = ""
    for c in reversed(chars(option[shortest:])):
        tail = f"({c}{tail})?"
    return head + tail


#: An argument that sets one of MANAGED_ARGS (RE2 and Python alike).
MANAGED_ARG_PATTERN = "^(" + "|".join(_spelled(a) for a in MANAGED_ARGS) + ")(=.*)?$"
#: The admission rule matches the pattern on an argument's first MANAGED_ARG_HEAD characters
#: only: longer than every managed option, so the answer is the same (a managed option matches
#: only followed by the end or ``=``), and CEL's cost of a regex grows with the length of the
#: string times the pattern's: 64 arguments of 1024 characters neared the API server's per-call
#: limit. tests/unit/test_admission_limits.py checks both.
MANAGED_ARG_HEAD = 48
EXTRA_ARGS_RULE = (
    f"self.all(a, !(size(a) > {MANAGED_ARG_HEAD} ? a.substring(0, {MANAGED_ARG_HEAD}) : a)"
    f".matches('{MANAGED_ARG_PATTERN}'))"
)


#: Environment the operator sets on engine containers; users may not override it. The one list
#: shared by the CEL rule below, the artifact key (never part of it) and the pod builders
#: (tests/unit check that the builders set nothing else).
OPERATOR_ENV = (
    # the plugin's backend and torch_sendnn's cache, from --backend and --artifact-dir; the
    # engine sets them from its flags as well, and the image may bake no other values
    "TORCH_SENDNN_CACHE_ENABLE",
    "TORCH_SENDNN_CACHE_DIR",
    "SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS",
    "SENDNN_INFERENCE_DYNAMO_BACKEND",
    "HF_HUB_OFFLINE",
    "HOME",
    "SPYRE_ENGINE_POD_NAME",
    "SENDNN_INFERENCE_MODEL_CONFIG_FILE",
    # VF or PF, from accelerator.resourceName (desired/pod.py flex_device)
    "FLEX_DEVICE",
    # the CPUs the plugin divides among its workers' threads (DT_PARALLEL_THREADS among them),
    # from serving.resources' cpu, the same in the precompile Job (desired/key.py engine_cpus)
    "SENDNN_INFERENCE_NUM_CPUS",
    # the artifact passed its output check before: from <model>-output-check (desired/verified.py)
    contract.OUTPUT_VERIFIED_ENV,
)
#: Environment the operator sets on the precompile container only, from precompile fields when
#: they are given; serving.env may set it for the serving pods.
PRECOMPILE_ENV = ("SENDNN_INFERENCE_MAX_LOAD_PROCESSES",)


class ApiKeyRef(ApiModel):
    """The Secret key holding the API key clients must send."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field(default="api-key", description="Key in the Secret.", min_length=1)


class AllowedClients(ApiModel):
    """Clients allowed to call the model: pods matching both selectors, or addresses in a CIDR
    (a NetworkPolicy ingress peer, with label maps for selectors)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.cidr) != (has(self.namespaceSelector) || has(self.podSelector))",
                    # the same type serves allowFrom and metricsFrom: the API server's error
                    # names which (spec.serving.metricsFrom[0]: ...)
                    "each entry is either a cidr, or namespaceSelector and/or podSelector",
                )
            ]
        }
    )

    namespace_selector: dict[str, str] | None = Field(
        default=None,
        description=(
            "Labels of the clients' namespaces ({} : every namespace; unset: the model's own "
            "namespace), e.g. kubernetes.io/metadata.name: gateway."
        ),
        max_length=16,
        json_schema_extra=keys_are_qualified_names("namespaceSelector"),
    )
    pod_selector: dict[str, str] | None = Field(
        default=None,
        description="Labels of the client pods ({} or unset: every pod of those namespaces).",
        max_length=16,
        json_schema_extra=keys_are_qualified_names("podSelector"),
    )
    cidr: str | None = Field(
        default=None,
        description="Addresses allowed (a CIDR, e.g. 10.0.0.0/8), for clients outside pods.",
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                # not isCIDR(): CEL's network library needs Kubernetes 1.31, the chart 1.30
                cel("self.matches('^[0-9a-fA-F:.]+/[0-9]{1,3}$')",
                    "cidr must be a CIDR, e.g. 10.0.0.0/8")
            ]
        },
    )


#: vLLM's own API-key check reads it (vllm serve --api-key); set from serving.apiKey.
API_KEY_ENV = "VLLM_API_KEY"


#: canary.deadlineSeconds when unset: the window plus this long for the canary's pods to
#: start (a card's model load is minutes; an image pull on a new node more).
CANARY_START_ALLOWANCE_SECONDS = 1800


class CanarySpec(ApiModel):
    """A new artifact's first pods serve beside the previous artifact's and judge their own
    requests before the Deployment rolls out to it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.deadlineSeconds) || self.deadlineSeconds > "
                    "(has(self.durationSeconds) ? self.durationSeconds : 300)",
                    "canary.deadlineSeconds must exceed canary.durationSeconds",
                ),
            ]
        }
    )

    replicas: int = Field(
        default=1,
        ge=1,
        le=16,
        description=(
            "Canary pods of the new artifact, on top of spec.replicas (they need cards of their "
            "own); the Service spreads requests over every pod, so they get about replicas / "
            "(spec.replicas + replicas) of the traffic."
        ),
    )
    duration_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description=(
            "How long every canary pod serves within its bounds, from the canary's pods all "
            "being available, before the Deployment rolls out to the new artifact."
        ),
    )
    max_error_ratio: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description=(
            "The largest share of a canary pod's inference requests answered with a server "
            "error (5xx); above it, the pod stops with CanaryFailed and the model rolls back."
        ),
    )
    min_requests: int = Field(
        default=10,
        ge=1,
        le=1000000,
        description="Requests a canary pod answers before its bounds are judged.",
    )
    max_mean_latency_seconds: float | None = Field(
        default=None,
        gt=0,
        description=(
            "The largest mean latency of a canary pod's inference requests (to the end of the "
            "answer); unset: latency is not judged."
        ),
    )
    max_latency_ratio: float | None = Field(
        default=2.0,
        ge=1,
        le=100,
        description=(
            "Compared with the baseline: at the window's end, the canary's mean time to first "
            "token and mean time per output token (vLLM's own histograms) may be at most this "
            "many times the previous artifact's pods' over the same window, or the canary "
            "fails with CanaryFailed. Judged when both sides served minRequests in the "
            "window; null: not compared (status.canary.comparison still shows both sides)."
        ),
    )
    deadline_seconds: int | None = Field(
        default=None,
        ge=20,
        le=172800,
        description=(
            "How long the canary may take from its start to its verdict; a canary not passed "
            "by then (its pods never all available, or restarted until the window cannot "
            "end in time) fails with CanaryDeadlineExceeded and the previous artifact keeps "
            "serving. Unset: durationSeconds + "
            f"{CANARY_START_ALLOWANCE_SECONDS}."
        ),
    )

    @model_validator(mode="after")
    def _deadline_after_window(self) -> CanarySpec:
        if self.deadline_seconds is not None and self.deadline_seconds <= self.duration_seconds:
            raise ValueError("canary.deadlineSeconds must exceed canary.durationSeconds")
        return self

    @property
    def deadline(self) -> int:
        """deadlineSeconds, or its default."""
        if self.deadline_seconds is not None:
            return self.deadline_seconds
        return self.duration_seconds + CANARY_START_ALLOWANCE_SECONDS


class ServingSpec(ApiModel):
    """How the inference pods run. Nothing here changes the artifact key but the compile-time
    variables in env and the whole CPUs of resources (the plugin's thread count)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.apiKey) || !has(self.env) "
                    f"|| self.env.all(e, e.name != '{API_KEY_ENV}')",
                    f"serving.env must not set {API_KEY_ENV} when serving.apiKey is set",
                ),
                cel(
                    "!has(self.metricsPort) || self.metricsPort != self.port",
                    "serving.metricsPort must differ from serving.port",
                ),
                cel(
                    "!has(self.metricsFrom) || has(self.metricsPort)",
                    "serving.metricsFrom needs serving.metricsPort (the metrics on a port of "
                    "their own)",
                ),
            ]
        }
    )

    prefix_caching: bool = Field(
        default=True,
        description="Enable vLLM automatic prefix caching (generate models; pooling ignores it).",
    )
    output_check: Literal["Enforce", "Warn", "Off"] = Field(
        default="Enforce",
        description=(
            "Before a serving pod turns Ready, it answers the reference prompts its artifact's "
            "precompile recorded (greedy token ids and logprobs) and compares, as upstream's "
            "tests do. Enforce: a mismatch stops the pod with OutputMismatch, the artifact is "
            "not promoted and the one served before keeps serving. Warn: logged only. Off: no "
            "check, and a precompile under Off records no reference answers (an artifact "
            "without references is served unchecked whatever this says)."
        ),
    )
    canary: CanarySpec | None = Field(
        default=None,
        description=(
            "Promote a new artifact through a canary: once compiled, it first serves on "
            "canary.replicas pods beside the previous artifact's for canary.durationSeconds; a "
            "canary pod whose requests break the bounds stops with CanaryFailed, and the model "
            "keeps the previous artifact (Degraded CanaryFailed). Unset: a new artifact rolls "
            "out as soon as it is compiled. The first artifact of a model has no canary."
        ),
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None,
        description=(
            "Extra vLLM server arguments, appended after the operator's. Flags the operator "
            "derives from spec (" + ", ".join(MANAGED_ARGS) + ") are rejected."
        ),
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    EXTRA_ARGS_RULE,
                    "serving.extraArgs must not set flags derived from spec (model, shape, port, "
                    "prefix caching, task) nor carry secrets (--api-key: use serving.apiKey; "
                    "--hf-token: use model.tokenSecret), in any spelling (--max_model_len=N, "
                    "-tp N): set the spec field instead",
                )
            ]
        },
    )
    env: list[EnvVar] | None = Field(
        default=None,
        description=(
            "Extra environment for the serving container. Variables the Spyre plugin reads at "
            "compile time (see the operator docs) are also passed to the precompile Job and "
            "are part of the artifact key."
        ),
        max_length=128,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                cel(
                    "self.all(e, !(e.name in [" + ", ".join(f"'{n}'" for n in OPERATOR_ENV) + "]))",
                    "serving.env must not set variables the operator manages ("
                    + ", ".join(OPERATOR_ENV)
                    + "); use compile.backend to choose the backend, and "
                    "serving.resources' cpu for SENDNN_INFERENCE_NUM_CPUS",
                )
            ],
        },
    )
    api_key: ApiKeyRef | None = Field(
        default=None,
        description=(
            "Require an API key: requests to every client route (the OpenAI API, tokenize, "
            "pooling, score, rerank; not /health) without the header 'Authorization: Bearer "
            "<key>' are answered 401 (the engine's check, and vLLM's own, given the key as "
            + API_KEY_ENV + "). "
            "The key is read from this Secret in the model's namespace when a pod starts; "
            "/health and /metrics stay open (restrict /metrics with serving.metricsPort and "
            "metricsFrom)."
        ),
    )
    allow_from: list[AllowedClients] | None = Field(
        default=None,
        description=(
            "Who may call the model: the operator writes a NetworkPolicy admitting only these "
            "clients to the serving port (list your gateway, any client, and your Prometheus "
            "unless the metrics have a port of their own, serving.metricsPort). [] admits "
            "nobody but the scale-to-zero interceptor (when scale to zero is on); unset: no "
            "NetworkPolicy (unless metricsFrom is set). Enforced only where the cluster's "
            "network plugin implements NetworkPolicy."
        ),
        max_length=32,
    )
    metrics_from: list[AllowedClients] | None = Field(
        default=None,
        description=(
            "Who may scrape the metrics port (serving.metricsPort), e.g. your Prometheus's "
            "namespace: the NetworkPolicy admits them to the metrics and not to the API. "
            "Unset: the metrics port admits the same clients as the serving port (allowFrom; "
            "everyone when allowFrom is unset). Setting it alone writes a NetworkPolicy that "
            "leaves the serving port open."
        ),
        max_length=32,
    )
    port: int = Field(default=8000, ge=1024, le=65535, description="HTTP port of the server.")
    metrics_port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description=(
            "Serve /metrics on this port (named 'metrics') alone; the serving port then answers "
            "404 there. Lets a NetworkPolicy (metricsFrom) admit Prometheus to the metrics "
            "without the API. Unset: /metrics on serving.port."
        ),
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=(
            "CPU/memory for the serving container. Its cpu (limits, else requests), rounded up "
            "to whole CPUs, is given to the Spyre plugin as SENDNN_INFERENCE_NUM_CPUS in the "
            "serving pods and in the precompile Job alike: the plugin divides it among its "
            "tensor-parallel workers' threads (DT_PARALLEL_THREADS, which the compiler uses), "
            "so it is part of the artifact key. No cpu: the plugin counts each pod's CPUs "
            "itself."
        ),
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description=(
            "Requests one serving pod takes at once; past it the pod answers 429 with "
            "Retry-After at once, unread. Unset: 8 x compile.maxNumSeqs, at least 64."
        ),
    )
    body_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description=(
            "How long a client may take to send its request body; past it the pod answers 408 "
            "and closes the connection. Unset: 60."
        ),
    )
    shutdown_grace_period_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description=(
            "Drain deadline on shutdown: in-flight requests may finish for this long. The pod's "
            "terminationGracePeriodSeconds is this plus a safety margin."
        ),
    )
    pod_annotations: dict[str, str] | None = Field(
        default=None,
        description="Annotations added to the serving pods.",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("serving.podAnnotations"),
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Rolling-update limits of the Deployment."
    )
