"""The version lives in one place, pyproject.toml (issue "Installable from a release")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import spyre_engine
import spyre_operator
import yaml
from spyre_operator.desired import site

ROOT = Path(__file__).resolve().parents[2]


def _version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_packages_read_the_version_from_their_metadata() -> None:
    assert spyre_operator.__version__ == spyre_engine.__version__ == _version()
    assert site.BUILTIN_ENGINE_IMAGE.endswith(f":{_version()}")


def test_the_chart_carries_the_same_version() -> None:
    chart = yaml.safe_load((ROOT / "charts/spyre-model-operator/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == _version(), (
        "bump charts/spyre-model-operator/Chart.yaml's version and appVersion with "
        "pyproject.toml's")


def test_the_changelog_has_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert headings[0] == "Unreleased", headings
    assert _version() in headings, f"CHANGELOG.md has no '## [{_version()}]' heading"
