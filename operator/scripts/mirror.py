"""``make mirror`` (``release.py mirror``): copy a release into a site's registry.

Both images registry to registry with ``skopeo copy --all --preserve-digests`` (the index with
every platform, the engine's compressed layers as they are), the OLM bundle and catalog as they
are, their cosign signatures and attestations (``cosign copy --only=sig,att``), and the chart
re-pinned to the mirror's repositories (the same digests) and pushed to ``oci://<to>/charts``.
What to copy is read from the release's chart (:func:`pinned_images`): a chart from another
registry is input, parsed and checked, never trusted. Shares release.py's helpers.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import release as R

_REPOSITORY = re.compile(r"[a-z0-9]+(?:[._:/-]+[a-z0-9]+)*")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def pinned_images(values_text: str, src: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The (repository, digest) of the operator image (``image.repository``, ``image.digest``)
    and of the default engine image (``defaults.engineImage``, ``<repository>@sha256:...``)
    that a released chart's values.yaml pins: parsed as YAML, each value checked; SystemExit
    naming what is missing or malformed (a chart from ``src``, a registry: not trusted)."""
    import yaml

    try:
        values = yaml.safe_load(values_text)
    except yaml.YAMLError as e:
        raise SystemExit(f"the chart in {src}: values.yaml does not parse: {e}") from None

    def field(*path: str) -> str:
        node: Any = values
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, str) or not node:
            raise SystemExit(f"the chart in {src} pins no image digests: {'.'.join(path)} "
                             f"is {node!r}")  # fmt: skip
        return node

    repo, digest = field("image", "repository"), field("image", "digest")
    engine = field("defaults", "engineImage")
    eng_repo, _, eng_digest = engine.partition("@")
    for what, r, d in (("image", repo, digest), ("defaults.engineImage", eng_repo, eng_digest)):
        if not (_REPOSITORY.fullmatch(r) and _DIGEST.fullmatch(d)):
            raise SystemExit(f"the chart in {src} pins {what} as {r}@{d}: not a repository "
                             "and a sha256 digest")
    return (repo, digest), (eng_repo, eng_digest)


def mirror(src: str, dest: str, version: str | None, plain_http: bool, out: Path) -> R.Release:
    """Copy a release from ``src`` to ``dest`` (both ``host[:port]/path``): both images
    registry to registry with ``skopeo copy --all --preserve-digests`` (every platform, the
    same digests), the chart re-pinned to the mirror's repositories and pushed there."""
    version = R.check_version(version)
    src, dest = src.rstrip("/"), dest.rstrip("/")
    out.mkdir(parents=True, exist_ok=True)
    helm, skopeo = R.helm_bin(), R.skopeo_bin()
    hflags = ["--plain-http"] if plain_http else []
    tls = ["--src-tls-verify=false", "--dest-tls-verify=false"] if plain_http else []
    with tempfile.TemporaryDirectory() as tmp:
        # The chart names the exact images of the release.
        R.run([helm, "pull", f"oci://{src}/charts/{R.CHART_NAME}", "--version", version,
             "--untar", "-d", tmp, *hflags])  # fmt: skip
        values = (Path(tmp) / R.CHART_NAME / "values.yaml").read_text()
    (op_repo, op_digest), (eng_repo, eng_digest) = pinned_images(values, src)
    copies = [(f"{op_repo}@{op_digest}", R.OPERATOR_NAME, op_digest),
              (f"{eng_repo}@{eng_digest}", R.ENGINE_NAME, eng_digest)]
    for image, name, _ in copies:
        R.log(f"copying {image} -> {dest}/{name}:{version}")
        R.run([skopeo, "copy", "--all", "--preserve-digests", "--quiet", *tls,
             f"docker://{image}", f"docker://{dest}/{name}:{version}"])  # fmt: skip
    operator, engine = (f"{dest}/{name}@{digest}" for _, name, digest in copies)
    chart, chart_digest = R.package_and_push_chart(version, operator, engine, dest, plain_http, out)
    verify = ["--tls-verify=false"] if plain_http else []
    platforms, engine_platforms = (
        R.index_platforms(R.run([skopeo, "inspect", "--raw", *verify, f"docker://{ref}"],
                            capture=True))
        for ref in (operator, engine))  # fmt: skip
    # The bundle and its catalog as they are (the catalog names the bundle in src by digest:
    # a site maps src to dest with an ImageDigestMirrorSet, docs/openshift.md).
    olm = []
    for name in (R.BUNDLE_NAME, R.CATALOG_NAME):
        code, err = R.skopeo_inspect(plain_http)(f"{src}/{name}:{version}")
        if code != 0:
            if not R.ABSENT.search(err):
                raise SystemExit(f"cannot read {src}/{name}:{version}: {err.strip()[-500:]}")
            R.log(f"{src} has no {name}:{version} (a release before the bundle): not copied")
            olm.append("")
            continue
        R.log(f"copying {src}/{name}:{version} -> {dest}/{name}:{version}")
        R.run([skopeo, "copy", "--all", "--preserve-digests", "--quiet", *tls,
             f"docker://{src}/{name}:{version}", f"docker://{dest}/{name}:{version}"])  # fmt: skip
        digest = R.run([skopeo, "inspect", "--format", "{{.Digest}}", *verify,
                      f"docker://{dest}/{name}:{version}"], capture=True).strip()
        olm.append(f"{dest}/{name}@{digest}")
    # Signatures and SBOM attestations follow the images, by digest (none: nothing copied).
    cosign = R.signing.Cosign(plain_http)
    try:
        for image, name, _ in copies:
            cosign.copy(image, f"{dest}/{name}")
        for name, ref in zip((R.BUNDLE_NAME, R.CATALOG_NAME), olm, strict=True):
            if ref:
                cosign.copy(f"{src}/{name}@{ref.partition('@')[2]}", f"{dest}/{name}")
    finally:
        cosign.close()
    bundle, catalog = olm
    return R.Release(version, dest, operator, platforms, engine, chart, chart_digest, bundle,
                   catalog, engine_platforms).write(out)
