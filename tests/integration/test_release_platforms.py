"""The operator image of a release runs on every platform Spyre does (x86, Power, Z) and arm64.

``make release`` pushes the operator as one manifest list for amd64, arm64, ppc64le and s390x
(operator/scripts/release.py). This module publishes such a release to the cluster's OCI
registry and starts each entry, pulled by platform, against the cluster (the foreign ones under
qemu-user-static): each answers /healthz.

The other architectures' images are built under emulation: ~12 min each on a cold machine (a
debootstrap second stage, the dependencies; ppc64le and s390x compile PyYAML and msgspec, for
which PyPI has no wheel there). That is not in ``make test`` (issue 43: CI's budget); what
``make test``'s release tests publish is the host's image only, the one the node runs. This
module runs under ``make test-platforms`` (``SPYRE_RELEASE_PLATFORMS=1``), once per change of
what decides the outcome (tests/images/build.py ``platforms_key``: the operator's Containerfile,
pyproject.toml's dependencies, release.py, the image recipe, every platform's base): a pass
leaves a record under ``~/.cache/spyre-model-operator/proofs/``, and a later run with the same
key says so and skips (``SPYRE_RELEASE_PLATFORMS=force`` runs it anyway). .ci/README.md says
when it runs.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.images import build
from tests.realpods import support as s

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.platforms,
              # cold: three operator images under qemu (~12 min each), then three starts
              pytest.mark.timeout(5400)]

#: ``make test-platforms`` sets it: "1" (once per key) or "force" (again).
ENV = "SPYRE_RELEASE_PLATFORMS"
ALL = [f"linux/{a}" for a in build.OPERATOR_PLATFORMS]


def proof() -> Path:
    """The record a pass leaves for today's inputs."""
    return build.proofs_dir() / f"release-platforms-{build.platforms_key()}.json"


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """A release with the operator for every platform, in the cluster's registry."""
    mode = os.environ.get(ENV, "")
    if mode not in ("1", "force"):
        pytest.skip(f"the four-architecture release: `make test-platforms` ({ENV}=1), not "
                    "make test (qemu builds, .ci/README.md)")
    if mode == "1" and proof().exists():
        pytest.skip(f"proven for these inputs: {proof()} ({ENV}=force to run it again)")
    return s.publish_release(control_plane, tmp_path_factory.mktemp("release"), platforms=ALL)


def _start_operator_image(cp: ControlPlane, image: str, platform: str, namespace: str,
                          work: Path) -> tuple[str, float]:
    """Pull ``platform``'s entry of the released operator image from the registry with buildah
    and start it (under qemu-user-static unless it is the host's), watching ``namespace`` with
    the admin kubeconfig; returns its /healthz answer and the seconds it took to give it."""
    from tests.images import build

    bh = build.buildah_cmd()
    ctr = subprocess.run([*bh, "from", "--quiet", "--platform", platform, "--tls-verify=false",
                          f"docker://{image}"], capture_output=True, text=True, check=True
                         ).stdout.strip().splitlines()[-1]  # fmt: skip
    try:
        arch = subprocess.run([*bh, "inspect", "--format", "{{.OCIv1.Architecture}}", ctr],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert f"linux/{arch}" == platform, (arch, platform)
        # The image's user (65532) reads it: a copy, readable (the original is root's 0600).
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_bytes(cp.kubeconfig.read_bytes())
        kubeconfig.chmod(0o644)
        health, metrics = free_ports(2)
        log = open(work / f"operator-{arch}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*bh, "run", "--isolation", "chroot", "--volume",
             f"{kubeconfig}:/tmp/kubeconfig:ro", "--env", "KUBECONFIG=/tmp/kubeconfig", ctr,
             "--", "spyre-operator", "run", f"--namespace={namespace}", "--no-leader-elect",
             "--no-scale-to-zero", "--pod-user=fixed", f"--metrics-port={metrics}",
             f"--liveness=http://127.0.0.1:{health}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        log.close()
        t0 = time.monotonic()
        try:
            def healthy() -> str | None:
                assert proc.poll() is None, (
                    f"the {platform} operator exited {proc.returncode}:\n"
                    + (work / f"operator-{arch}.log").read_text()[-3000:])
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz",
                                            timeout=5) as r:
                    return r.read().decode() if r.status == 200 else None

            body = wait_until(healthy, 300, f"the {platform} operator's /healthz", 1)
            return body, time.monotonic() - t0
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        subprocess.run([*bh, "rm", ctr], capture_output=True)


def test_every_platform_of_the_released_operator_image_starts(
    control_plane: ControlPlane, release: dict[str, Any], namespace: str,
    tmp_path: Path,
) -> None:
    """The operator image is one manifest list for amd64, arm64, ppc64le and s390x (Spyre runs
    on x86, Power and Z): each entry, pulled from the registry by platform, starts and answers
    /healthz against the cluster (the foreign ones under qemu-user-static)."""
    assert sorted(release["operator_platforms"]) == [
        "linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"], release
    s.ensure_namespace(control_plane, namespace)
    for platform in release["operator_platforms"]:
        body, took = _start_operator_image(control_plane, release["operator"], platform,
                                           namespace, tmp_path)
        print(f"{platform}: /healthz after {took:.1f}s: {body[:80]!r}")
    proof().parent.mkdir(parents=True, exist_ok=True)
    proof().write_text(json.dumps({
        "key": build.platforms_key(), "inputs": list(build.PLATFORM_INPUTS),
        "operator": release["operator"], "platforms": release["operator_platforms"],
        "passed": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }, indent=1) + "\n")
