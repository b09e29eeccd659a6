"""Parse the one-line JSON the engine writes to its termination log.

`spyre-engine precompile` writes ``{"key", "path", "compileSeconds", "sizeBytes", "versions"}``
on success; any engine failure writes ``{"reason", "message"}``. With
``terminationMessagePolicy: FallbackToLogsOnError`` a crash may leave plain log text instead,
which is surfaced verbatim (trimmed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import spyre_contract as contract

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


def parse_termination_message(text: str | None) -> ArtifactSummary | EngineFailure | None:
    """Interpret a container's termination message; None when there is nothing to read."""
    if not text or not text.strip():
        return None
    doc = next(contract.json_objects_last_first(text), None)
    if doc is None:
        return EngineFailure(reason="Error", message=text.strip()[-MAX_MESSAGE:])
    if contract.REASON in doc and contract.KEY not in doc:
        return EngineFailure(
            reason=str(doc.get(contract.REASON) or "Error"),
            message=str(doc.get(contract.MESSAGE) or "")[:MAX_MESSAGE],
        )

    def num(v: Any, kind: type) -> Any:
        try:
            return kind(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    versions, revision, refs = (doc.get(contract.VERSIONS), doc.get(contract.MODEL_REVISION),
                                doc.get(contract.REFERENCES))
    return ArtifactSummary(
        key=doc.get(contract.KEY),
        path=doc.get(contract.PATH),
        compile_seconds=num(doc.get(contract.COMPILE_SECONDS), float),
        size_bytes=num(doc.get(contract.SIZE_BYTES), int),
        versions=dict(versions) if isinstance(versions, dict) else {},
        model_revision=str(revision) if revision else None,
        references=dict(refs) if isinstance(refs, dict) else None,
    )
