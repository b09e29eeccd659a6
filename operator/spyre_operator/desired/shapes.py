"""The compile shape: the one the spec gives, or the plugin's supported one for the model (pure).

The Spyre plugin (sendnn-inference) lists in ``model_configs.yaml`` the models it supports and,
per model, the shapes that run on the cards: tensor parallel size x max model len x max num
seqs for decoders (continuous batching), tensor parallel size x warmup shapes for pooling models
(static batching). With ``compile.backend: sendnn`` and ``requireKnownConfiguration`` (the
defaults) nothing else is compiled. The operator carries a copy of the file of the plugin its
engine image pins (``spyre_operator/data/model_configs.yaml``; a test compares it with the
installed plugin's) because its own image has no plugin, vLLM or torch.

The operator cannot read the model's ``config.json`` (an hf:// model is downloaded by the
precompile Job), so it finds the model in the list **by its id**: ``hf://org/name`` is the entry
``org/name`` (ids compare case-insensitively, as on the Hub); for ``pvc://claim/path`` the last
path element names the entry whose name part it equals; ``compile.supportedModel`` names the
entry outright (a mirror, a PVC copy in another layout, a fine-tune). Then:

- omitted shape fields are filled from the model's supported shapes that agree with the fields
  given: the fewest cards, then the longest context, then the most sequences (pooling: the
  fewest cards, all warmup shapes of that entry). ``status.compile`` says which and why;
- a shape the list does not have for the model is refused (UnsupportedConfiguration) with the
  supported ones, when the check applies (sendnn and requireKnownConfiguration);
- a model the list does not name: an explicit shape goes to the precompile Job, which checks it
  with the plugin's own matcher on the model's config (architecture, not name: a fine-tuned
  derivative of a listed model is supported too). With the check on, an omitted shape is refused
  (the operator cannot know which is supported); with it off, or with a CPU backend, the fields
  left out are :data:`FALLBACK`.

The resolved shape, not the spec's omissions, is what the artifact key hashes
(:func:`spyre_operator.desired.key.key_inputs`): an explicit shape equal to the chosen one shares
its artifact, an edit and its revert give the same key, and a plugin upgrade that changes the
chosen shape (a new copy of the list) changes the key.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..api.v1alpha1 import POOLING_TASKS, Backend, CompileSpec, SpyreModelSpec, Task, WarmupShape

#: The copy of the plugin's list, and the plugin release it is from (the engine image's pin).
SUPPORTED_CONFIGS_FILE = Path(__file__).resolve().parent.parent / "data" / "model_configs.yaml"
SUPPORTED_CONFIGS_VERSION = "sendnn-inference 2.6.3"
#: Lines of the copy before the plugin's own text (a header saying where it comes from).
SUPPORTED_CONFIGS_HEADER_LINES = 5

#: Shape fields for a model the list does not name, where the check does not apply.
FALLBACK_TENSOR_PARALLEL_SIZE = 1
FALLBACK_MAX_MODEL_LEN = 4096
FALLBACK_MAX_NUM_SEQS = 4

#: status.compile.source values.
SOURCE_SPEC = "Spec"  # every field given
SOURCE_SUPPORTED = "SupportedConfiguration"  # omitted fields from the plugin's list
SOURCE_FALLBACK = "Fallback"  # omitted fields from FALLBACK_* (model not in the list)


@dataclass(frozen=True)
class Supported:
    """One supported shape of a listed model."""

    tensor_parallel_size: int
    max_model_len: int | None = None  # decoders
    max_num_seqs: int | None = None
    warmup_shapes: tuple[tuple[int, int], ...] = ()  # pooling: (prompt_len, batch_size)

    def __str__(self) -> str:
        if self.warmup_shapes:
            shapes = ",".join(f"{p}x{b}" for p, b in self.warmup_shapes)
            return f"tensorParallelSize={self.tensor_parallel_size} warmupShapes={shapes}"
        return (
            f"tensorParallelSize={self.tensor_parallel_size} maxModelLen={self.max_model_len} "
            f"maxNumSeqs={self.max_num_seqs}"
        )


@dataclass(frozen=True)
class ShapeResolution:
    """The compile section with every shape field set, where it came from, or why it is refused."""

    compile: CompileSpec
    source: str
    message: str
    supported_model: str | None = None  # the model_configs.yaml entry, when the list names it
    refusal: str | None = None  # UnsupportedConfiguration message; compile is then a placeholder

    def status(self) -> dict[str, Any]:
        """``status.compile``."""
        c = self.compile
        doc: dict[str, Any] = {
            "tensorParallelSize": c.tensor_parallel_size,
            "source": self.source,
            "message": self.message,
        }
        if c.warmup_shapes:
            doc["warmupShapes"] = [
                {"promptLen": w.prompt_len, "batchSize": w.batch_size} for w in c.warmup_shapes
            ]
        else:
            doc |= {"maxModelLen": c.max_model_len, "maxNumSeqs": c.max_num_seqs}
        if self.supported_model:
            doc["supportedModel"] = self.supported_model
        return doc


@functools.cache
def supported_models(path: Path = SUPPORTED_CONFIGS_FILE) -> dict[str, dict[str, Any]]:
    """The ``models`` section of the operator's copy of the plugin's list."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return dict(data.get("models") or {})


def supported_shapes(entry: dict[str, Any]) -> list[Supported]:
    """Every shape one entry lists, in the file's order."""
    shapes = [
        Supported(int(cb["tp_size"]), int(cb["max_model_len"]), int(cb["max_num_seqs"]))
        for cb in entry.get("continuous_batching_configs") or []
    ]
    shapes += [
        Supported(
            int(sb["tp_size"]),
            warmup_shapes=tuple(
                (int(w["prompt_len"]), int(w["batch_size"])) for w in sb["warmup_shapes"]
            ),
        )
        for sb in entry.get("static_batching_configs") or []
    ]
    return shapes


def listed_model(uri: str, models: dict[str, dict[str, Any]]) -> str | None:
    """The entry of the list the model uri names, if any (see the module docstring)."""
    if uri.startswith("hf://"):
        wanted = uri[len("hf://") :].split("@", 1)[0].lower()
        return next((name for name in models if name.lower() == wanted), None)
    leaf = posixpath.basename(uri[len("pvc://") :].rstrip("/")).lower()
    found = [name for name in models if name.rsplit("/", 1)[-1].lower() == leaf]
    return found[0] if len(found) == 1 else None


def _contains(config: dict[str, Any], pattern: dict[str, Any]) -> bool:
    """Every field of ``pattern`` is in ``config`` with the same value (nested dicts too)."""
    for key, want in pattern.items():
        if key not in config:
            return False
        have = config[key]
        if isinstance(want, dict):
            if not isinstance(have, dict) or not _contains(have, want):
                return False
        elif have != want:
            return False
    return True


def _field_count(pattern: dict[str, Any]) -> int:
    """model_config.py ArchitecturePattern.field_count (model_type not counted)."""
    attributes = {k: v for k, v in pattern.items() if k != "model_type"}
    return len(attributes) + sum(len(v) for v in attributes.values() if isinstance(v, dict))


def plugin_entry(name: str, models: dict[str, dict[str, Any]]) -> str:
    """The entry the plugin matches for the model ``name`` names.

    The plugin matches architectures, not ids (model_registry.py ``find_matching_model``): of
    the entries whose pattern the model's config has, the one with the most fields, the first
    in the file on a tie. Entries with the same architecture (multilingual-e5-large and its
    -instruct variant, granite-4-8b-dense and granite-4.2-8b) are all matched to the first, and
    its shapes are the ones the plugin accepts.
    """
    config = models[name].get("architecture") or {}
    best, best_count = name, -1
    for other, entry in models.items():
        pattern = entry.get("architecture") or {}
        if _contains(config, pattern) and _field_count(pattern) > best_count:
            best, best_count = other, _field_count(pattern)
    return best


def _requested(c: CompileSpec, pooling: bool) -> str:
    parts = []
    if c.tensor_parallel_size is not None:
        parts.append(f"tensorParallelSize={c.tensor_parallel_size}")
    if pooling and c.warmup_shapes:
        parts.append(
            "warmupShapes=" + ",".join(f"{w.prompt_len}x{w.batch_size}" for w in c.warmup_shapes)
        )
    if not pooling:
        if c.max_model_len is not None:
            parts.append(f"maxModelLen={c.max_model_len}")
        if c.max_num_seqs is not None:
            parts.append(f"maxNumSeqs={c.max_num_seqs}")
    return " ".join(parts) or "no shape"


def _agrees(s: Supported, c: CompileSpec, pooling: bool) -> bool:
    """Whether a supported shape has every shape field the spec gives."""
    if c.tensor_parallel_size is not None and s.tensor_parallel_size != c.tensor_parallel_size:
        return False
    if pooling:
        wanted = {(w.prompt_len, w.batch_size) for w in c.warmup_shapes or []}
        return bool(s.warmup_shapes) and wanted <= set(s.warmup_shapes)
    return (
        s.max_model_len is not None
        and c.max_model_len in (None, s.max_model_len)
        and c.max_num_seqs in (None, s.max_num_seqs)
    )


def _filled(c: CompileSpec, s: Supported | None, pooling: bool) -> CompileSpec:
    """``c`` with its omitted shape fields taken from ``s`` (or the fallback)."""
    warmup = c.warmup_shapes
    if pooling and not warmup and s is not None:
        warmup = [WarmupShape(prompt_len=p, batch_size=b) for p, b in s.warmup_shapes]
    tp = c.tensor_parallel_size
    if tp is None:
        tp = s.tensor_parallel_size if s is not None else FALLBACK_TENSOR_PARALLEL_SIZE
    if pooling and warmup:  # the plugin compiles the warmup shapes; these follow from them
        default_len = max(w.prompt_len for w in warmup)
        default_seqs = max(w.batch_size for w in warmup)
    elif s is not None and s.max_model_len is not None:
        default_len, default_seqs = s.max_model_len, s.max_num_seqs or FALLBACK_MAX_NUM_SEQS
    else:
        default_len, default_seqs = FALLBACK_MAX_MODEL_LEN, FALLBACK_MAX_NUM_SEQS
    return c.model_copy(
        update={
            "tensor_parallel_size": tp,
            "max_model_len": default_len if c.max_model_len is None else c.max_model_len,
            "max_num_seqs": default_seqs if c.max_num_seqs is None else c.max_num_seqs,
            "warmup_shapes": warmup,
        }
    )


def _omitted(c: CompileSpec, pooling: bool) -> bool:
    if c.tensor_parallel_size is None:
        return True
    if pooling:
        return not c.warmup_shapes
    return c.max_model_len is None or c.max_num_seqs is None


def checks_known(spec: SpyreModelSpec) -> bool:
    """The operator refuses shapes the plugin's list does not have: sendnn with
    requireKnownConfiguration and no site modelConfigFile (which only the precompile Job reads,
    against which it checks the shape; omitted fields still come from the plugin's list)."""
    c = spec.compile
    return bool(c.backend == Backend.SENDNN and c.require_known_configuration
                and c.model_config_file is None)


def resolve_compile(
    spec: SpyreModelSpec, models: dict[str, dict[str, Any]] | None = None
) -> ShapeResolution:
    """The compile shape for ``spec`` (see the module docstring)."""
    models = supported_models() if models is None else models
    c, pooling = spec.compile, Task(spec.task) in POOLING_TASKS
    named = c.supported_model or listed_model(spec.model.uri, models)
    if named is not None and named not in models:
        text = (
            f"compile.supportedModel {named!r} is not an entry of the plugin's list "
            f"({SUPPORTED_CONFIGS_VERSION}: {', '.join(sorted(models))})"
        )
        return ShapeResolution(_filled(c, None, pooling), SOURCE_SPEC, text, None, text)
    if named is None:
        return _unlisted(spec, pooling)
    name = plugin_entry(named, models)
    label = (
        name if name == named else f"{name} (the plugin's match for the architecture of {named})"
    )
    shapes = supported_shapes(models[name])
    kind = [s for s in shapes if bool(s.warmup_shapes) == pooling]
    matching = [s for s in kind if _agrees(s, c, pooling)]
    if not matching:
        if kind:
            text = (
                f"{label} is not supported with {_requested(c, pooling)} by the plugin "
                f"({SUPPORTED_CONFIGS_VERSION}); supported: {'; '.join(str(s) for s in kind)}"
            )
        else:
            text = f"the plugin ({SUPPORTED_CONFIGS_VERSION}) supports {label} only as a " + (
                "generate model: task generate"
                if pooling
                else "pooling model: task embed, score or rerank"
            )
        if checks_known(spec):
            return ShapeResolution(_filled(c, None, pooling), SOURCE_SPEC, text, name, text)
        source = SOURCE_FALLBACK if _omitted(c, pooling) else SOURCE_SPEC
        return ShapeResolution(_filled(c, None, pooling), source, text + _unchecked(spec), name)
    chosen = min(
        matching,
        key=lambda s: (s.tensor_parallel_size, -(s.max_model_len or 0), -(s.max_num_seqs or 0)),
    )
    if not _omitted(c, pooling):
        return ShapeResolution(
            _filled(c, chosen, pooling), SOURCE_SPEC, f"a supported configuration of {label}", name
        )
    others = [str(s) for s in kind if s != chosen]
    text = (
        f"{chosen} chosen from the supported configurations of {label} "
        f"({SUPPORTED_CONFIGS_VERSION})"
        + (f"; also supported: {'; '.join(others)}" if others else "")
    )
    return ShapeResolution(_filled(c, chosen, pooling), SOURCE_SUPPORTED, text, name)


def _unchecked(spec: SpyreModelSpec) -> str:
    c = spec.compile
    if c.backend != Backend.SENDNN:
        return f" (not checked: backend {c.backend} runs on CPU)"
    if not c.require_known_configuration:
        return " (not checked: requireKnownConfiguration is false; the plugin caps the shape)"
    name = c.model_config_file.name if c.model_config_file is not None else ""
    return f" (the precompile Job checks it against the site list in ConfigMap {name})"


def _unlisted(spec: SpyreModelSpec, pooling: bool) -> ShapeResolution:
    """A model the plugin's list does not name by id."""
    c = spec.compile
    filled = _filled(c, None, pooling)
    unknown = (
        f"{spec.model.uri} is not a model id the plugin lists "
        f"({SUPPORTED_CONFIGS_VERSION}: {', '.join(sorted(supported_models()))})"
    )
    if pooling and not c.warmup_shapes:
        text = (
            f"pooling models (task embed, score or rerank) compile per static shape and {unknown}"
            ": set compile.warmupShapes"
        )
        return ShapeResolution(filled, SOURCE_SPEC, text, None, text)
    if not pooling and (c.max_model_len is None or c.max_num_seqs is None) and checks_known(spec):
        text = (
            f"no compile shape given, and {unknown}: set compile.maxModelLen and maxNumSeqs "
            "(and tensorParallelSize; the precompile Job checks them against the model's "
            "config.json), or requireKnownConfiguration: false"
        )
        return ShapeResolution(filled, SOURCE_SPEC, text, None, text)
    given = (
        "as given"
        if not _omitted(c, pooling)
        else (
            "omitted fields from the fallback "
            f"(tensorParallelSize={FALLBACK_TENSOR_PARALLEL_SIZE}, "
            f"maxModelLen={FALLBACK_MAX_MODEL_LEN}, maxNumSeqs={FALLBACK_MAX_NUM_SEQS})"
        )
    )
    checked = (
        "; the precompile Job checks it against the model's config.json"
        if checks_known(spec)
        else _unchecked(spec)
    )
    source = SOURCE_FALLBACK if _omitted(c, pooling) else SOURCE_SPEC
    return ShapeResolution(filled, source, given + checked)
