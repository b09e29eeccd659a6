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


def test_no_template_or_flag_spells_the_version() -> None:
    """Issue 47, 6: what a user reads about the built-in engine image follows the version (a
    bump must not leave a stale one behind): the chart's NOTES take the chart's appVersion and
    the operator's --help the package's."""
    from spyre_operator.cli import build_parser

    literal = re.compile(rf"spyre-engine:{re.escape(_version())}\b")
    for rel in ("charts/spyre-model-operator/templates/NOTES.txt",
                "operator/spyre_operator/cli.py"):  # fmt: skip
        assert not literal.search((ROOT / rel).read_text()), f"{rel} spells the version"
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    assert site.BUILTIN_ENGINE_IMAGE in "".join(run.format_help().split())  # unwrapped
