"""``pre_compiled_cache_catalog.json``: the list of shapes an artifact dir holds graphs for.

The Spyre plugin reads this file (when ``SENDNN_INFERENCE_REQUIRE_PRECOMPILED_DECODERS=1``) but
never writes it, and only warns on a mismatch; so precompile writes it and serve checks it.
Format: a JSON list of ``{"sendnn_inference_version": ..., "data": {...}}`` (a dict crashes the
plugin). Writes are atomic (temp file + rename) under an exclusive ``flock`` and idempotent, so
concurrent precompiles into one dir never lose or duplicate an entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spyre_engine.settings import EngineSettings, format_warmup_shapes

CATALOG_FILENAME = "pre_compiled_cache_catalog.json"
LOCK_FILENAME = ".pre_compiled_cache_catalog.lock"


class CatalogError(Exception):
    """The catalog exists but is not a JSON list of entries."""


def catalog_path(artifact_dir: Path) -> Path:
    """Where the catalog of ``artifact_dir`` lives."""
    return Path(artifact_dir) / CATALOG_FILENAME


def entry_data(settings: EngineSettings, model_name: str) -> dict[str, Any]:
    """The ``data`` part of the catalog entry for this shape, keys as the plugin names them."""
    data: dict[str, Any] = {
        "MODEL_NAME": model_name,
        "NUM_AIUS": settings.tensor_parallel_size,
    }
    if settings.is_pooling:
        shapes = settings.warmup_shapes
        data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] = ",".join(str(s.prompt_len) for s in shapes)
        data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] = ",".join(str(s.batch_size) for s in shapes)
    else:
        data["VLLM_DT_MAX_CONTEXT_LEN"] = settings.max_model_len
        data["VLLM_DT_MAX_BATCH_SIZE"] = settings.max_num_seqs
    return data


def make_entry(settings: EngineSettings, model_name: str, plugin_version: str) -> dict[str, Any]:
    """A full catalog entry."""
    return {"sendnn_inference_version": plugin_version, "data": entry_data(settings, model_name)}


def read_catalog(artifact_dir: Path) -> list[dict[str, Any]]:
    """The entries of the catalog; ``[]`` when there is none. Raises CatalogError when malformed."""
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
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("data"), dict) for e in entries
    ):
        raise CatalogError(f"{path} is not a JSON list of {{'data': {{...}}}} entries")
    return entries


def _normalise(data: dict[str, Any]) -> dict[str, str]:
    return {k: str(v).replace(" ", "") for k, v in data.items()}


def find_entry(
    entries: list[dict[str, Any]], wanted: dict[str, Any], plugin_version: str | None = None
) -> dict[str, Any] | None:
    """The first entry whose data has every key of ``wanted`` with the same value."""
    want = _normalise(wanted)
    for entry in entries:
        if plugin_version and entry.get("sendnn_inference_version") not in (None, plugin_version):
            continue
        have = _normalise(entry.get("data", {}))
        if all(have.get(k) == v for k, v in want.items()):
            return entry
    return None


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
        wanted = entry["data"]
        if find_entry(entries, wanted, entry.get("sendnn_inference_version")) is not None:
            return False
        entries.append(entry)
        fd, tmp = tempfile.mkstemp(dir=artifact_dir, prefix=".catalog-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o664)
            os.replace(tmp, catalog_path(artifact_dir))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True


def describe(data: dict[str, Any]) -> str:
    """Short human text of an entry's shape, for messages."""
    if "SENDNN_INFERENCE_WARMUP_PROMPT_LENS" in data:
        lens = str(data["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"]).split(",")
        sizes = str(data["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"]).split(",")
        shapes = ",".join(f"{p}x{b}" for p, b in zip(lens, sizes, strict=False))
        return f"model={data.get('MODEL_NAME')} tp={data.get('NUM_AIUS')} warmup={shapes}"
    return (
        f"model={data.get('MODEL_NAME')} tp={data.get('NUM_AIUS')} "
        f"maxModelLen={data.get('VLLM_DT_MAX_CONTEXT_LEN')} "
        f"maxNumSeqs={data.get('VLLM_DT_MAX_BATCH_SIZE')}"
    )


__all__ = [
    "CATALOG_FILENAME",
    "CatalogError",
    "add_entry",
    "catalog_path",
    "describe",
    "entry_data",
    "find_entry",
    "format_warmup_shapes",
    "make_entry",
    "read_catalog",
]
