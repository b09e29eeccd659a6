"""What is compiled: the model source, the warm-up shapes and the compile settings."""

from __future__ import annotations

from pydantic import Field

from .common import MODEL_URI_PATTERN, ApiModel, Backend, cel
from .serving import EnvVar


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
