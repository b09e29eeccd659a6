"""operator/scripts/release_signing.py without a registry: what gets an SBOM (each platform's
image of an index, else the image itself) and what signing needs before a release builds
anything. Signing, attesting, copying and verifying for real: tests/integration/test_chart_pod.py
(the session's release, signed, mirrored and verified with cosign)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import script

R = script("release")

S = R.signing
DIGEST = "sha256:" + "a" * 64


def test_an_index_gets_an_sbom_per_platform_and_an_image_one() -> None:
    index = {"schemaVersion": 2, "manifests": [
        {"digest": "sha256:" + c * 64, "platform": {"os": "linux", "architecture": a}}
        for c, a in (("1", "amd64"), ("2", "s390x"))]}  # fmt: skip
    assert S.platform_images(f"reg/op@{DIGEST}", json.dumps(index)) == [
        "reg/op@sha256:" + "1" * 64, "reg/op@sha256:" + "2" * 64]
    image = {"schemaVersion": 2, "config": {"digest": DIGEST}, "layers": []}
    assert S.platform_images(f"reg/eng@{DIGEST}", json.dumps(image)) == [f"reg/eng@{DIGEST}"]


def test_signing_without_the_keys_password_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "cosign.key"
    key.write_text("not read here")
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    with pytest.raises(SystemExit, match="COSIGN_PASSWORD"):
        S.check_key(key)
    monkeypatch.setenv("COSIGN_PASSWORD", "")  # a key without a password
    S.check_key(key)
    with pytest.raises(SystemExit, match="no signing key at"):
        S.check_key(tmp_path / "missing.key")


def test_a_release_with_a_key_checks_it_first(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """release() stops at the key, before the version, build or push steps run."""
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    monkeypatch.setattr(R, "check_release_inputs", lambda *a, **k: None)
    monkeypatch.setattr(R, "check_version", lambda v: "1.2.3")
    monkeypatch.setattr(R, "push_operator", lambda *a, **k: pytest.fail("built before the key"))
    with pytest.raises(SystemExit, match="COSIGN_PASSWORD"):
        R.release("reg", None, None, True, tmp_path, sign_key=tmp_path / "k.key")
