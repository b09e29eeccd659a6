"""SpyreModel v1alpha1: spec and status as pydantic models.

These models are the single source of truth for the API: the CRD in ``crds/`` is generated
from them (``spyre-operator crd``), defaults live here and so in the CRD schema, and the
``x-kubernetes-validations`` (CEL) rules attached below are what the API server enforces at
admission. Every field carries a description because ``kubectl explain`` shows it.

Per-site fields (the engine image and its pull secrets, the card resource, the scheduler, node
placement, the cache's StorageClass) have no default here: the API server would write it into
every object at creation and an operator upgrade or an admin's change would never reach it.
Left unset, they follow the operator's defaults at every reconcile (``desired/site.py``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------

#: Regular expression for a Kubernetes resource quantity (as in apimachinery).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: domain/name of an extended resource (e.g. ibm.com/spyre_vf); the domain has a dot.
EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
MODEL_URI_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+(@[A-Za-z0-9._/-]+)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^@]*)$"
)

#: A positive quantity: no sign but "+", and a non-zero digit before any suffix or exponent
#: (with QUANTITY_PATTERN: "0", "0.0", "-1Gi" and "0e3" are not).
POSITIVE_QUANTITY_PATTERN = "^[+]?0*[.]?0*[1-9]"
#: The most characters of a name that becomes a label value (a cache claim's, on its PVC, Jobs
#: and pods: serving.spyre.dev/cache-claim).
MAX_LABEL_VALUE = 63
#: The most characters of a SpyreModel's name: its Events are named ``<name>.<16 hex>`` and an
#: object name has at most 253 (desired/names.py, event_name).
MAX_MODEL_NAME = 253 - 17
#: A DNS subdomain (RFC 1123), like every PVC name.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A label value (with at most 63 characters), as the API server checks a pod's nodeSelector.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: A label or annotation key: an optional DNS-subdomain prefix and "/", then a name of at most
#: 63 characters (no backslash: the same text is a CEL string).
QUALIFIED_NAME = (
    "([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def _keys_are_qualified_names(what: str) -> dict[str, Any]:
    """A map whose keys become label or annotation keys of a pod (else every write of the pod
    template is refused)."""
    return {
        "x-kubernetes-validations": [
            cel(
                f"self.all(k, k.matches('^{QUALIFIED_NAME}$'))",
                f"{what} keys must be label keys: an optional DNS-name prefix and '/', then at "
                "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
                "or digit",
            )
        ]
    }


#: Node labels a pod must match: label keys and label values (at most 63 characters).
NodeSelector = dict[
    str, Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_PATTERN)]
]

Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
            "x-kubernetes-int-or-string": True,
            # A negative or zero size or resource would pass the pattern; the PVC or pod built
            # from it would then be refused on every write.
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self > 0 : "
                    f"self.matches('{POSITIVE_QUANTITY_PATTERN}')",
                    "message": "must be a positive quantity (more than 0), e.g. 50Gi, 2 or 500m",
                }
            ],
        }
    ),
]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry."""
    return {"rule": rule, "message": message, **extra}


class ApiModel(BaseModel):
    """Base for API objects: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_enum_values=True,
    )


class Task(StrEnum):
    """What the model serves."""

    GENERATE = "generate"
    EMBED = "embed"
    SCORE = "score"
    RERANK = "rerank"


class Backend(StrEnum):
    """The torch dynamo backend the Spyre plugin compiles with."""

    SENDNN = "sendnn"
    SENDNN_COMPILE_ONLY = "sendnn_compile_only"
    INDUCTOR = "inductor"
    EAGER = "eager"


POOLING_TASKS = frozenset({Task.EMBED, Task.SCORE, Task.RERANK})

# --------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------


class SecretKeyRef(ApiModel):
    """A key of a Secret in the SpyreModel's namespace."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field(default="token", description="Key in the Secret.", min_length=1)


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the SpyreModel's namespace."""

    name: str = Field(description="ConfigMap name.", min_length=1, max_length=253)
    key: str = Field(description="Key in the ConfigMap, e.g. ca.crt.", min_length=1)


class ModelSource(ApiModel):
    """Where the model weights come from."""

    uri: str = Field(
        description=(
            "Model location: hf://org/name[@revision] (downloaded into the cache volume by the "
            "precompile Job) or pvc://claim/path (a PVC in this namespace holding the weights). "
            "Pin a revision for reproducible artifacts; the revision is part of the artifact key."
        ),
        max_length=512,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matches('{MODEL_URI_PATTERN}')",
                    "model.uri must be hf://org/name[@revision] or pvc://claim/path",
                )
            ]
        },
    )
    served_name: str | None = Field(
        default=None,
        description=(
            "Model name clients send in OpenAI requests. Defaults to the uri's name "
            "(org/name for hf://, the last path element for pvc://)."
        ),
        max_length=253,
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description=(
            "A Secret key holding a Hugging Face token, for gated and private hf:// models. "
            "Given to the precompile Job only (as HF_TOKEN): serving pods load from the cache "
            "and never download."
        ),
    )
    download_env: list[EnvVar] | None = Field(
        default=None,
        description=(
            "Environment for downloading hf:// models, given to the precompile Job only: "
            "HF_ENDPOINT (a mirror), HTTPS_PROXY/HTTP_PROXY/NO_PROXY, HF_HUB_ETAG_TIMEOUT, ... "
            "Not part of the artifact key."
        ),
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                cel(
                    "self.all(e, !(e.name in ['HF_TOKEN', 'HF_HUB_OFFLINE', "
                    "'REQUESTS_CA_BUNDLE', 'SSL_CERT_FILE']))",
                    "model.downloadEnv must not set HF_TOKEN (use model.tokenSecret), "
                    "HF_HUB_OFFLINE (the operator sets it), or the CA bundle variables (use "
                    "model.caBundle)",
                )
            ],
        },
    )
    ca_bundle: ConfigMapKeyRef | None = Field(
        default=None,
        description=(
            "A ConfigMap key with PEM CA certificates for the download (a proxy or a mirror "
            "with a private CA); mounted in the precompile Job only."
        ),
    )


class WarmupShape(ApiModel):
    """A static (prompt length, batch size) shape a pooling model is compiled for."""

    prompt_len: int = Field(
        description="Padded prompt length in tokens; a multiple of 64.",
        ge=64,
        le=131072,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self % 64 == 0", "warmupShapes[].promptLen must be a multiple of 64")
            ]
        },
    )
    batch_size: int = Field(description="Batch size compiled for this shape.", ge=1, le=256)


class CompileSpec(ApiModel):
    """The compile shape: every field here is part of the artifact key."""

    tensor_parallel_size: int | None = Field(
        default=None,
        description=(
            "Spyre cards per replica (tensor parallel size): 1, 2, 4 or 8. Omitted: the fewest "
            "cards the plugin supports the model with (status.compile says which)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self in [1, 2, 4, 8]",
                    "tensorParallelSize must be 1, 2, 4 or 8 (Spyre cards per replica)",
                )
            ]
        },
    )
    max_model_len: int | None = Field(
        default=None,
        description=(
            "Maximum context length in tokens (vLLM --max-model-len). Omitted: the longest the "
            "plugin supports for the model at this tensorParallelSize (status.compile says "
            "which). Ignored by pooling models, which compile per warmup shape."
        ),
        ge=64,
        le=131072,
    )
    max_num_seqs: int | None = Field(
        default=None,
        description=(
            "Maximum concurrent sequences, the decode batch size (vLLM --max-num-seqs). "
            "Omitted: the plugin's supported value for the model and the other fields "
            "(status.compile). Ignored by pooling models."
        ),
        ge=1,
        le=256,
    )
    max_num_batched_tokens: int = Field(
        default=1024,
        description=(
            "Prefill chunk size in tokens (vLLM --max-num-batched-tokens); a multiple of 64."
        ),
        ge=64,
        le=131072,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self % 64 == 0",
                    "maxNumBatchedTokens (the prefill chunk size) must be a multiple of 64",
                )
            ]
        },
    )
    warmup_shapes: list[WarmupShape] | None = Field(
        default=None,
        description=(
            "Static shapes for pooling models (task embed, score or rerank), rejected for "
            "generate models. Omitted: the plugin's supported shapes for the model (a model the "
            "plugin does not list by name needs them)."
        ),
        max_length=16,
    )
    require_known_configuration: bool = Field(
        default=True,
        description=(
            "sendnn: compile only model x shape combinations the plugin's model_configs.yaml "
            "lists (UnsupportedConfiguration, naming the supported shapes: from the operator "
            "for a model the list names by id, else from the precompile Job, which matches the "
            "model's config); false lets the plugin cap an unknown configuration instead, and "
            "an omitted shape of an unlisted model falls back to 1 card, 4096 tokens, 4 "
            "sequences. Part of the artifact key when false."
        ),
    )
    supported_model: str | None = Field(
        default=None,
        description=(
            "The plugin's model_configs.yaml entry (e.g. ibm-granite/granite-3.3-8b-instruct) "
            "whose supported shapes fill the omitted shape fields and bound the explicit ones, "
            "for a model whose uri does not name it: a mirror, a copy on a PVC, a fine-tune of "
            "the same architecture. Default: the entry model.uri names. The precompile Job "
            "still checks the shape with the plugin's own matcher on the model's config."
        ),
        max_length=253,
    )
    model_config_file: ConfigMapKeyRef | None = Field(
        default=None,
        description=(
            "A site model_configs.yaml in a ConfigMap key, used instead of the plugin's "
            "(SENDNN_INFERENCE_MODEL_CONFIG_FILE), mounted in the precompile Job and the "
            "serving pods. Its name and key are part of the artifact key (its content is not: "
            "use a new ConfigMap name for new content)."
        ),
    )
    backend: Backend = Field(
        default=Backend.SENDNN,
        description=(
            "Backend the serving pods run: sendnn (Spyre cards, production) or the CPU backends "
            "inductor and eager (testing without Spyre cards). With sendnn the precompile Job "
            "compiles with sendnn_compile_only on a CPU node (no cards held during the compile; "
            "see precompile.onCards); the artifact is the same, and so is its key."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self != 'sendnn_compile_only'",
                    "compile.backend is what the serving pods run, and sendnn_compile_only "
                    "cannot serve: set sendnn; the precompile Job already compiles with "
                    "sendnn_compile_only on a CPU node (precompile.onCards: false)",
                )
            ]
        },
    )


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
    "SPYRE_ENGINE_OUTPUT_VERIFIED",
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
        json_schema_extra=_keys_are_qualified_names("namespaceSelector"),
    )
    pod_selector: dict[str, str] | None = Field(
        default=None,
        description="Labels of the client pods ({} or unset: every pod of those namespaces).",
        max_length=16,
        json_schema_extra=_keys_are_qualified_names("podSelector"),
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
        json_schema_extra=_keys_are_qualified_names("serving.podAnnotations"),
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Rolling-update limits of the Deployment."
    )


class PrecompileSpec(ApiModel):
    """The precompile Job. Nothing here changes the artifact key."""

    backoff_limit: int = Field(
        default=1, ge=0, le=10, description="Retries of a failed compile pod."
    )
    active_deadline_seconds: int = Field(
        default=7200, ge=60, description="Wall-clock limit of the precompile Job."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="CPU/memory for the precompile container."
    )
    pod_annotations: dict[str, str] | None = Field(
        default=None,
        description="Annotations added to the precompile pod.",
        max_length=64,
        json_schema_extra=_keys_are_qualified_names("precompile.podAnnotations"),
    )
    max_load_processes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many tensor-parallel workers of the precompile pod load and compile the model "
            "at once (SENDNN_INFERENCE_MAX_LOAD_PROCESSES, given to the precompile Job only): "
            "fewer use less memory when compiling with tensorParallelSize > 1, and take "
            "longer; 0 is no limit. Unset: the operator's default (its "
            "--default-precompile-max-load-processes), else the plugin's (no limit). Not part "
            "of the artifact key."
        ),
    )
    on_cards: bool = Field(
        default=False,
        description=(
            "For compile.backend sendnn: compile on the Spyre cards (the Job requests "
            "tensorParallelSize cards through the accelerator's scheduler) instead of with "
            "sendnn_compile_only on a CPU node (the default: the cards keep serving while a new "
            "artifact compiles). Ignored by the CPU backends, which never use cards."
        ),
    )
    node_selector: NodeSelector | None = Field(
        default=None,
        max_length=64,
        json_schema_extra=_keys_are_qualified_names("precompile.nodeSelector"),
        description=(
            "Node labels the precompile pod must match when it compiles off the cards "
            "(e.g. a CPU pool with enough memory for the compiler). Unset: the operator's "
            "default (chart defaults.precompile.nodeSelector); {} for none."
        ),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations of the precompile pod when it compiles off the cards. Unset: the "
            "operator's default (chart defaults.precompile.tolerations); [] for none."
        ),
    )


class EngineSpec(ApiModel):
    """The engine image (vLLM + Spyre plugin + spyre-engine; the image is part of the artifact
    key), how it is pulled and the ServiceAccount its pods run as."""

    image: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Engine container image; pin a digest for reproducible artifacts. Unset: the "
            "operator's default engine image (its --default-engine-image, the chart's "
            "defaults.engineImage), followed at every reconcile (status.effective shows it)."
        ),
    )
    image_pull_policy: str = Field(
        default="IfNotPresent",
        description="Image pull policy: Always, IfNotPresent or Never.",
        json_schema_extra={"enum": ["Always", "IfNotPresent", "Never"]},
    )
    image_pull_secrets: list[str] | None = Field(
        default=None,
        description=(
            "Names of Secrets used to pull the image. Unset: the operator's default (chart "
            "defaults.imagePullSecrets); [] for none."
        ),
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "ServiceAccount of the model's precompile and serving pods (its token is not "
            "mounted: the engine never calls the API server). Platforms grant SCCs and pull "
            "secrets to ServiceAccounts. Unset: the operator's default (chart "
            "defaults.serviceAccountName), else the namespace's default ServiceAccount. Not "
            "part of the artifact key."
        ),
    )


class Toleration(ApiModel):
    """A toleration (as in a Pod spec)."""

    key: str | None = Field(
        default=None, description="Taint key.", pattern=f"^({QUALIFIED_NAME})?$", max_length=317
    )
    operator: str | None = Field(
        default=None,
        description="Exists or Equal.",
        json_schema_extra={"enum": ["Exists", "Equal"]},
    )
    value: str | None = Field(default=None, description="Taint value.")
    effect: str | None = Field(
        default=None,
        description="NoSchedule, PreferNoSchedule or NoExecute.",
        json_schema_extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class AcceleratorSpec(ApiModel):
    """Which Spyre cards the pods request and where they may run."""

    resource_name: str | None = Field(
        default=None,
        description=(
            "Extended resource for Spyre cards, as the device plugin advertises it: "
            "ibm.com/spyre_vf, ibm.com/spyre_pf, ibm.com/spyre_pf_tier0/1/2, or "
            "ibm.com/aiu_pf on older installs. Any valid extended-resource name is accepted. "
            "Unset: the operator's default (chart defaults.cardResource, built in "
            "ibm.com/spyre_vf)."
        ),
        max_length=253,
        pattern=EXTENDED_RESOURCE_PATTERN,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!self.startsWith('kubernetes.io/') && !self.contains('.kubernetes.io/') "
                    "&& !self.startsWith('requests.')",
                    "accelerator.resourceName must be an extended resource outside the "
                    "kubernetes.io domain, e.g. ibm.com/spyre_vf",
                )
            ]
        },
    )
    scheduler_name: str | None = Field(
        default=None,
        description=(
            "Pod scheduler of pods on the cards; \"\" means the cluster's default scheduler. "
            "Unset: the operator's default (chart defaults.schedulerName, built in "
            "spyre-scheduler)."
        ),
        max_length=253,
    )
    node_selector: NodeSelector | None = Field(
        default=None,
        description=(
            "Node labels the pods must match. Unset: the operator's default (chart "
            "defaults.serving.nodeSelector); {} for none."
        ),
        max_length=64,
        json_schema_extra=_keys_are_qualified_names("accelerator.nodeSelector"),
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description=(
            "Tolerations for tainted accelerator nodes. Unset: the operator's default (chart "
            "defaults.serving.tolerations); [] for none."
        ),
    )


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]


def _shared_access() -> list[AccessMode]:
    return ["ReadWriteMany"]


#: Defaults of cache.volume.retention (see docs/operations.md, "Garbage collection").
DEFAULT_KEEP_LAST = 2
DEFAULT_UNUSED_FOR_SECONDS = 24 * 3600


class CacheRetention(ApiModel):
    """When the operator removes artifacts no SpyreModel uses from a cache volume it manages.

    An artifact is removed once it is not in use (no SpyreModel's spec needs it, no Deployment
    serves it, no precompile Job writes it), has not been used for unusedForSeconds, and is not
    among the keepLast most recently used unused artifacts of any SpyreModel listing it.
    """

    enabled: bool = Field(
        default=True,
        description="Remove unused artifacts (false: never remove anything from this volume).",
    )
    keep_last: int = Field(
        default=DEFAULT_KEEP_LAST,
        ge=0,
        le=16,
        description=(
            "Unused artifacts kept per SpyreModel, most recently used first: reverting an "
            "edit to one of them serves it again without compiling."
        ),
    )
    unused_for_seconds: int = Field(
        default=DEFAULT_UNUSED_FOR_SECONDS,
        ge=0,
        description=(
            "An unused artifact is kept at least this long after it was last used (default "
            "one day: a rollback the day after a bad edit needs no compile)."
        ),
    )


class CacheVolumeSpec(ApiModel):
    """A compile-cache PVC the operator creates and shares between SpyreModels naming it."""

    name: str = Field(
        default="spyre-compile-cache",
        description=(
            "PVC name; every SpyreModel in the namespace naming it shares it. At most 63 "
            "characters: it is also a label value (serving.spyre.dev/cache-claim)."
        ),
        max_length=MAX_LABEL_VALUE,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )
    storage_class_name: str | None = Field(
        default=None,
        description=(
            "StorageClass of the PVC when the operator creates it. Unset: the operator's "
            "default (chart defaults.storageClassName), or else the cluster's default "
            "StorageClass. A PVC keeps the class it was created with."
        ),
    )
    size: Quantity = Field(default="50Gi", description="Requested capacity.")
    access_modes: list[AccessMode] = Field(
        default_factory=_shared_access,
        description=(
            "Access modes. ReadWriteMany lets replicas on several nodes share the cache; "
            "ReadWriteOnce confines the precompile pod and every replica to one node (the "
            "operator adds the pod affinity that keeps them there). ReadOnlyMany and "
            "ReadWriteOncePod cannot work for a cache one pod writes and many read."
        ),
        min_length=1,
    )
    retain_policy: str = Field(
        default="Retain",
        description=(
            "Retain keeps the PVC (and its compiled artifacts) when SpyreModels are deleted; "
            "Delete garbage-collects it once no SpyreModel naming it remains."
        ),
        json_schema_extra={"enum": ["Retain", "Delete"]},
    )
    retention: CacheRetention = Field(
        default_factory=CacheRetention,
        description=(
            "Garbage collection of unused artifacts on this volume (the settings of the oldest "
            "SpyreModel naming the volume apply, like the PVC's)."
        ),
    )


class CacheSpec(ApiModel):
    """Where compiled artifacts live: an existing PVC, or one the operator creates."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.claimName) && has(self.volume))",
                    "set cache.claimName (an existing PVC) or cache.volume (a PVC the operator "
                    "creates), not both",
                )
            ]
        }
    )

    claim_name: str | None = Field(
        default=None,
        description=(
            "An existing PVC to use; the operator never creates or deletes it. "
            "Unset means cache.volume (with its defaults). At most 63 characters: it is also "
            "a label value (serving.spyre.dev/cache-claim)."
        ),
        max_length=MAX_LABEL_VALUE,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    volume: CacheVolumeSpec | None = Field(
        default=None,
        description="A PVC the operator creates (the default when claimName is unset).",
    )
    usage_warning_percent: int = Field(
        default=85,
        ge=1,
        le=100,
        description=(
            "CacheVolumeReady turns to reason ClaimNearlyFull (a Warning Event) when the "
            "artifacts the claim's SpyreModels list use this share of its capacity: a "
            "precompile Job on a full claim fails with 'no space left on device'."
        ),
    )


class ScaleToZeroSpec(ApiModel):
    """How a model with ``minReplicas: 0`` goes to zero and wakes (KEDA + its HTTP add-on).

    Requests reach the model through the HTTP add-on's interceptor, which counts them, holds
    one that arrives at zero until a replica is Ready and then forwards it
    (``desired/scaletozero.py``; operator/SCALE-TO-ZERO.md).
    """

    idle_seconds: int = Field(
        default=300,
        ge=30,
        le=86400,
        description=(
            "Seconds without a request after which the model goes to 0 replicas (its cards "
            "are freed). Becomes the KEDA ScaledObject's cooldownPeriod and the "
            "HTTPScaledObject's scaledownPeriod."
        ),
    )
    max_wait_seconds: int = Field(
        default=300,
        ge=1,
        le=3600,
        description=(
            "Seconds a request that arrives at zero is held while a replica starts; past it "
            "the client gets 503 with Retry-After. Becomes the HTTPScaledObject's "
            "timeouts.conditionWait and coldStartTimeoutFailoverRef.timeoutSeconds (the "
            "503 comes from the operator's cold-start responder)."
        ),
    )
    response_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description=(
            "Seconds the proxy waits for a forwarded request's response headers (vLLM sends "
            "them for a non-streamed completion only when it is done). Becomes the "
            "HTTPScaledObject's timeouts.responseHeader (the interceptor's default is 500ms)."
        ),
    )


class AutoscalingSpec(ApiModel):
    """A HorizontalPodAutoscaler on the engine's own load, scaling this SpyreModel's ``/scale``.

    The targets are per-pod averages of the engine's metrics, served to the HPA by
    prometheus-adapter under the names in ``desired/autoscaling.py`` (docs/reference.md:
    Autoscaling).
    With ``minReplicas: 0`` the model scales to zero when idle: KEDA and its HTTP add-on
    replace the HPA (same targets, as Prometheus queries; ``desired/scaletozero.py``).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                    "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
                ),
                cel(
                    "has(self.targetQueueLength) || has(self.targetKvCacheUsage) || "
                    "has(self.targetRunningRequests) || "
                    "(has(self.minReplicas) && self.minReplicas == 0 && self.maxReplicas == 1)",
                    "autoscaling needs at least one target: targetQueueLength, "
                    "targetKvCacheUsage or targetRunningRequests (only minReplicas: 0 with "
                    "maxReplicas: 1, which scales 0 <-> 1 on requests alone, needs none)",
                ),
                cel(
                    "!has(self.scaleToZero) || "
                    "(has(self.minReplicas) && self.minReplicas == 0)",
                    "autoscaling.scaleToZero is only allowed with autoscaling.minReplicas: 0 "
                    "(minReplicas 0 is what lets the model scale to zero)",
                ),
            ]
        }
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Fewest serving replicas. 0: scale to zero after scaleToZero.idleSeconds without a "
            "request and wake on the next one (needs KEDA and its HTTP add-on; the KEDA "
            "ScaledObject's minReplicaCount)."
        ),
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most serving replicas.")
    target_queue_length: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="Average requests waiting per pod (vllm:num_requests_waiting).",
    )
    target_kv_cache_usage: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Average KV-cache usage per pod, 0-1 (vllm:kv_cache_usage_perc).",
    )
    target_running_requests: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="Average requests running per pod (vllm:num_requests_running).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description=(
            "How long load must stay low before replicas are removed (a new replica loads "
            "its artifact in about a minute; scaling down too early wastes that)."
        ),
    )
    scale_to_zero: ScaleToZeroSpec | None = Field(
        default=None,
        description=(
            "Idle period and wake-up bounds of a model with minReplicas: 0 (only then; "
            "defaults apply when it is left out)."
        ),
    )

    @model_validator(mode="after")
    def _valid(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if self.scale_to_zero is not None and self.min_replicas != 0:
            raise ValueError("scaleToZero is only allowed with minReplicas: 0")
        if (
            self.target_queue_length is None
            and self.target_kv_cache_usage is None
            and self.target_running_requests is None
            and not (self.min_replicas == 0 and self.max_replicas == 1)
        ):
            raise ValueError(
                "autoscaling needs at least one target (only minReplicas: 0 with "
                "maxReplicas: 1, which scales 0 <-> 1 on requests alone, needs none)"
            )
        return self


class EndpointPickerRef(ApiModel):
    """The Endpoint Picker (EPP) Service the Gateway asks which pod serves each request."""

    name: str = Field(
        description="Name of the endpoint picker's Service, in the SpyreModel's namespace.",
        min_length=1,
        max_length=253,
    )
    port: int = Field(
        default=9002,
        ge=1,
        le=65535,
        description="Service port of the endpoint picker's ext-proc gRPC server (EPP: 9002).",
    )
    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description=(
            "What the Gateway does when the endpoint picker does not answer: FailClose drops "
            "the request, FailOpen forwards it to a pod of the Gateway's choosing."
        ),
    )


class InferencePoolRouting(ApiModel):
    """An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1)."""

    endpoint_picker: EndpointPickerRef = Field(
        description=(
            "The endpoint picker that routes this pool's requests (deployed with the "
            "Inference Extension; it reads the pods' vllm:num_requests_waiting, "
            "vllm:kv_cache_usage_perc, ... from /metrics)."
        )
    )


class RoutingSpec(ApiModel):
    """How inference gateways reach the serving pods (besides the model's Service)."""

    inference_pool: InferencePoolRouting | None = Field(
        default=None,
        description=(
            "Create an InferencePool named like the Service, selecting this model's serving "
            "pods on serving.port, for a Gateway's HTTPRoute to reference. Needs the Gateway "
            "API Inference Extension CRDs; without them the RoutingReady condition says so and "
            "the model still serves through its Service."
        ),
    )


class SpyreModelSpec(ApiModel):
    """Desired state of a SpyreModel."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.task != 'generate' || !has(self.compile.warmupShapes)",
                    "compile.warmupShapes apply only to pooling models (task embed, score or "
                    "rerank); generate models compile with chunked prefill "
                    "(compile.maxNumBatchedTokens)",
                ),
                cel(
                    "self.task == 'generate' || !has(self.compile.warmupShapes) || "
                    "size(self.compile.warmupShapes) > 0",
                    "compile.warmupShapes must not be empty: omit it to use the plugin's "
                    "supported shapes for the model",
                ),
            ]
        }
    )

    model: ModelSource = Field(description="The model to serve.")
    task: Task = Field(
        default=Task.GENERATE,
        description=(
            "generate (chunked prefill, prefix caching) or a pooling task: embed, score, rerank "
            "(static warmup shapes)."
        ),
    )
    compile: CompileSpec = Field(
        default_factory=CompileSpec, description="The compile shape (part of the artifact key)."
    )
    serving: ServingSpec = Field(default_factory=ServingSpec, description="How inference pods run.")
    precompile: PrecompileSpec = Field(
        default_factory=PrecompileSpec, description="The precompile Job's limits."
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Number of serving replicas. With autoscaling, the HorizontalPodAutoscaler (KEDA's, "
            "with minReplicas: 0) sets it through the scale subresource: leave it out of GitOps "
            "manifests."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "Scale replicas on the engine's load with a HorizontalPodAutoscaler; with "
            "minReplicas: 0, to zero when idle (KEDA and its HTTP add-on)."
        ),
    )
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The engine image.")
    accelerator: AcceleratorSpec = Field(
        default_factory=AcceleratorSpec, description="Spyre cards and placement."
    )
    cache: CacheSpec = Field(default_factory=CacheSpec, description="The compile-cache volume.")
    routing: RoutingSpec | None = Field(
        default=None,
        description="Optional routing through an inference gateway (InferencePool).",
    )


# --------------------------------------------------------------------------------------
# Status
# --------------------------------------------------------------------------------------


class Condition(ApiModel):
    """A status condition (as metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Ready.")
    status: str = Field(
        description="True, False or Unknown.",
        json_schema_extra={"enum": ["True", "False", "Unknown"]},
    )
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )


class ReferencesStatus(ApiModel):
    """The artifact's reference answers, as its precompile recorded them (issue 30)."""

    source: str | None = Field(
        default=None,
        description=(
            "Where they were answered: self (the vLLM that compiled, on the artifact's own "
            "backend) or eager (a CPU run for sendnn_compile_only, which runs no model)."
        ),
    )
    prompts: int | None = Field(default=None, description="Prompts answered.")
    tokens: int | None = Field(default=None, description="Tokens generated over all prompts.")
    tolerance: float | None = Field(
        default=None, description="Largest probability difference a serving pod may show."
    )


class ArtifactStatus(ApiModel):
    """The compiled artifact for the current spec."""

    key: str | None = Field(default=None, description="Content-addressed artifact key.")
    path: str | None = Field(default=None, description="Artifact directory in the cache volume.")
    phase: str | None = Field(
        default=None,
        description="Pending, Compiling, Ready or Failed.",
        json_schema_extra={"enum": ["Pending", "Compiling", "Ready", "Failed"]},
    )
    job_name: str | None = Field(default=None, description="The precompile Job.")
    compile_seconds: float | None = Field(default=None, description="Compile wall time.")
    size_bytes: int | None = Field(default=None, description="Artifact size on disk.")
    completed_at: str | None = Field(default=None, description="When compilation finished.")
    message: str | None = Field(default=None, description="Detail, e.g. the failure reason.")
    claim: str | None = Field(
        default=None, description="The cache claim this artifact is (being) compiled on."
    )
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description=(
            "UID of the cache claim the artifact was compiled on: a claim deleted and created "
            "again under the same name holds no artifact."
        ),
    )
    attempts: int | None = Field(
        default=None, description="Precompile Jobs run for this key on this claim so far."
    )
    model_revision: str | None = Field(
        default=None,
        description=(
            "The commit the precompile Job downloaded, for hf:// models (what @main meant "
            "when this artifact was compiled)."
        ),
    )
    next_retry_at: str | None = Field(
        default=None,
        description=(
            "When a failed compile is retried (bounded exponential backoff). Set the "
            "annotation serving.spyre.dev/retry-compile to a new value to retry at once."
        ),
    )
    retry_token: str | None = Field(
        default=None,
        description="The last serving.spyre.dev/retry-compile value acted upon.",
    )
    reason: str | None = Field(
        default=None,
        description=(
            "CamelCase reason of the last failed compile (PrecompileFailed, or the engine's "
            "own, e.g. ModelNotFound); kept with the message once the failed Job is removed."
        ),
    )
    references: ReferencesStatus | None = Field(
        default=None,
        description=(
            "The reference answers every serving pod checks its own against before it turns "
            "Ready; absent when the precompile recorded none (eager, a pooling model, an "
            "engine from before the check)."
        ),
    )
    waiting_since: str | None = Field(
        default=None,
        description=(
            "While the model waits for a slot of the cluster-wide precompile budget "
            "(WaitingForCompileSlot): since when; the oldest waiting model goes first."
        ),
    )


class CachedArtifact(ApiModel):
    """An artifact this model compiled or served, known to be on a cache claim.

    Remembered so that reverting a compile-affecting edit serves the artifact again at once,
    without a precompile Job, as long as it is on the same claim (same claimUID).
    """

    key: str = Field(description="Content-addressed artifact key.")
    claim: str = Field(description="The cache claim the artifact is on.")
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description="UID of that claim when the artifact was recorded (a new claim has none).",
    )
    path: str | None = Field(default=None, description="Artifact directory in the cache volume.")
    model: str | None = Field(default=None, description="spec.model.uri it was compiled from.")
    shape: str | None = Field(default=None, description="The compile shape, in short.")
    size_bytes: int | None = Field(default=None, description="Artifact size on disk.")
    compile_seconds: float | None = Field(default=None, description="Compile wall time.")
    completed_at: str | None = Field(default=None, description="When compilation finished.")
    model_revision: str | None = Field(
        default=None, description="The commit an hf:// model resolved to, if known."
    )
    in_use: bool | None = Field(
        default=None,
        description="The spec needs it or the Deployment serves it.",
    )
    last_used: str | None = Field(
        default=None,
        description=(
            "When it was last in use: the time it stopped being needed or served (for one in "
            "use, when it was recorded or came back into use)."
        ),
    )


class CacheStatus(ApiModel):
    """What this model knows to be on its cache claims."""

    artifacts: list[CachedArtifact] | None = Field(
        default=None,
        description=(
            "Artifacts this model compiled or served, most recently used first (at most 16): "
            "reverting to one of them on the same claim serves it without compiling."
        ),
    )
    used_bytes: int | None = Field(
        default=None,
        description="Total size of the listed artifacts on the current cache claim.",
    )
    usage: str | None = Field(
        default=None,
        description="used_bytes in human units and how many artifacts, e.g. '2.1 GiB in 3'.",
    )
    capacity_bytes: int | None = Field(
        default=None, description="The current cache claim's capacity (its PVC's status)."
    )
    claim_uid: str | None = Field(
        default=None,
        alias="claimUID",
        description="UID of the cache claim capacityBytes and freeBytes describe.",
    )
    free_bytes: int | None = Field(
        default=None,
        description=(
            "Free space on the current cache claim as last measured on the volume (by the "
            "newest garbage-collection Job on it; absent until one ran)."
        ),
    )
    weights_bytes: int | None = Field(
        default=None,
        description=(
            "Size of the models downloaded onto the current cache claim (hf:// models, in "
            "its hub directory, beside the artifacts) as last measured on the volume."
        ),
    )
    measured_at: str | None = Field(
        default=None,
        description="When freeBytes and weightsBytes were measured (the GC Job's completion).",
    )


class CompileStatus(ApiModel):
    """The compile shape the operator uses: the spec's fields, the omitted ones filled in."""

    tensor_parallel_size: int | None = Field(default=None, description="Cards per replica.")
    max_model_len: int | None = Field(default=None, description="Context length (decoders).")
    max_num_seqs: int | None = Field(default=None, description="Decode batch size (decoders).")
    warmup_shapes: list[WarmupShape] | None = Field(
        default=None, description="Static shapes (pooling models)."
    )
    source: str | None = Field(
        default=None,
        description=(
            "Spec (every field given), SupportedConfiguration (omitted fields from the "
            "plugin's supported configurations of the model) or Fallback (a model the plugin "
            "does not list by id, unchecked: 1 card, 4096 tokens, 4 sequences)."
        ),
        json_schema_extra={"enum": ["Spec", "SupportedConfiguration", "Fallback"]},
    )
    supported_model: str | None = Field(
        default=None,
        description="The plugin's model_configs.yaml entry the model uri names, if any.",
    )
    message: str | None = Field(
        default=None, description="Which shape, why, and the other supported ones."
    )


class EffectiveStatus(ApiModel):
    """The per-site settings in use: the spec's, or the operator's defaults for those unset."""

    engine_image: str | None = Field(default=None, description="The engine image.")
    image_pull_secrets: list[str] | None = Field(
        default=None, description="Secrets the engine image is pulled with."
    )
    service_account_name: str | None = Field(
        default=None,
        description="The ServiceAccount of the precompile and serving pods (unset: default).",
    )
    resource_name: str | None = Field(
        default=None, description="The extended resource the pods request cards as."
    )
    scheduler_name: str | None = Field(
        default=None,
        description="The scheduler of pods on the cards (empty: the cluster's default).",
    )
    storage_class_name: str | None = Field(
        default=None,
        description=(
            "The cache PVC's StorageClass: the live PVC's, else the one it is created with "
            "(unset: the cluster's default)."
        ),
    )
    from_defaults: list[str] | None = Field(
        default=None,
        description=(
            "The spec fields left unset that follow the operator's defaults, e.g. "
            "engine.image: changing the default changes them at the next reconcile."
        ),
    )


class OperatorStamp(ApiModel):
    """Which operator install wrote a status, and when (see peers.py)."""

    install: str | None = Field(
        default=None, description="The install's Lease, <namespace>/<name>: one per release."
    )
    identity: str | None = Field(default=None, description="The replica (pod) that wrote.")
    written_at: str | None = Field(
        default=None, description="When it wrote the status last (RFC 3339)."
    )


class ScaleToZeroStatus(ApiModel):
    """Scale to zero (autoscaling.minReplicas 0), as KEDA reports it."""

    last_active_time: str | None = Field(
        default=None,
        description="When KEDA last saw a trigger active (the ScaledObject's lastActiveTime).",
    )
    scaled_to_zero_since: str | None = Field(
        default=None, description="Since when spec.replicas is 0 (RFC 3339); absent above zero."
    )


class CanaryStatus(ApiModel):
    """spec.serving.canary's progress for the spec's artifact."""

    artifact_key: str | None = Field(default=None, description="The artifact on the canary.")
    phase: Literal["Running", "Passed", "Failed"] | None = Field(
        default=None,
        description=(
            "Running: its pods serve beside the previous artifact's. Passed: the Deployment "
            "rolls out to it. Failed: a canary pod broke the bounds (CanaryFailed), it was "
            "not passed by its deadline (CanaryDeadlineExceeded) or aborted by the annotation "
            "(CanaryAborted); the previous artifact keeps serving."
        ),
    )
    created_time: str | None = Field(
        default=None, description="When the canary began (its deadline counts from here)."
    )
    deadline_time: str | None = Field(
        default=None, description="When a canary not passed by then fails."
    )
    start_time: str | None = Field(
        default=None,
        description=(
            "When every canary pod was last Ready (the window's start): a canary pod that is "
            "created again or restarts starts the window again."
        ),
    )
    passed_time: str | None = Field(default=None, description="When the canary passed.")
    judged_requests: int | None = Field(
        default=None,
        description=(
            "The fewest inference requests a canary pod judged (its engine's count, read from "
            "the pod): the canary passes only once every canary pod judged minRequests."
        ),
    )
    min_requests: int | None = Field(
        default=None, description="canary.minRequests, the count each canary pod needs."
    )
    reason: str | None = Field(
        default=None,
        description=(
            "How it ended: WindowPassed, PromotedByAnnotation, CanaryFailed, "
            "CanaryDeadlineExceeded or CanaryAborted."
        ),
    )
    message: str | None = Field(default=None, description="Why it passed or failed.")
    baseline_from: str | None = Field(
        default=None,
        description=(
            "The window start the baseline's starting counts were taken for "
            "(baselineStart): the previous artifact's pods are compared over the window "
            "from then."
        ),
    )
    baseline_start: list[ServedCounts] | None = Field(
        default=None,
        description=(
            "What each of the previous artifact's pods had served when the window started "
            "(read from the pods); what they serve from then on is the baseline."
        ),
    )
    comparison: CanaryComparison | None = Field(
        default=None, description="The canary and the baseline over the window, side by side."
    )
    baseline_verdict: str | None = Field(
        default=None,
        description=(
            "Why the canary compared worse than the baseline at the window's end (it then "
            "fails with CanaryFailed)."
        ),
    )


class ServedCounts(ApiModel):
    """What one serving pod had served since Ready (its engine's /health/served)."""

    pod: str = Field(description="The pod.")
    judged: int = Field(ge=0, description="Inference requests the model answered or failed.")
    errors: int = Field(ge=0, description="Of them, answered with a server error.")
    ttft_sum: float | None = Field(default=None, ge=0, description="Seconds to first token.")
    ttft_count: int | None = Field(default=None, ge=0, description="Requests timed so.")
    tpot_sum: float | None = Field(default=None, ge=0, description="Seconds per output token.")
    tpot_count: int | None = Field(default=None, ge=0, description="Requests timed so.")


class ServedFigures(ApiModel):
    """One side of the comparison over the canary's window."""

    pods: int = Field(ge=0, description="Pods whose figures were read.")
    requests: int = Field(ge=0, description="Inference requests answered or failed.")
    error_ratio: float | None = Field(default=None, description="Share of server errors.")
    ttft_seconds: float | None = Field(default=None, description="Mean time to first token.")
    tpot_seconds: float | None = Field(
        default=None, description="Mean time per output token."
    )


class CanaryComparison(ApiModel):
    """The canary's figures beside the previous artifact's pods' (the baseline)."""

    canary: ServedFigures
    baseline: ServedFigures
    message: str | None = Field(default=None, description="What the comparison concluded.")


class OutputCheckStatus(ApiModel):
    """The last output-check outcome the operator recorded (serving.outputCheck)."""

    artifact_key: str | None = Field(default=None, description="The artifact it concerns.")
    result: Literal["Passed", "Failed", "Unchecked"] | None = Field(
        default=None,
        description=(
            "Passed: every replica of the artifact's rollout answered its reference prompts "
            "as recorded (under Enforce); its later pods skip the check while its files are "
            "unchanged. Failed: a pod of it answered unlike its reference (OutputMismatch). "
            "Unchecked: it rolled out, but its precompile recorded no reference answers."
        ),
    )
    time: str | None = Field(default=None, description="When the operator recorded it.")
    pods: int | None = Field(default=None, description="Passed: the replicas that passed.")
    message: str | None = Field(
        default=None, description="Failed: the first divergence; Unchecked: why.")


class SpyreModelStatus(ApiModel):
    """Observed state of a SpyreModel."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status reflects."
    )
    artifact: ArtifactStatus | None = Field(
        default=None, description="The artifact the current spec needs."
    )
    compile: CompileStatus | None = Field(
        default=None, description="The compile shape in use, and where it comes from."
    )
    effective: EffectiveStatus | None = Field(
        default=None,
        description=(
            "The per-site settings in use (engine image, pull secrets, card resource, "
            "scheduler, StorageClass): the spec's, or the operator's defaults."
        ),
    )
    cache: CacheStatus | None = Field(
        default=None, description="Artifacts this model knows to be on its cache claims."
    )
    serving_artifact_key: str | None = Field(
        default=None,
        description="Artifact key the serving Deployment runs (differs while a new one compiles).",
    )
    served_spec: str | None = Field(
        default=None,
        description=(
            "The spec the serving Deployment is built from (canonical JSON): while a new "
            "artifact compiles, a deleted Deployment is recreated from it, serving "
            "servingArtifactKey."
        ),
    )
    last_good_artifact_key: str | None = Field(
        default=None,
        description=(
            "The artifact the Deployment last finished rolling out with every replica Ready "
            "(an engine that checks its answers turns Ready only once they matched the "
            "artifact's reference): what a model serves again when a newer artifact is "
            "refused for OutputMismatch."
        ),
    )
    last_good_served_spec: str | None = Field(
        default=None,
        description="The spec lastGoodArtifactKey was served from (canonical JSON).",
    )
    canary: CanaryStatus | None = Field(
        default=None, description="Only with serving.canary: the new artifact's canary."
    )
    output_check: OutputCheckStatus | None = Field(
        default=None,
        description=(
            "The last output check's outcome (the operator's own record: the "
            "<model>-output-check ConfigMap only tells pods which artifact passed)."
        ),
    )
    replicas: int | None = Field(default=None, description="Serving pods (all versions).")
    ready_replicas: int | None = Field(default=None, description="Ready serving pods.")
    selector: str | None = Field(
        default=None, description="Label selector of serving pods (for the scale subresource)."
    )
    endpoint: str | None = Field(
        default=None, description="In-cluster OpenAI base URL, e.g. http://name.ns.svc:8000/v1."
    )
    scale_to_zero: ScaleToZeroStatus | None = Field(
        default=None, description="Only with autoscaling.minReplicas 0: last use and time at zero."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description=(
            "Ready, CacheVolumeReady, ArtifactReady, Progressing and Degraded; plus Reconciling "
            "and Stalled (mirrors of Progressing and Degraded, for kstatus/Flux); RoutingReady "
            "when routing.inferencePool is set."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    operator: OperatorStamp | None = Field(
        default=None,
        description=(
            "The operator install that wrote this status last. Another install that finds "
            "it fresh leaves the model alone and reports an OperatorConflict Event."
        ),
    )


class SpyreModel(ApiModel):
    """A model served on Spyre cards: a cache PVC, a precompile Job, a Deployment and a Service."""

    api_version: str = Field(default="serving.spyre.dev/v1alpha1", alias="apiVersion")
    kind: str = Field(default="SpyreModel")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpyreModelSpec
    status: SpyreModelStatus | None = None
