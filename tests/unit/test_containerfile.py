"""operator/Containerfile, checked without a container engine: sources exist, entrypoint."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "operator" / "Containerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_every_copy_source_exists() -> None:
    copies = [rest for op, rest in _instructions() if op == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def test_entrypoint_is_the_console_script() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = [rest for op, rest in _instructions() if op == "ENTRYPOINT"]
    assert json.loads(entry) == ["spyre-operator"]
    assert scripts["spyre-operator"] == "spyre_operator.cli:main"


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for op, rest in _instructions() if op == "USER"]
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_no_engine_extra() -> None:
    """The operator image must not pull torch/vLLM (the `engine` extra)."""
    runs = " ".join(rest for op, rest in _instructions() if op == "RUN")
    assert "[engine" not in runs and "torch" not in runs and "vllm" not in runs.lower()
    copies = " ".join(rest for op, rest in _instructions() if op == "COPY")
    assert "engine/" not in copies
