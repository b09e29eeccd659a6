"""What ``make release`` refuses before it builds anything (issues 47, 6 and 48): a version
without its CHANGELOG.md section, and a working tree that is not its commit (changes, staged or
not, or untracked files); ``--allow-dirty`` releases it anyway and the images' revision label
then says ``<commit>-dirty``. Run on a throwaway git repository, with git itself. And the chart
archive a release rewrites so that packaging it again gives the same bytes (issue 48, 1)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.scripts import script

ROOT = Path(__file__).resolve().parents[2]


R = script("release")
M = script("mirror")
P = script("provenance")
CHANGELOG = "# Changelog\n\n## [Unreleased]\n\n## [1.2.0]\n\n- first\n"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    (tmp_path / "CHANGELOG.md").write_text(CHANGELOG)
    (tmp_path / ".gitignore").write_text("dist/\n")
    (tmp_path / "a.txt").write_text("a\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_a_clean_checkout_with_the_versions_section_is_released(repo: Path) -> None:
    (repo / "dist").mkdir()
    (repo / "dist" / "chart.tgz").write_text("ignored output")
    R.check_release_inputs("1.2.0", allow_dirty=False, root=repo)
    commit, when = R.source_revision(repo)
    assert len(commit) == 40 and when > 0


def test_a_version_without_its_changelog_section_is_refused(repo: Path) -> None:
    with pytest.raises(SystemExit, match=r"no '## \[1\.3\.0\]' section"):
        R.check_release_inputs("1.3.0", allow_dirty=True, root=repo)
    assert R.changelog_versions(CHANGELOG) == ["Unreleased", "1.2.0"]


@pytest.mark.parametrize("change", ["edited", "staged", "untracked", "deleted", "renamed"])
def test_a_tree_that_is_not_its_commit_is_refused_unless_allowed(repo: Path,
                                                                 change: str) -> None:
    if change == "edited":
        (repo / "a.txt").write_text("b\n")
    elif change == "staged":
        (repo / "a.txt").write_text("b\n")
        _git(repo, "add", "a.txt")
    elif change == "untracked":
        (repo / "new file.txt").write_text("x")
    elif change == "deleted":
        (repo / "a.txt").unlink()
    else:
        _git(repo, "mv", "a.txt", "b.txt")
    with pytest.raises(SystemExit, match="changes or untracked files"):
        R.check_release_inputs("1.2.0", allow_dirty=False, root=repo)
    R.check_release_inputs("1.2.0", allow_dirty=True, root=repo)
    assert R.source_revision(repo)[0].endswith("-dirty")
    # each change once, by its path (a rename by its new one: its source is no entry)
    assert R.tree_changes(repo) == [{"edited": "a.txt", "staged": "a.txt",
                                     "untracked": "new file.txt", "deleted": "a.txt",
                                     "renamed": "b.txt"}[change]]  # fmt: skip


def test_outside_git_it_cannot_tell_the_commit(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text(CHANGELOG)
    with pytest.raises(SystemExit, match="not a git checkout"):
        R.check_release_inputs("1.2.0", allow_dirty=False, root=tmp_path)
    assert R.source_revision(tmp_path) == ("unknown", 0)


def test_this_checkouts_version_has_its_section() -> None:
    """The version make release would publish now has a CHANGELOG section (a bump without one
    fails here, before anyone runs the release)."""
    version = R.project_version()
    assert version in R.changelog_versions((ROOT / "CHANGELOG.md").read_text()), version


def _registry(tags: dict[str, tuple[int, str]]) -> tuple[list[str], Any]:
    asked: list[str] = []

    def inspect(ref: str) -> tuple[int, str]:
        asked.append(ref)
        return tags.get(ref, (1, f"reading manifest in {ref}: manifest unknown"))

    return asked, inspect


def test_a_version_the_registry_has_is_refused_naming_what_is_there() -> None:
    asked, inspect = _registry({"r.example/spyre/charts/spyre-model-operator:1.2.0": (0, "")})
    with pytest.raises(SystemExit, match=r"1\.2\.0 is published already "
                       r"\(r\.example/spyre/charts/spyre-model-operator:1\.2\.0\)"):
        R.check_unpublished("r.example/spyre", "1.2.0", inspect)
    assert asked == R.release_refs("r.example/spyre", "1.2.0")
    assert [r.rsplit("/", 1)[-1] for r in asked] == [
        "spyre-model-operator:1.2.0", "spyre-engine:1.2.0", "spyre-model-operator:1.2.0",
        "spyre-model-operator-bundle:1.2.0", "spyre-model-operator-catalog:1.2.0"]


def test_a_version_the_registry_lacks_is_released() -> None:
    # distribution answers NAME_UNKNOWN for a repository it never saw, MANIFEST_UNKNOWN for a tag
    _, inspect = _registry({
        "r.example/spyre/spyre-engine:1.2.0":
            (1, "name unknown: repository name not known to registry")})
    R.check_unpublished("r.example/spyre", "1.2.0", inspect)


def test_a_registry_that_cannot_answer_stops_the_release() -> None:
    _, inspect = _registry({"r.example/spyre/spyre-model-operator:1.2.0": (
        1, "pinging container registry r.example: connection refused")})
    with pytest.raises(SystemExit, match="cannot tell whether .* is published already: "
                       "pinging container registry r.example: connection refused"):
        R.check_unpublished("r.example/spyre", "1.2.0", inspect)


def test_a_clean_release_tags_its_commit_and_a_tag_elsewhere_refuses_the_version(
    repo: Path,
) -> None:
    assert R.tag_release("1.2.0", repo) == "v1.2.0"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    tagged = subprocess.run(["git", "-C", str(repo), "rev-parse", "v1.2.0^{commit}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    kind = subprocess.run(["git", "-C", str(repo), "cat-file", "-t", "v1.2.0"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (tagged, kind) == (head, "tag")  # annotated, on HEAD
    R.tag_release("1.2.0", repo)  # again on the same commit: kept
    R.check_release_inputs("1.2.0", allow_dirty=False, root=repo)
    (repo / "a.txt").write_text("later\n")
    _git(repo, "commit", "-q", "-am", "two")
    with pytest.raises(SystemExit, match=r"tag v1\.2\.0 names commit .* not HEAD"):
        R.check_release_inputs("1.2.0", allow_dirty=False, root=repo)


OP = "registry.example/spyre/spyre-model-operator"
ENG = "registry.example/spyre/spyre-engine"
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_mirror_reads_the_pinned_images_from_the_charts_values_as_yaml() -> None:
    """``make mirror`` takes the images to copy from the chart it pulls (a registry's: not
    trusted), parsed, not grepped: a decoy line, keys in another order or quoted values
    change nothing; a value that is not a repository and a digest stops it."""
    values = (f"# image:\n#  repository: evil.example/x\n"
              f"defaults:\n  repository: evil.example/y\n"
              f"  engineImage: \"{ENG}@{D2}\"\n"
              f"image:\n  digest: '{D1}'\n  pullPolicy: IfNotPresent\n  repository: {OP}\n")
    assert M.pinned_images(values, "r") == ((OP, D1), (ENG, D2))
    # the chart as the repository ships it, pinned as release.py pins it
    chart = (ROOT / "charts" / "spyre-model-operator" / "values.yaml").read_text()
    with pytest.raises(SystemExit, match=r"image\.digest is ''"):
        M.pinned_images(chart, "r")
    for bad, why in (
        (f"image: {{repository: {OP}, digest: {D1}}}\ndefaults: {{engineImage: {ENG}:latest}}",
         "pins defaults.engineImage as"),
        (f"image: {{repository: '{OP} --all', digest: {D1}}}\n"
         f"defaults: {{engineImage: '{ENG}@{D2}'}}", "pins image as"),
        (f"image: {{repository: {OP}, digest: sha256:abc}}\n"
         f"defaults: {{engineImage: '{ENG}@{D2}'}}", "pins image as"),
        ("image: [1, 2]", r"image\.repository is None"),
        ("image: {repository: [", "does not parse"),
    ):
        with pytest.raises(SystemExit, match=why):
            M.pinned_images(bad, "r")


def _chart_tgz(path: Path, mtime: int) -> None:
    """A chart archive as helm package writes one: entries dated ``mtime``, gzip dated now."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("c/Chart.yaml", b"name: c\nversion: 0.1.0\n"),
                           ("c/values.yaml", b"a: 1\n"), ("c/templates/x.yaml", b"kind: X\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.uname = len(data), mtime, 1000, "someone"
            tar.addfile(info, io.BytesIO(data))
    os.utime(path, (mtime, mtime))


def test_the_chart_archive_is_the_same_bytes_whenever_it_is_packaged(tmp_path: Path) -> None:
    """Issue 48, 1: helm package dates each entry (and gzip its header) now; the release
    rewrites the archive dated by the commit, entries in helm's order, and dates the file so
    (helm push takes it as the manifest's created annotation)."""
    a, b = tmp_path / "a.tgz", tmp_path / "b.tgz"
    _chart_tgz(a, 1_700_000_000)
    _chart_tgz(b, 1_700_000_999)
    assert a.read_bytes() != b.read_bytes()
    for p in (a, b):
        R.reproducible_tgz(p, 1_765_000_000)
    assert a.read_bytes() == b.read_bytes()
    assert int(a.stat().st_mtime) == 1_765_000_000
    with tarfile.open(a) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["c/Chart.yaml", "c/values.yaml", "c/templates/x.yaml"]
        assert {(m.mtime, m.uid, m.uname) for m in members} == {(1_765_000_000, 0, "")}
        assert tar.extractfile("c/values.yaml").read() == b"a: 1\n"  # type: ignore[union-attr]


@pytest.mark.parametrize(("remote", "url"), [
    ("https://user:token@github.com/acme/spyre.git", "https://github.com/acme/spyre"),
    ("git@github.com:acme/spyre.git", "https://github.com/acme/spyre"),
    ("ssh://git@gitlab.example.com:2222/a/b.git", "https://gitlab.example.com/a/b"),
    ("git://git.example.org/a/b", "https://git.example.org/a/b"),
    ("http://git.example.org:8080/a", "http://git.example.org:8080/a"),
    ("/work/main", None), ("file:///srv/git/spyre", None), ("../spyre", None),
    ("C:\\src\\spyre", None), ("https://github.com/", None), ("https://localhost/a", None),
    ("https://h.example:99999/a", None), ("https://h.example/a b", None),
    ("https://h.example/a?x=1", None), ("https://h.example/a#frag", None), ("", None),
])  # fmt: skip
def test_a_remote_becomes_the_https_url_a_reader_opens_or_nothing(remote: str,
                                                                 url: str | None) -> None:
    """Issue 48, 4: the images' source label is a repository a reader can open, credentials
    dropped; a local path names no source (a test clone's origin): left out, not made up."""
    assert P.public_url(remote) == url


@given(st.one_of(st.text(max_size=80), st.from_regex(
    r"(https?|ssh|git|file)://([a-z:@]{0,12}@)?[a-z0-9.:\[\]-]{0,20}/\S{0,30}", fullmatch=True)))
def test_any_remote_gives_an_url_without_credentials_or_nothing(remote: str) -> None:
    url = P.public_url(remote)
    assert url is None or (re.fullmatch(r"https?://[A-Za-z0-9.-]+(:\d+)?(/[A-Za-z0-9._~-]+)+",
                                        url) and "@" not in url), url


def test_the_source_is_the_one_given_else_the_origin_else_none(
    repo: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(P.SOURCE_ENV, raising=False)
    assert P.source_url(repo) is None  # no origin
    _git(repo, "remote", "add", "origin", "git@github.com:acme/spyre.git")
    assert P.source_url(repo) == "https://github.com/acme/spyre"
    monkeypatch.setenv(P.SOURCE_ENV, "https://git.example.org/site/spyre")
    assert P.source_url(repo) == "https://git.example.org/site/spyre"
    monkeypatch.setenv(P.SOURCE_ENV, "/a/local/path")
    with pytest.raises(SystemExit, match="not an http"):
        P.source_url(repo)


def test_the_labels_name_version_commit_its_time_and_a_known_source_only() -> None:
    labels = P.release_labels("1.2.0", "abc123-dirty", 315532800, None)
    assert labels == {"org.opencontainers.image.version": "1.2.0",
                      "org.opencontainers.image.revision": "abc123-dirty",
                      "org.opencontainers.image.created": "1980-01-01T00:00:00Z"}
    assert P.release_labels("1.2.0", "abc", 0, "https://h.example/a")[
        "org.opencontainers.image.source"] == "https://h.example/a"
