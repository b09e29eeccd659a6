"""Parse the one-line JSON the engine writes to its termination log.

`spyre-engine precompile` writes ``{"key", "path", "compileSeconds", "sizeBytes", "versions"}``
on success; any engine failure writes ``{"reason", "message"}``. With
``terminationMessagePolicy: FallbackToLogsOnError`` a crash may leave plain log text instead,
which is surfaced verbatim (trimmed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1024


@dataclass(frozen=True)
class ArtifactSummary:
    """What the precompile container reports on success."""

    key: str | None
    path: str | None
    compile_seconds: float | None
    size_bytes: int | None
    versions: dict[str, Any]
    #: The commit an hf:// model resolved to (``@main`` -> a sha), when the engine reports it.
    model_revision: str | None = None
    #: What the precompile recorded of the artifact's reference answers (source, prompts,
    #: tokens, tolerance), when it recorded any.
    references: dict[str, Any] | None = None


@dataclass(frozen=True)
class EngineFailure:
    """What an engine container reports when it fails or refuses to start."""

    reason: str
    message: str


def _last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def parse_termination_message(text: str | None) -> ArtifactSummary | EngineFailure | None:
    """Interpret a container's termination message; None when there is nothing to read."""
    if not text or not text.strip():
        return None
    doc = _last_json_line(text)
    if doc is None:
        return EngineFailure(reason="Error", message=text.strip()[-MAX_MESSAGE:])
    if "reason" in doc and "key" not in doc:
        return EngineFailure(
            reason=str(doc.get("reason") or "Error"),
            message=str(doc.get("message") or "")[:MAX_MESSAGE],
        )

    def num(v: Any, kind: type) -> Any:
        try:
            return kind(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    return ArtifactSummary(
        key=doc.get("key"),
        path=doc.get("path"),
        compile_seconds=num(doc.get("compileSeconds"), float),
        size_bytes=num(doc.get("sizeBytes"), int),
        versions=dict(doc["versions"]) if isinstance(doc.get("versions"), dict) else {},
        model_revision=str(doc["modelRevision"]) if doc.get("modelRevision") else None,
        references=dict(doc["references"]) if isinstance(doc.get("references"), dict) else None,
    )
