"""The operator image rebuilt bit for bit (issue 48, 1).

Two clean builds (``buildah build --no-cache``: no layer reused) of operator/Containerfile from
this checkout, on the same base, give the same image: the same config digest (its layers'
uncompressed digests, its history and dates) and the same manifest digest once written as an
OCI layout (the compressed layers a registry gets). What makes it so: every file of the image's
own layers and the image are dated SOURCE_DATE_EPOCH (tests/images/build.py, buildah's
``--timestamp``), the dependencies come from operator/requirements.lock (versions and hashes),
bytecode is compiled hash-checked. When the two differ, the test names the files that do.

The base is this machine's debootstrapped Debian (tests/images/build.py, built once and
cached): the claim is "the same inputs give the same image", the base being one of them.
Under emulation (the other architectures of a release) the same recipe holds, except where a
platform has no wheel and the lock's sdist is compiled (ppc64le, s390x): not rebuilt here.

    .venv/bin/python -m pytest -m images tests/integration/test_reproducible.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.images import build

pytestmark = [
    pytest.mark.images,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("buildah") is None,
        reason="needs root and buildah (apt-get install buildah)",
    ),
]


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> what a layer records of it (type, mode, owner, mtime and
    the content's sha256 or the link's target)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what = f"-> {os.readlink(p)}"
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            else:
                what = ""
            out[str(p.relative_to(root))] = (f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid} "
                                             f"{int(st.st_mtime)} {what}")  # fmt: skip
    return out


def config_differences(ref_a: str, ref_b: str) -> list[str]:
    """What differs between two images' OCI configs (created, history, labels, rootfs...)."""
    a, b = (json.loads(build.buildah("inspect", "--type", "image", r, capture=True))["OCIv1"]
            for r in (ref_a, ref_b))  # fmt: skip

    def flat(x: object, at: str = "") -> dict[str, str]:
        if isinstance(x, dict):
            return {k: v for key, val in x.items() for k, v in flat(val, f"{at}.{key}").items()}
        if isinstance(x, list):
            return {k: v for i, val in enumerate(x) for k, v in flat(val, f"{at}[{i}]").items()}
        return {at: json.dumps(x)}

    fa, fb = flat(a), flat(b)
    return [f"config{k}: {fa.get(k, '(absent)')} | {fb.get(k, '(absent)')}"
            for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]  # fmt: skip


def differences(a: dict[str, str], b: dict[str, str], limit: int = 20) -> list[str]:
    """What differs between two trees (:func:`_tree`), path by path."""
    out = [f"{p}: {a.get(p, '(absent)')} | {b.get(p, '(absent)')}"
           for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p)]  # fmt: skip
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


class Built:
    """One clean build of the operator image, in buildah's storage as ``ref``."""

    def __init__(self, ref: str, tmp: Path) -> None:
        self.ref, self.tmp = ref, tmp
        self.config = build.buildah("inspect", "--type", "image", "--format",
                                    "{{.FromImageID}}", ref, capture=True).strip()  # fmt: skip
        layout = tmp / "layout"
        build.buildah("push", "--quiet", ref, f"oci:{layout}:x")
        index = json.loads((layout / "index.json").read_text())
        self.manifest = index["manifests"][0]["digest"]

    def tree(self) -> dict[str, str]:
        return self.tree_of(self.ref)

    @staticmethod
    def tree_of(ref: str) -> dict[str, str]:
        """The files of image ``ref`` (:func:`_tree`)."""
        ctr = build.buildah("from", "--pull=never", "--quiet", ref, capture=True).strip()
        try:
            mnt = build.buildah("mount", ctr, capture=True).strip()
            return _tree(Path(mnt))
        finally:
            subprocess.run([*build.buildah_cmd(), "rm", ctr], capture_output=True)


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Built, Built]]:
    build.require_tools()
    spec = build.SPECS["operator"]
    base = build.ensure_base(build.HOST_ARCH)
    refs = [f"localhost/spyre-reproducible-{uuid.uuid4().hex[:8]}:{i}" for i in (1, 2)]
    built: list[Built] = []
    try:
        for ref in refs:
            tmp = tmp_path_factory.mktemp("rebuild")
            build.stage_context(spec, tmp / "ctx")
            build.buildah(*build.build_args(spec, base, build.HOST_ARCH, tmp / "ctx", ref,
                                            cache=False))  # fmt: skip
            built.append(Built(ref, tmp))
        yield built[0], built[1]
    finally:
        for ref in refs:
            subprocess.run([*build.buildah_cmd(), "rmi", "-f", ref], capture_output=True)
        subprocess.run([*build.buildah_cmd(), "rmi", "--prune"], capture_output=True)


def test_two_clean_builds_of_the_operator_image_are_the_same_image(
    two_builds: tuple[Built, Built],
) -> None:
    a, b = two_builds
    if (a.config, a.manifest) != (b.config, b.manifest):
        diff = config_differences(a.ref, b.ref) + differences(a.tree(), b.tree())
        raise AssertionError(
            f"two builds of the same inputs differ: config {a.config[:19]} vs {b.config[:19]}, "
            f"manifest {a.manifest[:19]} vs {b.manifest[:19]}; the files that differ:\n  "
            + "\n  ".join(diff or ["(none: the image config or the layers' order or dates)"]))


def test_the_image_is_dated_by_the_constant_not_the_build() -> None:
    """What keeps the digest: the image (and each file of its layers) is dated
    SOURCE_DATE_EPOCH, a release's labelled() then dates its config with the commit."""
    img = build.in_storage(build.ensure_image("operator"))
    created = json.loads(build.buildah("inspect", "--type", "image", img, capture=True))
    when = created["OCIv1"]["created"]
    assert when.startswith("1980-01-01T00:00:00"), when
