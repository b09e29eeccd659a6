"""``make release --engine-layer ARCH=BASE ...`` (issue 46, 1): the engine as one index,
spyre-engine layered onto each architecture's own vLLM-Spyre base. Checked here without
building: the arguments (a platform Spyre runs on, once each, a base each) and what each layer
build and the index push are asked to do, and what a release (or its mirror) records of the
index. The builds themselves (stand-in bases per architecture, the foreign ones under
qemu-user-static) run in tests/integration/test_engine_index.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.scripts import script

R = script("release")


def test_each_architecture_spyre_runs_on_takes_its_own_base() -> None:
    got = R.parse_engine_layers(["amd64=reg/vllm-spyre:x86", "linux/s390x=reg/vllm-spyre:z",
                                 "ppc64le= reg/vllm-spyre:p "])  # fmt: skip
    assert got == {"amd64": "reg/vllm-spyre:x86", "s390x": "reg/vllm-spyre:z",
                   "ppc64le": "reg/vllm-spyre:p"}  # fmt: skip


@pytest.mark.parametrize(("specs", "says"), [
    (["arm64=reg/x"], "not a platform Spyre runs on"),
    (["s390x"], "expected ARCH=BASE"),
    (["s390x="], "expected ARCH=BASE"),
    (["s390x=reg/a", "s390x=reg/b"], "s390x given twice"),
])  # fmt: skip
def test_a_wrong_layer_is_refused_naming_it(specs: list[str], says: str) -> None:
    with pytest.raises(SystemExit, match=says):
        R.parse_engine_layers(specs)


def test_each_layer_is_built_for_its_architecture_and_pushed_as_one_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []
    emulated: list[str] = []
    pushed: dict[str, Any] = {}
    monkeypatch.setattr(R, "run", lambda argv, **kw: ran.append(list(argv)) or "")
    monkeypatch.setattr(R.build, "ensure_binfmt", emulated.append)
    monkeypatch.setattr(R, "labelled", lambda local, name, version: f"{local}+{version}")

    def push_index(name: str, locals_: list[str], *rest: Any) -> tuple[str, list[str]]:
        pushed.update(name=name, locals=locals_)
        return "reg/spyre-engine@sha256:" + "0" * 64, [f"linux/{a}" for a in ("amd64", "s390x")]

    monkeypatch.setattr(R, "push_index", push_index)
    ref, platforms = R.push_engine_index({"amd64": "reg/b:x86", "s390x": "reg/b:z"},
                                         "/opt/vllm/bin/python", "reg", "1.2.0", True)  # fmt: skip
    assert ref.startswith("reg/spyre-engine@sha256:") and platforms == ["linux/amd64",
                                                                        "linux/s390x"]
    assert pushed["name"] == "spyre-engine"
    assert pushed["locals"] == ["localhost/spyre-engine-layer-amd64:release+1.2.0",
                                "localhost/spyre-engine-layer-s390x:release+1.2.0"]
    builds = [a for a in ran if "build" in a]
    assert len(builds) == 2
    for argv, arch, base in zip(builds, ("amd64", "s390x"), ("reg/b:x86", "reg/b:z"),
                                strict=True):
        assert argv[argv.index("--arch") + 1] == arch
        assert f"BASE={base}" in argv and "PYTHON=/opt/vllm/bin/python" in argv
        assert argv[argv.index("-f") + 1].endswith("engine/Containerfile.layer")
    # the foreign architecture under qemu-user-static, the host's natively
    assert emulated == [a for a in ("amd64", "s390x") if a != R.build.HOST_ARCH]


def test_the_cli_hands_the_layers_to_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def release(*args: Any) -> Any:
        seen["layers"], seen["python"], seen["key"] = args[-3], args[-2], args[-1]
        return R.Release("1.2.0", "reg", "op@x", [], "eng@y", "oci://c", "sha256:z")

    monkeypatch.setattr(R, "release", release)
    R.main(["release", "--registry", "reg", "--engine-layer", "amd64=reg/b:x86",
            "--engine-layer", "ppc64le=reg/b:p", "--engine-python", "/opt/vllm/bin/python"])
    assert seen == {"layers": {"amd64": "reg/b:x86", "ppc64le": "reg/b:p"},
                    "python": "/opt/vllm/bin/python", "key": None}


def test_a_release_records_an_index_platforms_and_a_single_image_none() -> None:
    """Release.engine_platforms (release and mirror alike, from the registry's manifest):
    each entry's os/architecture for an index, [] for a single image."""
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"digest": "sha256:" + "a" * 64, "platform": {
                 "os": "linux", "architecture": a}} for a in ("amd64", "s390x", "ppc64le")]}
    assert R.index_platforms(json.dumps(index)) == ["linux/amd64", "linux/s390x",
                                                    "linux/ppc64le"]  # fmt: skip
    single = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
              "config": {"digest": "sha256:" + "b" * 64}, "layers": []}
    assert R.index_platforms(json.dumps(single)) == []
