"""The one-line JSON the engine writes to its termination log, and a parser for it.

Pure (pydantic only): written before vLLM is imported (a refusal that never starts it), and
read back by the engine's own tests. The operator does not import it: it reads the same line from
``containerStatuses[].state.terminated.message`` with its own parser
(operator/spyre_operator/decide/summary.py), whose image has neither this package nor torch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

# Reasons a failure summary can carry. CamelCase, like Kubernetes condition reasons.
REASON_INVALID_SETTINGS = "InvalidSettings"
REASON_MODEL_NOT_FOUND = "ModelNotFound"
REASON_MODEL_ACCESS_DENIED = "ModelAccessDenied"
#: The download failed for another reason than the repository (DNS, proxy, TLS, timeout, the
#: hub's 5xx, a full claim): the message names the cause and the setting that fixes it.
REASON_MODEL_DOWNLOAD_FAILED = "ModelDownloadFailed"
REASON_ARTIFACT_MISMATCH = "ArtifactMismatch"
#: ``precompile``: the artifact would not fit on the cache claim, by the size of the last one of
#: its shape there (space.py); nothing was compiled.
REASON_INSUFFICIENT_CACHE_SPACE = "InsufficientCacheSpace"
#: The artifact dir does not match its manifest (missing, truncated, changed) or has none.
REASON_ARTIFACT_CORRUPT = "ArtifactCorrupt"
REASON_COMPILE_FAILED = "CompileFailed"
REASON_ENGINE_FAILED = "EngineFailed"
REASON_CATALOG_ERROR = "CatalogError"
REASON_TERMINATED = "Terminated"
REASON_UNSUPPORTED_CONFIGURATION = "UnsupportedConfiguration"
#: The image's vLLM or sendnn-inference is not a version this spyre-engine supports (compat.py).
REASON_UNSUPPORTED_BASE = "UnsupportedBase"
#: ``gc``: the API server could not be asked which artifacts are in use; nothing was removed.
REASON_IN_USE_UNKNOWN = "InUseUnknown"
#: ``serve``: the engine's answers left the artifact's reference answers (answers.py).
REASON_OUTPUT_MISMATCH = "OutputMismatch"
#: ``serve --canary-seconds``: the canary's own requests broke the model's bounds (canary.py).
REASON_CANARY_FAILED = "CanaryFailed"


class Versions(BaseModel):
    """Versions of the packages that produced an artifact (compiled graphs depend on them)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    sendnn_inference: str | None = Field(None, description="sendnn-inference (Spyre plugin)")
    vllm: str | None = Field(None, description="vLLM")
    torch: str | None = Field(None, description="PyTorch")
    torch_sendnn: str | None = Field(
        None, description="torch_sendnn (Spyre compiler stack; absent on the CPU image)"
    )
    deeptools: str | None = Field(
        None, description="deeptools (the Spyre compiler; absent where the base has none)"
    )


class PrecompileSummary(BaseModel):
    """What a successful ``spyre-engine precompile`` wrote to its termination log."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    key: str | None = Field(None, description="Artifact key (from --artifact-key), if any")
    path: str = Field(description="Artifact directory the graphs and catalog were written to")
    compile_seconds: float = Field(alias="compileSeconds", description="Wall time of the warmup")
    size_bytes: int = Field(alias="sizeBytes", description="Total size of the artifact dir")
    model_revision: str | None = Field(
        None,
        alias="modelRevision",
        description="Commit an hf:// model resolved to (e.g. for @main), if it came from the hub",
    )
    versions: Versions = Field(
        default_factory=lambda: Versions.model_validate({}), description="Package versions"
    )
    references: dict[str, object] | None = Field(
        None,
        description="The reference answers recorded beside the artifact (answers.py): prompts, "
        "tokens, source; None when none were recorded",
    )

    def to_line(self) -> str:
        """One line of JSON with the camelCase keys the operator reads."""
        return json.dumps(self.model_dump(by_alias=True, mode="json"), separators=(",", ":"))


class FailureSummary(BaseModel):
    """What any failing ``spyre-engine`` command wrote to its termination log."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    reason: str = Field(description="CamelCase reason, e.g. ArtifactMismatch")
    message: str = Field(description="One human-readable line")
    output_check: dict[str, object] | None = Field(
        default=None,
        validation_alias=AliasChoices("outputCheck", "output_check"),
        description="OutputMismatch: the check's summary (answers.Verdict.summary: the first "
        "diverging prompt, position, expected and actual token)",
    )

    def to_line(self) -> str:
        """One line of JSON; the message is flattened to a single line."""
        flat = " ".join(self.message.split())
        line: dict[str, object] = {"reason": self.reason, "message": flat}
        if self.output_check is not None:
            line["outputCheck"] = self.output_check
        return json.dumps(line, separators=(",", ":"))


def parse_termination_message(text: str | None) -> PrecompileSummary | FailureSummary | None:
    """Parse a termination message; ``None`` when it is empty or not one of ours.

    Kubernetes may truncate the message or prepend log tail (FallbackToLogsOnError), so the
    last line that parses as JSON wins.
    """
    if not text:
        return None
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        try:
            if "reason" in data:
                return FailureSummary.model_validate(data)
            if "path" in data:
                return PrecompileSummary.model_validate(data)
        except ValidationError:
            continue
    return None


def write_termination_log(
    path: Path | str | None, summary: PrecompileSummary | FailureSummary
) -> None:
    """Write the summary line; never raises (a missing /dev/termination-log is not fatal)."""
    line = summary.to_line()
    if path is None:
        return
    try:
        Path(path).write_text(line + "\n")
    except OSError as exc:
        log.warning("Could not write termination log %s: %s", path, exc)
