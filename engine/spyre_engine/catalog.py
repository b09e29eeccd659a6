"""``pre_compiled_cache_catalog.json``: the list of shapes an artifact dir holds graphs for.

The Spyre plugin reads this file (when ``SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS=1``) but
never writes it, and only warns on a mismatch; so precompile writes it and serve checks it.
Format: a JSON list of ``{"sendnn_inference_version": ..., "data": {...}}`` (a non-empty dict
crashes the plugin; ``{}``, which upstream tells users to create, is an empty catalog). Writes are
atomic (temp file + rename) under an exclusive ``flock`` and idempotent, so concurrent precompiles
into one dir never lose or duplicate an entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from spyre_engine import known_configs
from spyre_engine.settings import SENDNN_BACKENDS, Backend, EngineSettings, format_warmup_shapes

CATALOG_FILENAME = "pre_compiled_cache_catalog.json"
LOCK_FILENAME = ".pre_compiled_cache_catalog.lock"


class CatalogError(Exception):
    """The catalog exists but is not a JSON list of entries."""


def catalog_path(artifact_dir: Path) -> Path:
    """Where the catalog of ``artifact_dir`` lives."""
    return Path(artifact_dir) / CATALOG_FILENAME


def entry_data(
    settings: EngineSettings,
    model_name: str,
    config_json: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``data`` of the catalog entry for this shape: what the plugin compiles, not the flags.

    Keys and value types as the plugin's matcher (``compilation_utils.py``) reads them: ints for
    ``NUM_AIUS``, ``VLLM_DT_MAX_CONTEXT_LEN`` and ``VLLM_DT_MAX_BATCH_SIZE`` (the effective
    ``max_model_len``/``max_num_seqs``: with sendnn the plugin caps unknown configurations at
    32K/32), comma-separated strings for the pooling warmup shapes. Decoders also carry
    ``VLLM_DT_CHUNK_LEN`` and ``VLLM_DT_MAX_BATCH_TKV_LIMIT``, which torch_sendnn checks when it
    loads the graphs and the plugin's matcher ignores. ``config_json`` (the model's) decides
    whether the plugin knows the configuration; ``env`` is vLLM's environment.
    """
    shape = known_configs.effective_shape(settings, config_json or {}, env)
    data: dict[str, Any] = {
        "MODEL_NAME": model_name,
        "NUM_AIUS": settings.tensor_parallel_size,
    }
    if settings.is_pooling:
        shapes = settings.warmup_shapes
        data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] = ",".join(str(s.prompt_len) for s in shapes)
        data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] = ",".join(str(s.batch_size) for s in shapes)
    else:
        data["VLLM_DT_MAX_CONTEXT_LEN"] = shape.max_model_len
        # The plugin compares this key with max_num_seqs (the env it exports is max(seqs, 2)).
        data["VLLM_DT_MAX_BATCH_SIZE"] = shape.max_num_seqs
        data["VLLM_DT_CHUNK_LEN"] = shape.chunk_len
        data["VLLM_DT_MAX_BATCH_TKV_LIMIT"] = shape.max_batch_tkv_limit
    return data


#: The Spyre compiler stack under the plugin, as Python distributions of the base image:
#: torch_sendnn (torch's sendnn backend, which compiles and loads the graphs) and deeptools
#: (the Spyre compiler). Whether a sendnn artifact loads depends on them, not on the plugin.
COMPILER_STACK = ("torch_sendnn", "deeptools")


def compiler_stack() -> dict[str, str | None]:
    """Versions of :data:`COMPILER_STACK` installed here; None for each one that is absent
    (every one on the CPU image)."""
    out: dict[str, str | None] = {}
    for dist in COMPILER_STACK:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def make_entry(
    settings: EngineSettings,
    model_name: str,
    plugin_version: str,
    config_json: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    stack: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """A full catalog entry; ``dynamo_backend`` says which backend compiled it and
    ``compiler_stack`` with what (:func:`compiler_stack`, unless given); the plugin reads only
    ``sendnn_inference_version`` and ``data``."""
    return {
        "sendnn_inference_version": plugin_version,
        "dynamo_backend": settings.backend,
        "compiler_stack": dict(compiler_stack() if stack is None else stack),
        "data": entry_data(settings, model_name, config_json, env),
    }


def stack_mismatch(entry: dict[str, Any], installed: Mapping[str, str | None]) -> str | None:
    """Why a sendnn server with the ``installed`` stack must not load ``entry``'s graphs, or
    None. torch_sendnn loads only graphs its own compiler wrote; a base image upgrade under the
    same image reference would otherwise load (or crash on) graphs of the old stack. Entries
    without ``compiler_stack`` (older precompiles, hand-written) are not checked; inductor and
    eager entries neither (no Spyre graphs)."""
    recorded = entry.get("compiler_stack")
    if not isinstance(recorded, dict) or entry.get("dynamo_backend") not in SENDNN_BACKENDS:
        return None
    differ = [
        f"{dist} {recorded.get(dist) or 'absent'} (running {installed.get(dist) or 'absent'})"
        for dist in sorted(set(recorded) | set(installed))
        if recorded.get(dist) != installed.get(dist)
    ]
    if not differ:
        return None
    return (
        "the artifact was compiled by another Spyre compiler stack: "
        + ", ".join(differ)
        + "; precompile it again with this image"
    )


def read_catalog(artifact_dir: Path) -> list[dict[str, Any]]:
    """The entries of the catalog; ``[]`` when there is none or it is ``{}`` (what upstream tells
    users to create). Raises CatalogError when malformed."""
    path = catalog_path(artifact_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from exc
    if not text.strip():
        return []
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise CatalogError(f"{path} is not valid JSON: {exc}") from exc
    if entries == {}:
        return []
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("data"), dict) for e in entries
    ):
        raise CatalogError(f"{path} is not a JSON list of {{'data': {{...}}}} entries")
    return entries


# Keys the plugin's matcher compares with ints from vLLM's config (``!=``, so "4" != 4), keys it
# parses as comma-separated int lists, and keys only torch_sendnn checks (absent from catalogs
# written by hand or by upstream tools: not required, compared when present).
_INT_KEYS = ("NUM_AIUS", "VLLM_DT_MAX_CONTEXT_LEN", "VLLM_DT_MAX_BATCH_SIZE")
_LIST_KEYS = ("SENDNN_INFERENCE_WARMUP_PROMPT_LENS", "SENDNN_INFERENCE_WARMUP_BATCH_SIZES")
OPTIONAL_KEYS = ("VLLM_DT_CHUNK_LEN", "VLLM_DT_MAX_BATCH_TKV_LIMIT")


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, str):
        return None  # the plugin calls value.split(",")
    try:
        return [int(i) for i in value.split(",")]
    except ValueError:
        return None


def _same(key: str, have: Any, want: Any) -> bool:
    if key in _LIST_KEYS:
        return _int_list(have) is not None and _int_list(have) == _int_list(want)
    if key in _INT_KEYS or key in OPTIONAL_KEYS:
        return type(have) is int and have == want
    return bool(have == want)


def entry_matches(entry: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """True when ``entry`` has every key of ``wanted`` with the same value, compared as the plugin
    compares them (types included); keys of :data:`OPTIONAL_KEYS` may be absent from the entry."""
    have = entry.get("data", {})
    for key, want in wanted.items():
        if key not in have:
            if key in OPTIONAL_KEYS:
                continue
            return False
        if not _same(key, have[key], want):
            return False
    return True


def find_entry(
    entries: list[dict[str, Any]],
    wanted: dict[str, Any],
    plugin_version: str | None = None,
    backend: str | None = None,
) -> dict[str, Any] | None:
    """The first entry whose data matches ``wanted`` (see :func:`entry_matches`).

    ``plugin_version`` keeps only entries of that version (or none recorded); ``backend``, the
    serving backend, keeps only entries whose graphs it can use (:func:`serves_with`).
    """
    for entry in entries:
        if plugin_version and entry.get("sendnn_inference_version") not in (None, plugin_version):
            continue
        if backend is not None and not serves_with(entry, backend):
            continue
        if entry_matches(entry, wanted):
            return entry
    return None


def serves_with(entry: dict[str, Any], backend: str) -> bool:
    """Can a server with ``backend`` use what the entry's precompile built?

    ``sendnn`` serves artifacts of ``sendnn`` and ``sendnn_compile_only`` (the same torch_sendnn
    graphs, compiled with or without cards); ``inductor`` needs inductor's graphs; ``eager``
    compiles nothing and needs nothing. Entries without ``dynamo_backend`` (written by hand or
    by other tools) are accepted.
    """
    built = entry.get("dynamo_backend")
    if built is None or backend == Backend.EAGER:
        return True
    if backend in SENDNN_BACKENDS:
        return built in SENDNN_BACKENDS
    return bool(built == backend)


@contextlib.contextmanager
def _locked(artifact_dir: Path) -> Iterator[None]:
    fd = os.open(Path(artifact_dir) / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def add_entry(artifact_dir: Path, entry: dict[str, Any]) -> bool:
    """Add ``entry`` unless an equal one exists; True when the file changed. Atomic and locked."""
    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    with _locked(artifact_dir):
        entries = read_catalog(artifact_dir)
        if any(
            e.get("data") == entry["data"]
            and e.get("sendnn_inference_version") == entry.get("sendnn_inference_version")
            and e.get("dynamo_backend") == entry.get("dynamo_backend")
            and e.get("compiler_stack") == entry.get("compiler_stack")
            for e in entries
        ):
            return False
        entries.append(entry)
        write_json_atomically(
            catalog_path(artifact_dir), entries, indent=2, temp_prefix=".catalog-"
        )
        return True


def write_json_atomically(path: Path, doc: Any, indent: int, temp_prefix: str) -> None:
    """Write ``doc`` as JSON to ``path`` so a reader sees the old file or the whole new one:
    a temp file (``<temp_prefix>*.tmp``, group-writable) in the same directory, fsynced, then
    renamed over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=indent)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o664)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def describe(data: dict[str, Any]) -> str:
    """Short human text of an entry's shape, for messages."""
    if "SENDNN_INFERENCE_WARMUP_PROMPT_LENS" in data:
        lens = str(data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"]).split(",")
        sizes = str(data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"]).split(",")
        shapes = ",".join(f"{p}x{b}" for p, b in zip(lens, sizes, strict=False))
        return f"model={data.get('MODEL_NAME')} tp={data.get('NUM_AIUS')} warmup={shapes}"
    text = (
        f"model={data.get('MODEL_NAME')} tp={data.get('NUM_AIUS')!r} "
        f"maxModelLen={data.get('VLLM_DT_MAX_CONTEXT_LEN')!r} "
        f"maxNumSeqs={data.get('VLLM_DT_MAX_BATCH_SIZE')!r}"
    )
    if "VLLM_DT_CHUNK_LEN" in data:
        text += f" chunk={data['VLLM_DT_CHUNK_LEN']!r}"
    if "VLLM_DT_MAX_BATCH_TKV_LIMIT" in data:
        text += f" tkvLimit={data['VLLM_DT_MAX_BATCH_TKV_LIMIT']!r}"
    return text


__all__ = [
    "CATALOG_FILENAME",
    "CatalogError",
    "add_entry",
    "catalog_path",
    "compiler_stack",
    "describe",
    "entry_data",
    "entry_matches",
    "find_entry",
    "format_warmup_shapes",
    "make_entry",
    "read_catalog",
    "serves_with",
    "stack_mismatch",
]
