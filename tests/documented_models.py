"""Every SpyreModel the project ships or documents, found where users copy them from.

The samples (``operator/samples/*.yaml``), each YAML block of the READMEs, docs/*.md and
GITOPS.md that is a SpyreModel, and the chart NOTES' heredoc. A new sample, block or docs page is
picked up by itself; the unit, integration (server-side dry run) and engine (the plugin's own
check) tests all use this list.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "operator" / "samples"
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "engine" / "README.md",
    ROOT / "charts" / "spyre-model-operator" / "README.md",
    ROOT / "charts" / "spyre-model-operator" / "GITOPS.md",
]
NOTES = ROOT / "charts" / "spyre-model-operator" / "templates" / "NOTES.txt"

_FENCE = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.M | re.S)
_HEREDOC = re.compile(r"<<'YAML'\n(.*?)^\s*YAML$", re.M | re.S)


def _spyre_models(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") == "SpyreModel"]


def documented_models() -> list[tuple[str, dict[str, Any]]]:
    """(where, SpyreModel) for each shipped or documented SpyreModel."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(SAMPLES.glob("*.yaml")):
        for i, doc in enumerate(_spyre_models(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{i}", doc))
    for path in DOCS:
        text = path.read_text()
        for block in _FENCE.finditer(text):
            if "kind: SpyreModel" not in block.group(1):
                continue
            line = text[: block.start()].count("\n") + 1
            for i, doc in enumerate(_spyre_models(block.group(1))):
                found.append((f"{path.relative_to(ROOT)}:{line}#{i}", doc))
    for block in _HEREDOC.finditer(NOTES.read_text()):
        for i, doc in enumerate(_spyre_models(textwrap.dedent(block.group(1)))):
            found.append((f"{NOTES.relative_to(ROOT)}#{i}", doc))
    return found


def mentions_of_spyre_models() -> int:
    """How many places name ``kind: SpyreModel`` as a manifest (a cross-check of the parser)."""
    top = re.compile(r"^kind: SpyreModel\s*$", re.M)  # a manifest's, not a reference's
    count = sum(len(top.findall(p.read_text())) for p in SAMPLES.glob("*.yaml"))
    for path in DOCS:
        count += sum(len(top.findall(b.group(1))) for b in _FENCE.finditer(path.read_text()))
    return count + NOTES.read_text().count("\n  kind: SpyreModel\n")
