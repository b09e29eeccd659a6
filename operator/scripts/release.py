#!/usr/bin/env python3
"""``make release`` and ``make mirror``: publish the operator and engine images and the Helm
chart to an OCI registry, the chart pinned to the images' digests.

    release.py release --registry registry.example.com/spyre [--version 0.1.0]
    release.py mirror --from registry.example.com/spyre --to mirror.site.local/spyre \\
        [--version 0.1.0]

``release``:

1. The operator image (operator/Containerfile) for linux/amd64, arm64, ppc64le and s390x (the
   others than the host's built under qemu-user-static: tests/images/build.py ``--arch``),
   and the engine image: engine/Containerfile on ``--engine-base`` (default: IBM's
   spyre-runtime image, the production image for cards; see the Containerfile's header), or
   with ``--cpu-engine`` the CPU image of ``tests/images/build.py`` (what the tests and ``make
   demo`` run), or ``--engine-image`` as it is (e.g. built with engine/Containerfile.layer on
   a site's own vLLM-Spyre image of another architecture).
2. Both pushed with buildah: ``<registry>/spyre-model-operator:<version>`` as a manifest list
   (one entry per built platform) and ``<registry>/spyre-engine:<version>``; their digests are
   read back from the push.
3. The chart packaged with ``version``/``appVersion`` = the version, ``image.repository`` +
   ``image.digest`` and ``defaults.engineImage`` (``<registry>/spyre-engine@sha256:...``)
   pinned, and pushed as ``oci://<registry>/charts/spyre-model-operator:<version>``.
4. The OLM bundle (operator/scripts/bundle.py: the CSV naming both images by digest) as
   ``<registry>/spyre-model-operator-bundle:<version>`` and its file-based catalog as
   ``<registry>/spyre-model-operator-catalog:<version>`` (on ``--catalog-base``, opm's image,
   which serves it; ``scratch`` in the tests), the catalog naming the bundle by digest.
5. With ``--sign-key`` (release_signing.py): every image and the chart signed with cosign by
   digest, each image's SBOM (syft, SPDX) attached as a signed attestation, the SBOMs in
   ``--out`` too.
6. ``release-<version>.json`` (refs, digests, chart, SBOMs) in ``--out``.

``mirror`` (mirror.py) copies a release into a site's registry, digests unchanged (``skopeo
copy --all --preserve-digests``, registry to registry: the index with every platform, the engine's
compressed layers as they are; the bundle and catalog images too) with their cosign signatures
and attestations (``cosign copy --only=sig,att``), and re-publishes the chart with the mirror's
repositories (same digests) to ``oci://<to>/charts``.

The version lives in one place, pyproject.toml; ``--version`` defaults to it and must equal it
(the chart and both packages read it from there: tests/unit/test_version.py).

``release`` refuses, before building anything, a version without its ``## [<version>]``
section in CHANGELOG.md, and a working tree with changes or untracked files (what was released
would not be the commit its images name); ``--allow-dirty`` (the tests' releases) releases it
anyway, and the images' revision label then says ``<commit>-dirty``. It refuses a version
the registry has already (either image or the chart, asked with ``skopeo inspect``): a
published release is never overwritten (``--replace``: the tests' own registry). A clean
release tags its commit ``v<version>`` (annotated, local: push it yourself) and refuses to
start when that tag names another commit.

``--plain-http`` talks HTTP to the registry (a loopback registry, as in the tests); otherwise
HTTPS with the system's trust store. Log in beforehand when the registry needs it
(``buildah login`` or ``skopeo login``, and ``helm registry login``). Only the standard
library, PyYAML (``mirror`` parses the chart it pulls), buildah, skopeo, helm, and cosign and
syft (signing; ``mirror`` copies signatures with cosign).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "spyre-model-operator"
CHART_NAME = "spyre-model-operator"
OPERATOR_NAME = "spyre-model-operator"
ENGINE_NAME = "spyre-engine"
#: The OLM bundle (registry+v1) and its file-based catalog (operator/scripts/bundle.py).
BUNDLE_NAME = f"{OPERATOR_NAME}-bundle"
CATALOG_NAME = f"{OPERATOR_NAME}-catalog"

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import release_signing as signing  # noqa: E402  (beside this file)
from provenance import SOURCE_ENV, release_labels, source_url  # noqa: E402  (beside it)

from tests.images import build  # noqa: E402  (the project's image builder)


def log(msg: str) -> None:
    print(f"[release] {msg}", file=sys.stderr, flush=True)


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


@dataclass(frozen=True)
class Release:
    version: str
    registry: str
    operator: str  # repository@sha256:... (a manifest list)
    operator_platforms: list[str]
    engine: str  # repository@sha256:... (one image, or an index with --engine-layer)
    chart: str  # oci://registry/charts/spyre-model-operator
    chart_digest: str
    bundle: str = ""  # repository@sha256:... (OLM's registry+v1 bundle)
    catalog: str = ""  # repository@sha256:... (its file-based catalog)
    #: the engine index's os/architecture entries (--engine-layer); empty: a single image
    engine_platforms: list[str] = field(default_factory=list)
    #: signed with --sign-key: {image (repository@digest, one per platform): its SBOM file in
    #: the release's directory, attached to it as a signed attestation}; empty: not signed
    sboms: dict[str, str] = field(default_factory=dict)

    def write(self, out: Path) -> Release:
        """``out``/release-<version>.json; returns itself."""
        (out / f"release-{self.version}.json").write_text(json.dumps(asdict(self), indent=2)
                                                          + "\n")
        return self


def index_platforms(index: str) -> list[str]:
    """``os/architecture`` of each entry of an image index (manifest list) in JSON."""
    return [f"{m['platform']['os']}/{m['platform']['architecture']}"
            for m in json.loads(index).get("manifests", [])]


# --- tools ---------------------------------------------------------------------------------


def helm_bin() -> str:
    """helm on PATH, else the one `make binaries` built."""
    found = shutil.which("helm")
    if found:
        return found
    from tests.cluster.controlplane import default_bin_dir

    cached = default_bin_dir() / "helm"
    if os.access(cached, os.X_OK):
        return str(cached)
    raise SystemExit("helm not found: `make binaries` builds it, or put helm on PATH")


def run(argv: Sequence[str], env: dict[str, str] | None = None, capture: bool = False) -> str:
    r = subprocess.run(list(argv), text=True, env=env, stdout=subprocess.PIPE if capture
                       else sys.stderr, stderr=subprocess.PIPE)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr.strip()}")
    return (r.stdout or "").strip() if capture else ""


def tls_flag(plain_http: bool) -> list[str]:
    return ["--tls-verify=false"] if plain_http else []


def _digest_of_push(args: Sequence[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "digest"
        run([*build.buildah_cmd(), *args[:1], "--digestfile", str(f), *args[1:]])
        digest = f.read_text().strip()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise SystemExit(f"no digest from buildah {args[0]}: {digest!r}")
    return digest


# --- images --------------------------------------------------------------------------------


def tree_changes(root: Path = ROOT) -> list[str] | None:
    """The paths git reports changed, staged or untracked (not ignored) in ``root``'s working
    tree ([]: clean), or None outside a git checkout."""
    r = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v1", "-z",
                        "--untracked-files=normal"], capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        return None
    # -z: "XY path\0", a rename's source as one more NUL-terminated field
    entries = r.stdout.split("\0")
    out, skip = [], False
    for entry in entries:
        if skip or not entry:
            skip = False
            continue
        status, path = entry[:2], entry[3:]
        out.append(path)
        skip = "R" in status or "C" in status
    return out


def source_revision(root: Path = ROOT) -> tuple[str, int]:
    """(commit, commit time) of ``root``'s HEAD, the commit with ``-dirty`` when the working
    tree differs from it; ("unknown", 0) outside git."""
    r = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%H %ct"],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0 or not r.stdout.strip():
        return "unknown", 0
    commit, when = r.stdout.split()
    return commit + ("-dirty" if tree_changes(root) else ""), int(when)


def tag_name(version: str) -> str:
    return f"v{version}"


def _tagged_commit(version: str, root: Path) -> str | None:
    """The commit the release's tag names, or None when there is no such tag."""
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "-q", "--verify",
                        f"refs/tags/{tag_name(version)}^{{commit}}"],
                       capture_output=True, text=True)  # fmt: skip
    return r.stdout.strip() or None if r.returncode == 0 else None


def _head(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def check_tag(version: str, root: Path = ROOT) -> bool:
    """Whether HEAD has the tag ``v<version>`` already (False: no such tag). A tag on another
    commit means that version was made from other sources: SystemExit, before anything is
    built."""
    tagged = _tagged_commit(version, root)
    if tagged is None:
        return False
    head = _head(root)
    if tagged != head:
        raise SystemExit(f"the tag {tag_name(version)} names commit {tagged[:12]}, not HEAD "
                         f"({head[:12]}): version {version} was made from other sources; "
                         "bump the version")
    return True


def tag_release(version: str, root: Path = ROOT) -> str:
    """Tag HEAD ``v<version>`` (annotated) once its release is published; an existing tag on
    HEAD is kept. Returns the tag's name; push it with ``git push origin <tag>``."""
    tag = tag_name(version)
    if not check_tag(version, root):
        subprocess.run(["git", "-C", str(root), "-c", "user.name=spyre release",
                        "-c", "user.email=release@spyre-model-operator.invalid", "tag", "-a",
                        tag, "-m", f"spyre-model-operator {version}"],
                       check=True, capture_output=True)  # fmt: skip
    return tag


#: What buildah records of the image a build started from (its manifest's annotations).
BASE_ANNOTATIONS = ("org.opencontainers.image.base.name", "org.opencontainers.image.base.digest")


def base_annotations(local: str) -> dict[str, str]:
    """The base ``local`` (in buildah's storage) was built on, as buildah annotated it; empty
    for an image without them (one made elsewhere)."""
    info = json.loads(run([*build.buildah_cmd(), "inspect", "--type", "image", local],
                          capture=True))  # fmt: skip
    annotations = info.get("ImageAnnotations") or {}
    return {k: annotations[k] for k in BASE_ANNOTATIONS if k in annotations}


def labelled(local: str, name: str, version: str) -> str:
    """``local`` with the release's OCI labels (:func:`release_labels`), created at the
    commit's time so that the same commit gives the same image: a new image (a new config
    digest, the same layers). Also what keeps a release apart from the test images it is built
    from: containerd's CRI image store lost track of an image imported under one name once the
    same image (same config digest) was pulled under another, and the kubelet then found
    neither (seen on the real node with containerd 1.6). The base ``local`` was built on
    (buildah's ``org.opencontainers.image.base.name`` and ``.digest`` annotations) stays the
    release's base: committed as it is, the release would name ``local`` itself."""
    commit, when = source_revision()
    bh = build.buildah_cmd()
    base = base_annotations(local)
    ctr = run([*bh, "from", "--pull=never", "--quiet", local], capture=True).splitlines()[-1]
    arch = run([*bh, "inspect", "--format", "{{.OCIv1.Architecture}}", ctr], capture=True)
    ref = f"localhost/{name}-release-{arch}:{version}"
    try:
        labels = release_labels(version, commit, when, source_url())
        run([*bh, "config", *(a for k, v in labels.items() for a in ("--label", f"{k}={v}")),
             *(a for k, v in base.items() for a in ("--annotation", f"{k}={v}")),
             ctr])  # fmt: skip
        run([*bh, "commit", "--quiet", "--timestamp", str(when), ctr, ref])
    finally:
        subprocess.run([*bh, "rm", ctr], capture_output=True)
    return ref


def push_operator(registry: str, version: str, plain_http: bool,
                  archs: Sequence[str] = build.OPERATOR_PLATFORMS) -> tuple[str, list[str]]:
    """The operator image for each of ``archs`` (the host's natively, the others under
    qemu-user-static), as one manifest list at ``<registry>/spyre-model-operator:<version>``;
    returns (repository@digest, platforms)."""
    locals_ = [labelled(build.in_storage(build.ensure_image("operator", arch=a)),
                        OPERATOR_NAME, version) for a in archs]
    return push_index(OPERATOR_NAME, locals_, registry, version, plain_http)


def push_index(name: str, locals_: Sequence[str], registry: str, version: str,
               plain_http: bool) -> tuple[str, list[str]]:
    """``locals_`` (one image per platform, in buildah's storage) as one image index at
    ``<registry>/<name>:<version>``; returns (repository@digest, its platforms)."""
    repo = f"{registry}/{name}"
    lst = f"{repo}:{version}"
    bh = build.buildah_cmd()
    subprocess.run([*bh, "manifest", "rm", lst], capture_output=True)  # an earlier run's list
    run([*bh, "manifest", "create", lst])
    for local in locals_:
        run([*bh, "manifest", "add", lst, f"containers-storage:{local}"])
    platforms = index_platforms(run([*bh, "manifest", "inspect", lst], capture=True))
    log(f"pushing {lst} ({', '.join(platforms)})")
    digest = _digest_of_push(["manifest", "push", "--all", *tls_flag(plain_http), lst,
                              f"docker://{lst}"])  # fmt: skip
    subprocess.run([*bh, "manifest", "rm", lst], capture_output=True)
    forget(*locals_)
    return f"{repo}@{digest}", platforms


def forget(*locals_: str) -> None:
    """Drop pushed images from buildah's storage. A labelled copy kept there holds its layers:
    the engine's, 9 GB, stayed after the engine image it was made from was rebuilt and gone."""
    for local in locals_:
        subprocess.run([*build.buildah_cmd(), "rmi", local], capture_output=True)


#: engine/Containerfile's production base (its ARG BASE default).
PRODUCTION_ENGINE_BASE = "quay.io/ibm-aiu/spyre-runtime:latest"


def build_engine(base: str | None, image: str | None = None) -> str:
    """The engine image in buildah's storage: ``image`` as given (built elsewhere, e.g. a
    site's own layered image: a name in buildah's storage or ``docker-archive:<path>``), the
    CPU one (tests/images), or engine/Containerfile on ``base`` (production)."""
    if image:
        if image.split(":", 1)[0] in ("docker-archive", "oci-archive", "oci", "dir", "docker"):
            return run([*build.buildah_cmd(), "pull", "-q", image], capture=True).splitlines()[-1]
        return image
    if base is None:
        return build.in_storage(build.ensure_image("engine"))
    ref = f"localhost/{ENGINE_NAME}:release"
    log(f"building {ref} from engine/Containerfile on {base}")
    run([*build.buildah_cmd(), "build", "--layers", "--build-arg", f"BASE={base}",
         "-f", str(ROOT / "engine" / "Containerfile"), "-t", ref, str(ROOT)])  # fmt: skip
    return ref


#: The architectures Spyre runs on, an engine layer's platforms (IBM Z, Power, x86).
ENGINE_PLATFORMS = ("amd64", "s390x", "ppc64le")


def parse_engine_layers(specs: Sequence[str]) -> dict[str, str]:
    """``ARCH=BASE`` per --engine-layer -> {arch: base}: each a platform Spyre runs on, once."""
    out: dict[str, str] = {}
    for spec in specs:
        arch, sep, base = spec.partition("=")
        arch = arch.strip().removeprefix("linux/")
        if not sep or not base.strip():
            raise SystemExit(f"--engine-layer {spec!r}: expected ARCH=BASE, e.g. "
                             "s390x=registry.example.com/vllm-spyre:2.6.3-s390x")
        if arch not in ENGINE_PLATFORMS:
            raise SystemExit(f"--engine-layer {spec!r}: {arch!r} is not a platform Spyre runs "
                             f"on ({', '.join(ENGINE_PLATFORMS)})")
        if arch in out:
            raise SystemExit(f"--engine-layer: {arch} given twice")
        out[arch] = base.strip()
    return out


def build_engine_layer(arch: str, base: str, python: str, ref: str | None = None,
                       cache: bool = True) -> str:
    """engine/Containerfile.layer on ``base`` for ``arch`` (under qemu-user-static unless it is
    this host's), in buildah's storage as ``ref``; its name. Dated SOURCE_DATE_EPOCH, like the
    operator image: the same base gives the same layer (``cache=False``: nothing reused)."""
    if arch != build.HOST_ARCH:
        build.ensure_binfmt(arch)
    ref = ref or f"localhost/{ENGINE_NAME}-layer-{arch}:release"
    log(f"building {ref}: engine/Containerfile.layer on {base} ({arch})")
    with tempfile.TemporaryDirectory(prefix="engine-layer-") as tmp:
        ctx = layer_context(Path(tmp))
        ca = build.HOST_CA_BUNDLE  # RUN steps only: pip behind a TLS-inspecting proxy
        volume = ["--volume", f"{ca}:{ca}:ro"] if ca.is_file() else []
        epoch = str(build.SOURCE_DATE_EPOCH)
        run([*build.buildah_cmd(), "build", "--isolation", "chroot", *volume,
             "--layers", *([] if cache else ["--no-cache"]), "--timestamp", epoch,
             "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
             "--arch", arch, "--build-arg", f"BASE={base}", "--build-arg", f"PYTHON={python}",
             "-f", str(ctx / "engine" / "Containerfile.layer"), "-t", ref,
             str(ctx)])  # fmt: skip
    return ref


#: What engine/Containerfile.layer copies (its .dockerignore admits these), and the file.
LAYER_CONTEXT = ("pyproject.toml", "README.md", "engine/spyre_engine", "engine/spyre_contract",
                 "engine/senlib.json", "engine/entrypoint.sh",
                 "engine/Containerfile.layer")  # fmt: skip


def layer_context(dest: Path) -> Path:
    """A build context under ``dest`` holding exactly LAYER_CONTEXT (no caches, no tests)."""
    ctx = dest / "ctx"
    for rel in LAYER_CONTEXT:
        src, to = ROOT / rel, ctx / rel
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, to)
    return ctx


def push_engine_index(bases: dict[str, str], python: str, registry: str, version: str,
                      plain_http: bool) -> tuple[str, list[str]]:
    """spyre-engine layered onto each architecture's base, pushed as one index."""
    locals_ = [labelled(build_engine_layer(arch, base, python), ENGINE_NAME, version)
               for arch, base in bases.items()]
    return push_index(ENGINE_NAME, locals_, registry, version, plain_http)


def push_engine(local: str, registry: str, version: str, plain_http: bool) -> str:
    repo = f"{registry}/{ENGINE_NAME}"
    dest = f"{repo}:{version}"
    # zstd: the 9 GB engine compresses in seconds (gzip takes minutes); containerd >= 1.5
    # and CRI-O pull it.
    local = labelled(local, ENGINE_NAME, version)
    log(f"pushing {dest} (zstd)")
    digest = _digest_of_push(["push", *tls_flag(plain_http), "--compression-format", "zstd",
                              local, f"docker://{dest}"])  # fmt: skip
    forget(local)
    return f"{repo}@{digest}"


# --- OperatorHub: the bundle and its catalog -------------------------------------------------


def _bundle_script() -> Any:
    """bundle.py, beside this script."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import bundle

    return bundle


def push_olm(version: str, operator: str, engine: str, registry: str, plain_http: bool,
             out: Path, catalog_base: str) -> tuple[str, str]:
    """The OLM bundle of this release (bundle.py: the CSV from the chart, the images by
    digest) and its file-based catalog as images, both created at the commit's time:
    ``<registry>/spyre-model-operator-bundle:<version>`` and ``-catalog:<version>`` (the
    catalog names the bundle by digest). Returns both as repository@digest."""
    bundle = _bundle_script()
    _, when = source_revision()

    def build_and_push(name: str, files: dict[str, Any], dockerfile: str, pull: str) -> str:
        ctx = out / name
        shutil.rmtree(ctx, ignore_errors=True)
        bundle.write_bundle(files, ctx)
        local = f"localhost/{name}-release:{version}"
        run([*build.buildah_cmd(), "build", "--quiet", f"--pull={pull}", "--timestamp",
             str(when), "--label", f"org.opencontainers.image.version={version}",
             "-f", str(ctx / dockerfile), "-t", local, str(ctx)])  # fmt: skip
        repo = f"{registry}/{name}"
        log(f"pushing {repo}:{version}")
        digest = _digest_of_push(["push", *tls_flag(plain_http), local,
                                  f"docker://{repo}:{version}"])  # fmt: skip
        return f"{repo}@{digest}"

    files = bundle.build_bundle(operator_image=operator, engine_image=engine, version=version)
    bundle_ref = build_and_push(BUNDLE_NAME, files, "bundle.Dockerfile", "never")  # scratch
    catalog_ref = build_and_push(CATALOG_NAME, bundle.catalog(files, bundle_ref, catalog_base),
                                 "catalog.Dockerfile",
                                 "never" if catalog_base == "scratch" else "missing")
    return bundle_ref, catalog_ref


# --- the chart -----------------------------------------------------------------------------


def _set_line(text: str, pattern: str, value: str, what: str) -> str:
    new, n = re.subn(pattern, lambda m: m.group(1) + value, text, count=1, flags=re.M)
    if n != 1:
        raise SystemExit(f"chart: cannot set {what} (pattern {pattern!r} not found)")
    return new


def pin_chart(dest: Path, version: str, operator: str, engine: str) -> None:
    """Rewrite the copied chart in ``dest``: versions, the operator image by digest, the
    default engine image by digest (comments and every other value as they are)."""
    chart = dest / "Chart.yaml"
    text = chart.read_text()
    text = _set_line(text, r"^(version: ).*$", version, "version")
    text = _set_line(text, r"^(appVersion: ).*$", json.dumps(version), "appVersion")
    chart.write_text(text)
    repo, digest = operator.split("@", 1)
    values = dest / "values.yaml"
    text = values.read_text()
    # Only the first occurrences: image.* at the top of values.yaml, defaults.engineImage.
    text = _set_line(text, r"^(  repository: ).*$", repo, "image.repository")
    text = _set_line(text, r"^(  digest: ).*$", json.dumps(digest), "image.digest")
    text = _set_line(text, r"^(  engineImage: ).*$", json.dumps(engine), "defaults.engineImage")
    values.write_text(text)


def reproducible_tgz(path: Path, when: int) -> None:
    """Rewrite the chart archive ``path`` so that the same chart gives the same bytes: every
    entry dated ``when`` (the commit's time; helm package dates them now) and owned by 0:0, the
    entries in helm's order, a gzip header without a date; the file itself dated ``when``, which
    helm push takes as the OCI manifest's org.opencontainers.image.created (so the chart's
    digest holds too)."""
    with tarfile.open(path, "r:gz") as src:
        entries = [(m, src.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                   for m in src.getmembers()]  # fmt: skip
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in entries:
            member.mtime, member.uid, member.gid, member.uname, member.gname = when, 0, 0, "", ""
            member.pax_headers = {}
            tar.addfile(member, None if data is None else io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    os.utime(path, (when, when))  # helm push dates the manifest by the file's mtime


def package_and_push_chart(version: str, operator: str, engine: str, registry: str,
                           plain_http: bool, out: Path) -> tuple[str, str]:
    helm = helm_bin()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / CHART_NAME
        shutil.copytree(CHART_DIR, src)
        pin_chart(src, version, operator, engine)
        run([helm, "lint", str(src)])
        run([helm, "package", str(src), "-d", str(out)])
    tgz = out / f"{CHART_NAME}-{version}.tgz"
    reproducible_tgz(tgz, source_revision()[1])
    ref = f"oci://{registry}/charts"
    log(f"pushing {tgz.name} to {ref}")
    r = subprocess.run([helm, "push", str(tgz), ref, *(["--plain-http"] if plain_http else [])],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"helm push failed:\n{r.stderr.strip()}")
    m = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", r.stdout + r.stderr)
    if not m:
        raise SystemExit(f"helm push printed no digest:\n{r.stdout}{r.stderr}")
    return f"{ref}/{CHART_NAME}", m.group(1)


# --- commands ------------------------------------------------------------------------------


def check_version(version: str | None) -> str:
    have = project_version()
    if version not in (None, "", have):
        raise SystemExit(f"VERSION={version} but pyproject.toml says {have}: the version lives "
                         "in pyproject.toml (bump it there, add a CHANGELOG.md entry)")
    return have


def changelog_versions(text: str) -> list[str]:
    """The versions CHANGELOG.md has a section for (``## [x.y.z]`` headings, in order)."""
    return re.findall(r"^## \[([^\]\s]+)\]", text, flags=re.M)


def check_release_inputs(version: str, allow_dirty: bool, root: Path = ROOT) -> None:
    """What a release must have before anything is built: its CHANGELOG.md section, and (unless
    ``allow_dirty``) a working tree that is its commit. SystemExit with what to do."""
    changelog = root / "CHANGELOG.md"
    text = changelog.read_text() if changelog.is_file() else ""
    if version not in changelog_versions(text):
        raise SystemExit(f"CHANGELOG.md has no '## [{version}]' section: move the Unreleased "
                         "entries under it before releasing")
    if allow_dirty:
        return
    changes = tree_changes(root)
    if changes is None:
        raise SystemExit(f"{root} is not a git checkout: a release names the commit it was "
                         "built from (--allow-dirty releases it anyway)")
    if changes:
        listed = ", ".join(changes[:10]) + (f" and {len(changes) - 10} more"
                                            if len(changes) > 10 else "")  # fmt: skip
        raise SystemExit(f"the working tree has changes or untracked files ({listed}): commit "
                         "or remove them, so that the images are the commit they name "
                         "(--allow-dirty releases it anyway, labelled <commit>-dirty)")
    check_tag(version, root)


#: skopeo's words for a tag the registry does not have (the distribution spec's
#: MANIFEST_UNKNOWN and NAME_UNKNOWN; some registries answer a bare 404)
ABSENT = re.compile(r"manifest unknown|name unknown|not found|\b404\b", re.I)

#: ``skopeo inspect --raw docker://<ref>``: (exit status, stderr)
Inspect = Callable[[str], tuple[int, str]]


def release_refs(registry: str, version: str) -> list[str]:
    """Where a release of ``version`` lives in ``registry``: both images and the chart."""
    return [f"{registry}/{OPERATOR_NAME}:{version}", f"{registry}/{ENGINE_NAME}:{version}",
            f"{registry}/charts/{CHART_NAME}:{version}", f"{registry}/{BUNDLE_NAME}:{version}",
            f"{registry}/{CATALOG_NAME}:{version}"]


def skopeo_inspect(plain_http: bool) -> Inspect:
    skopeo = skopeo_bin()

    def inspect(ref: str) -> tuple[int, str]:
        r = subprocess.run([skopeo, "inspect", "--raw",
                            *(["--tls-verify=false"] if plain_http else []), f"docker://{ref}"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        return r.returncode, r.stderr

    return inspect


def check_unpublished(registry: str, version: str, inspect: Inspect) -> None:
    """A published version is never overwritten: sites pinned its digests, and a mirror of it
    would no longer be what was verified. SystemExit naming what is there already, or why the
    registry could not tell."""
    found = []
    for ref in release_refs(registry, version):
        code, err = inspect(ref)
        if code == 0:
            found.append(ref)
        elif not ABSENT.search(err):
            raise SystemExit(f"cannot tell whether {ref} is published already: "
                             f"{err.strip()[-500:] or f'skopeo exited {code}'}")
    if found:
        raise SystemExit(f"version {version} is published already ({', '.join(found)}): a "
                         "release is never overwritten. Bump the version in pyproject.toml and "
                         "Chart.yaml, with its CHANGELOG.md section (--replace overwrites it: "
                         "tests only)")


def release(registry: str, version: str | None, engine_base: str | None, plain_http: bool,
            out: Path, engine_image: str | None = None,
            archs: Sequence[str] = build.OPERATOR_PLATFORMS, allow_dirty: bool = False,
            replace: bool = False, catalog_base: str | None = None,
            engine_layers: dict[str, str] | None = None,
            engine_python: str = "python3", sign_key: Path | None = None) -> Release:
    version = check_version(version)
    check_release_inputs(version, allow_dirty)
    if sign_key is not None:
        signing.check_key(sign_key)  # before anything is built
    registry = registry.rstrip("/")
    if not replace:
        check_unpublished(registry, version, skopeo_inspect(plain_http))
    out.mkdir(parents=True, exist_ok=True)
    build.require_tools()
    operator, platforms = push_operator(registry, version, plain_http, archs)
    engine_platforms: list[str] = []
    if engine_layers:
        engine, engine_platforms = push_engine_index(engine_layers, engine_python, registry,
                                                     version, plain_http)
    else:
        engine = push_engine(build_engine(engine_base, engine_image), registry, version,
                             plain_http)
    chart, chart_digest = package_and_push_chart(version, operator, engine, registry,
                                                 plain_http, out)
    bundle, catalog = push_olm(version, operator, engine, registry, plain_http, out,
                               catalog_base or _bundle_script().CATALOG_BASE)
    sboms: dict[str, str] = {}
    if sign_key is not None:
        log(f"signing the release with {sign_key}: the images, their SBOMs, the chart")
        sboms = signing.sign_release(
            {OPERATOR_NAME: operator, ENGINE_NAME: engine, BUNDLE_NAME: bundle,
             CATALOG_NAME: catalog},
            {name: signing.platform_images(ref, raw_manifest(ref, plain_http))
             for name, ref in ((OPERATOR_NAME, operator), (ENGINE_NAME, engine))},
            f"{chart.removeprefix('oci://')}@{chart_digest}", sign_key, plain_http, out)
    if not allow_dirty:  # a dirty tree's release names no commit to tag
        log(f"tagged {tag_release(version)}: push it with `git push origin "
            f"{tag_name(version)}`")
    return Release(version, registry, operator, platforms, engine, chart,
                   chart_digest, bundle, catalog, engine_platforms, sboms).write(out)


def raw_manifest(ref: str, plain_http: bool) -> str:
    """The manifest (or index) JSON of ``ref`` in its registry."""
    return run([skopeo_bin(), "inspect", "--raw", *tls_flag(plain_http), f"docker://{ref}"],
               capture=True)


def skopeo_bin() -> str:
    found = shutil.which("skopeo")
    if not found:
        run([str(ROOT / "tests" / "cluster" / "apt-install.sh"), "skopeo"])
        found = shutil.which("skopeo")
    if not found:
        raise SystemExit("skopeo not found (Debian: apt-get install skopeo)")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("release", help="build, push, pin digests, push the chart")
    r.add_argument("--registry", required=True, help="host[:port]/path, e.g. quay.io/acme")
    eng = r.add_mutually_exclusive_group()
    eng.add_argument("--engine-base", default=PRODUCTION_ENGINE_BASE,
                     help="build engine/Containerfile on this base (default: %(default)s)")
    eng.add_argument("--cpu-engine", action="store_true",
                     help="release the CPU engine image of tests/images (no cards: tests, demo)")

    r.add_argument("--allow-dirty", action="store_true",
                   help="release a working tree with changes or untracked files (tests); "
                        "the images' revision label says <commit>-dirty")
    r.add_argument("--replace", action="store_true",
                   help="overwrite a version the registry has already (tests): a published "
                        "release is otherwise refused before anything is built")
    r.add_argument("--platforms", default=",".join(build.OPERATOR_PLATFORMS),
                   help="the operator image's architectures (default: %(default)s)")
    eng.add_argument("--engine-layer", action="append", default=None, metavar="ARCH=BASE",
                     help="an engine index: engine/Containerfile.layer on each architecture's "
                          "vLLM-Spyre base (repeat per architecture: amd64, s390x, ppc64le; "
                          "foreign ones under qemu-user-static)")
    r.add_argument("--sign-key", type=Path, default=None,
                   help="sign the images and the chart with this cosign private key and attach "
                        "each image's SBOM as a signed attestation (its password in "
                        "COSIGN_PASSWORD)")
    r.add_argument("--engine-python", default="python3",
                   help="with --engine-layer: the bases' interpreter that imports vllm "
                        "(Containerfile.layer's PYTHON; default: %(default)s)")
    eng.add_argument("--engine-image", default=None,
                   help="release this engine image as it is (buildah storage name or "
                        "docker-archive:<path>) instead of building one")  # fmt: skip
    r.add_argument("--source", default=None,
                   help="the source repository the images name (org.opencontainers.image."
                        "source; default: git's origin as an https URL, left out if none)")
    r.add_argument("--catalog-base", default=None,
                   help="the catalog image's base: opm, which serves it to OLM (default: "
                        "bundle.py's CATALOG_BASE); scratch: the catalog's files only (tests)")
    m = sub.add_parser("mirror", help="copy a release into another registry")
    m.add_argument("--from", dest="src", required=True, help="the release's registry/path")
    m.add_argument("--to", dest="dest", required=True, help="the site's registry/path")
    for p in (r, m):
        p.add_argument("--version", default=None, help="default: pyproject.toml's version")
        p.add_argument("--plain-http", action="store_true", help="HTTP, not HTTPS")
        p.add_argument("--out", type=Path, default=ROOT / "dist",
                       help="where the chart package and release-<version>.json go")
    args = ap.parse_args(argv)
    if args.command == "release":
        if args.source:
            os.environ[SOURCE_ENV] = args.source
            source_url()  # refused before anything is built
        archs = [a.strip().removeprefix("linux/") for a in args.platforms.split(",") if a.strip()]
        base = None if args.cpu_engine else args.engine_base
        layers = parse_engine_layers(args.engine_layer) if args.engine_layer else None
        rel = release(args.registry, args.version, base, args.plain_http, args.out,
                      args.engine_image, archs, args.allow_dirty, args.replace,
                      args.catalog_base, layers, args.engine_python, args.sign_key)
    else:
        import mirror  # beside this file; it imports this module

        rel = mirror.mirror(args.src, args.dest, args.version, args.plain_http, args.out)
    print(json.dumps(asdict(rel), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
