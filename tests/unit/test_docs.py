"""The README is a user's manual and the reference lives in docs/: the README stays short, and
every relative link of the README, of docs/*.md and of the other documents that point into them
reaches an existing file and, for a Markdown file, an existing heading (GitHub's anchors)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The longest the README may grow: past it, move the material to docs/.
README_MAX_LINES = 400
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: Documents whose links are checked: the README, docs/, and those that link into them.
CHECKED = [README, *DOCS, *(ROOT / p for p in (
    "CHANGELOG.md",
    "charts/spyre-model-operator/README.md",
    "charts/spyre-model-operator/GITOPS.md",
    "engine/README.md",
    "operator/DESIGN.md",
    "operator/SCALE-TO-ZERO.md",
))]

_FENCE = re.compile(r"^ *```.*?^ *```[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def _prose(text: str) -> str:
    """The text outside fenced code blocks (lines kept, so positions still count lines)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped
    (hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: its headings' (repeats get -1, -2, ...) and HTML ones."""
    prose = _prose(path.read_text())
    seen: Counter[str] = Counter()
    out = set(_HTML_ANCHOR.findall(prose))
    for m in _HEADING.finditer(prose):
        s = slug(m.group(2))
        out.add(s if not seen[s] else f"{s}-{seen[s]}")
        seen[s] += 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link of a Markdown file outside code."""
    prose = _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), _prose(path.read_text()))
    return [(prose[: m.start()].count("\n") + 1, m.group(1)) for m in _LINK.finditer(prose)]


def broken_links(path: Path) -> list[str]:
    out = []
    for line, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT)}:{line}: {target}"
        if not dest.exists():
            out.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{where} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return out


def test_the_readme_is_a_manual_not_the_reference() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference material "
        "to docs/ and link it from the README's Documentation index")


def test_the_readme_indexes_every_docs_page() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)}
    assert DOCS and not [d.name for d in DOCS if d.resolve() not in linked]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_heading(path: Path) -> None:
    assert not broken_links(path)


def test_slugs_are_githubs() -> None:
    assert slug("Pods and SCCs: `podUser`") == "pods-and-sccs-poduser"
    assert slug("`make demo`: what it does") == "make-demo-what-it-does"
    assert slug("How it is tested: what is real, what stands in") == (
        "how-it-is-tested-what-is-real-what-stands-in")
    assert slug("usage and gc (the cache volume over time)") == (
        "usage-and-gc-the-cache-volume-over-time")
    assert slug("A — B") == "a--b"
