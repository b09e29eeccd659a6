"""A release's signatures and SBOMs (issue 48), for release.py: cosign and syft, used offline
with a key pair the site gives (no Rekor transparency log, no Fulcio, no TUF: the key is the
trust; keyless signing needs an internet the tests do not have).

- :func:`sign_release`: each image signed by digest (an index with every platform's image,
  ``--recursive``), an SPDX SBOM (syft) per image and platform written beside the release record
  and attached to that image as a signed in-toto attestation (``cosign attest --type
  spdxjson``), and the chart's OCI artifact signed. Signatures and attestations are stored the
  way cosign stores them in any registry: as tags ``sha256-<digest>.sig`` / ``.att`` beside the
  image (CNCF distribution, like many registries, has no OCI 1.1 referrers API).
- :meth:`Cosign.copy`: ``make mirror`` copies them with the images (``cosign copy --only``).
- :meth:`Cosign.verify`: what a site runs, ``cosign verify`` / ``verify-attestation`` with
  the public key (docs/security.md, "Verify what you pull", shows the commands).

The password of the private key comes from ``COSIGN_PASSWORD`` (empty for a key without one).
cosign and syft come from PATH, else ``tests/cluster/supplychain-deps.sh`` builds them from
their Go modules (``make deps`` does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A trusted root with nothing in it: verification then trusts the key alone and never asks
#: Sigstore's TUF repository (a verify without it tries the internet first).
OFFLINE_TRUSTED_ROOT = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}
#: The SBOM format, as syft writes it and cosign's attestation type names it.
SBOM_TYPE = "spdxjson"


class SigningError(SystemExit):
    """A signing or verification step failed; the message says which and why."""


def tools() -> tuple[str, str]:
    """(cosign, syft): on PATH, else built by tests/cluster/supplychain-deps.sh."""
    cosign, syft = shutil.which("cosign"), shutil.which("syft")
    if cosign and syft:
        return cosign, syft
    r = subprocess.run([str(ROOT / "tests" / "cluster" / "supplychain-deps.sh")],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SigningError(f"cannot build cosign and syft: {r.stderr.strip()[-1500:]}")
    d = Path(r.stdout.strip().splitlines()[-1])
    return str(d / "cosign"), str(d / "syft")


class Cosign:
    """cosign and syft with the environment of an offline run (a TUF root of its own, no
    update check) and the registry flags for ``plain_http``."""

    def __init__(self, plain_http: bool, password: str | None = None) -> None:
        self.cosign, self.syft = tools()
        self._tmp = tempfile.TemporaryDirectory(prefix="spyre-cosign-")
        tmp = Path(self._tmp.name)
        self.trusted_root = tmp / "trusted-root.json"
        self.trusted_root.write_text(json.dumps(OFFLINE_TRUSTED_ROOT))
        self.env = {**os.environ, "TUF_ROOT": str(tmp / "tuf"),
                    "SYFT_CHECK_FOR_APP_UPDATE": "false"}  # fmt: skip
        if password is not None:
            self.env["COSIGN_PASSWORD"] = password
        if plain_http:
            self.env["SYFT_REGISTRY_INSECURE_USE_HTTP"] = "true"
        self.http = ["--allow-http-registry", "--allow-insecure-registry"] if plain_http else []

    def close(self) -> None:
        self._tmp.cleanup()

    def run(self, what: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                           stdin=subprocess.DEVNULL)  # fmt: skip
        if r.returncode != 0:
            raise SigningError(f"{what} failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
        return r

    def sign(self, ref: str, key: Path) -> None:
        self.run(f"signing {ref}", [self.cosign, "sign", "--key", str(key), "--tlog-upload=false",
                                    "--recursive", *self.http, ref])  # fmt: skip

    def sbom(self, ref: str, dest: Path) -> Path:
        self.run(f"the SBOM of {ref}", [self.syft, "scan", "-q", f"registry:{ref}",
                                        "-o", f"spdx-json={dest}"])  # fmt: skip
        return dest

    def attest(self, ref: str, key: Path, sbom: Path) -> None:
        self.run(f"attesting the SBOM of {ref}", [
            self.cosign, "attest", "--key", str(key), "--type", SBOM_TYPE, "--predicate",
            str(sbom), "--tlog-upload=false", "--replace", *self.http, ref])  # fmt: skip

    def verify(self, ref: str, pub: Path, attestation: bool = False) -> str:
        """``cosign verify`` (or ``verify-attestation --type spdxjson``) of ``ref`` with the
        public key ``pub``: its JSON output; SigningError with cosign's reason otherwise."""
        cmd = ["verify-attestation", "--type", SBOM_TYPE] if attestation else ["verify"]
        return self.run(f"verifying {ref}", [
            self.cosign, *cmd, "--key", str(pub), "--insecure-ignore-tlog=true",
            "--trusted-root", str(self.trusted_root), *self.http, ref]).stdout  # fmt: skip

    def copy(self, src: str, dest: str) -> None:
        """The signatures and attestations of ``src`` (repository@digest) to ``dest`` (a
        repository that has the image already), for an index those of every platform too."""
        self.run(f"copying the signatures of {src}", [
            self.cosign, "copy", "--only=sig,att", "--force", *self.http, src, dest])


def platform_images(ref: str, raw_manifest: str) -> list[str]:
    """``ref`` (repository@digest) and, for an image index, each entry's repository@digest:
    what gets an SBOM (one per platform's image)."""
    repo = ref.split("@", 1)[0]
    manifests = json.loads(raw_manifest).get("manifests")
    if not manifests:
        return [ref]
    return [f"{repo}@{m['digest']}" for m in manifests]


def check_key(key: Path) -> None:
    """What signing needs, checked before a release builds anything."""
    if os.environ.get("COSIGN_PASSWORD") is None:
        raise SigningError("signing needs COSIGN_PASSWORD, the private key's password (empty "
                           "for a key without one): cosign would ask for it on a terminal")
    if not key.is_file():
        raise SigningError(f"no signing key at {key} (cosign generate-key-pair makes one)")


def sign_release(images: Mapping[str, str], sbom_images: Mapping[str, Sequence[str]],
                 chart: str, key: Path, plain_http: bool, out: Path) -> dict[str, str]:
    """Sign ``images`` ({name: repository@digest}) and the chart's OCI artifact ``chart``;
    write an SBOM for each of ``sbom_images`` ({name: [repository@digest per platform]}) to
    ``out`` and attach it as a signed attestation. Returns {image: its SBOM file's name}."""
    check_key(key)
    c = Cosign(plain_http, os.environ["COSIGN_PASSWORD"])
    sboms: dict[str, str] = {}
    try:
        for name, refs in sbom_images.items():
            for ref in refs:
                dest = out / f"sbom-{name}-{ref.rsplit(':', 1)[1][:12]}.spdx.json"
                c.attest(ref, key, c.sbom(ref, dest))
                sboms[ref] = dest.name
        for ref in [*images.values(), chart]:
            c.sign(ref, key)
    finally:
        c.close()
    return sboms
