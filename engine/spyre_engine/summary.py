"""The one-line JSON the engine writes to its termination log, and a parser for it.

Pure (pydantic only): written before vLLM is imported (a refusal that never starts it), and
read back by the engine's own tests. The operator does not import it: it reads the same line from
``containerStatuses[].state.terminated.message`` with its own parser
(operator/spyre_operator/decide/summary.py), whose image has neither this package nor torch; the
fields and reasons both use are spyre_contract's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import spyre_contract as contract
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

# Reasons a failure summary can carry: spyre_contract's (the operator reads the same names),
# explained there.
REASON_INVALID_SETTINGS = contract.INVALID_SETTINGS
REASON_MODEL_NOT_FOUND = contract.MODEL_NOT_FOUND
REASON_MODEL_ACCESS_DENIED = contract.MODEL_ACCESS_DENIED
REASON_MODEL_DOWNLOAD_FAILED = contract.MODEL_DOWNLOAD_FAILED
REASON_ARTIFACT_MISMATCH = contract.ARTIFACT_MISMATCH
REASON_INSUFFICIENT_CACHE_SPACE = contract.INSUFFICIENT_CACHE_SPACE
REASON_ARTIFACT_CORRUPT = contract.ARTIFACT_CORRUPT
REASON_COMPILE_FAILED = contract.COMPILE_FAILED
REASON_ENGINE_FAILED = contract.ENGINE_FAILED
REASON_CATALOG_ERROR = contract.CATALOG_ERROR
REASON_TERMINATED = contract.TERMINATED
REASON_UNSUPPORTED_CONFIGURATION = contract.UNSUPPORTED_CONFIGURATION
REASON_UNSUPPORTED_BASE = contract.UNSUPPORTED_BASE
REASON_IN_USE_UNKNOWN = contract.IN_USE_UNKNOWN
REASON_OUTPUT_MISMATCH = contract.OUTPUT_MISMATCH
REASON_CANARY_FAILED = contract.CANARY_FAILED


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
    compile_seconds: float = Field(
        alias=contract.COMPILE_SECONDS, description="Wall time of the warmup"
    )
    size_bytes: int = Field(
        alias=contract.SIZE_BYTES, description="Total size of the artifact dir"
    )
    model_revision: str | None = Field(
        None,
        alias=contract.MODEL_REVISION,
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
        validation_alias=AliasChoices(contract.OUTPUT_CHECK_SUMMARY, "output_check"),
        description="OutputMismatch: the check's summary (answers.Verdict.summary: the first "
        "diverging prompt, position, expected and actual token)",
    )

    def to_line(self) -> str:
        """One line of JSON; the message is flattened to a single line."""
        flat = " ".join(self.message.split())
        line: dict[str, object] = {contract.REASON: self.reason, contract.MESSAGE: flat}
        if self.output_check is not None:
            line[contract.OUTPUT_CHECK_SUMMARY] = self.output_check
        return json.dumps(line, separators=(",", ":"))


def parse_termination_message(text: str | None) -> PrecompileSummary | FailureSummary | None:
    """Parse a termination message; ``None`` when it is empty or not one of ours.

    Kubernetes may truncate the message or prepend log tail (FallbackToLogsOnError), so the
    last line that parses as JSON wins.
    """
    if not text:
        return None
    for data in contract.json_objects_last_first(text):
        try:
            if contract.REASON in data:
                return FailureSummary.model_validate(data)
            if contract.PATH in data:
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
