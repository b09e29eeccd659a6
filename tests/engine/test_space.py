"""A precompile that would not fit on the cache claim stops before compiling (issue 47, 3).

The estimate is the newest complete artifact of the same backend and shape on the claim (its
manifest's ``totalBytes``); here a real eager artifact's manifest is made to state more than
any disk has, and the next precompile of that shape, under another key, refuses with
``InsufficientCacheSpace`` on the real filesystem's free space, writing nothing. Other shapes,
incomplete or malformed artifacts are no estimate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from spyre_engine import catalog, manifest, space
from spyre_engine.summary import FailureSummary, parse_termination_message

from .conftest import SHAPE, precompile_eager, run_engine

pytestmark = pytest.mark.engine

HUGE = 1 << 60  # 1 EiB: no test machine has it free


def _state_size(artifact: Path, total: object) -> None:
    path = manifest.manifest_path(artifact)
    doc = json.loads(path.read_text())
    doc["totalBytes"] = total
    path.write_text(json.dumps(doc))


def test_a_precompile_that_would_not_fit_stops_before_compiling(
    tiny_model: Path, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    first = root / "key-a"
    precompile_eager(tiny_model, first)  # nothing of its shape before it: not refused
    [entry] = catalog.read_catalog(first)
    assert space.estimate(first, "eager", entry["data"]) is None
    _state_size(first, HUGE)
    est = space.estimate(root / "key-b", "eager", entry["data"])
    assert est == space.Estimate("key-a", HUGE)

    second = root / "key-b"
    term = tmp_path / "b.termlog"
    proc = run_engine("precompile", "--model", str(tiny_model), "--artifact-dir", str(second),
                      "--backend", "eager", "--reference-answers", "off",
                      "--termination-log", str(term), *SHAPE)  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-3000:]
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary), term.read_text()
    assert failure.reason == "InsufficientCacheSpace", failure
    free = space.free_bytes(second)
    assert free is not None and free < HUGE
    for words in ("(key-a) took 1048576.0 TiB", "free", "cache.volume.retention",
                  "serving.spyre.dev/retry-compile"):  # fmt: skip
        assert words in failure.message, failure.message
    # nothing compiled or recorded under the new key
    assert catalog.read_catalog(second) == []
    assert not manifest.manifest_path(second).exists()


def test_only_a_complete_artifact_of_the_same_backend_and_shape_is_an_estimate(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Files on a claim are anyone's: a malformed or incomplete sibling is no estimate, and
    another shape or backend is none either; the newest of several is."""
    root = tmp_path / "artifacts"
    first = root / "k1"
    precompile_eager(tiny_model, first)
    [entry] = catalog.read_catalog(first)
    data, target = entry["data"], root / "new"
    other_shape = {**data, "VLLM_DT_MAX_BATCH_SIZE": data["VLLM_DT_MAX_BATCH_SIZE"] + 1}
    assert space.estimate(target, "eager", other_shape) is None
    assert space.estimate(target, "inductor", data) is None
    size = json.loads(manifest.manifest_path(first).read_text())["totalBytes"]
    assert space.estimate(target, "eager", data) == space.Estimate("k1", size)

    for bad in ("1e30", -5, 2.5, None, [1], True):
        _state_size(first, bad)
        assert space.estimate(target, "eager", data) is None, bad
    manifest.manifest_path(first).write_text("{not json")
    assert space.estimate(target, "eager", data) is None
    manifest.manifest_path(first).unlink()  # incomplete: no manifest
    assert space.estimate(target, "eager", data) is None

    # two complete ones of the shape: the newest manifest wins; a corrupt catalog is skipped
    for name, total, mtime in (("old", 10, 1_000), ("newer", 20, 2_000), ("broken", 99, 3_000)):
        d = root / name
        d.mkdir()
        if name == "broken":
            catalog.catalog_path(d).write_text("[{")
        else:
            catalog.catalog_path(d).write_text(json.dumps([entry]))
        manifest.manifest_path(d).write_text(json.dumps({"totalBytes": total}))
        os.utime(manifest.manifest_path(d), (mtime, mtime))
    assert space.estimate(target, "eager", data) == space.Estimate("newer", 20)


@pytest.mark.parametrize(("needed", "already", "free", "missing"), [
    (100, 0, 100, None), (100, 0, 99, 1), (100, 40, 60, None), (100, 40, 50, 10),
    (100, 0, None, None),
])  # fmt: skip
def test_shortfall(needed: int, already: int, free: int | None, missing: int | None) -> None:
    """A recompile of the same key overwrites what its dir holds: that counts as free."""
    assert space.shortfall(needed, already, free) == missing


def test_sizes_read_the_same_in_the_engines_messages_and_the_operators() -> None:
    """``space.human`` (the engine's InsufficientCacheSpace message) twins the operator's
    ``decide.observed.human_size`` (its status and Events): two images, one wording."""
    from spyre_operator.decide.observed import human_size

    for n in (0, 1, 1023, 1024, 1536, 10**6, 5 * 2**30, 3 * 2**40, 2**60):
        assert space.human(n) == human_size(n), n
