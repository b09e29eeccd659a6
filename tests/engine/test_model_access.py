"""hf:// models: a refused download says why (ModelAccessDenied vs ModelNotFound), a failed one
names its cause and the setting that fixes it (ModelDownloadFailed), and the summary records the
commit an ``@main``-style revision resolved to.

The local hub (:mod:`tests.engine.hub`, on 127.0.0.1, ``HF_ENDPOINT``) answers as huggingface.co
does for gated, private and missing repos, by the ``Authorization`` header; nothing leaves the
machine. Pure (no vLLM): part of ``make test-unit``.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from spyre_engine.launch import _download_error
from spyre_engine.summary import FailureSummary, PrecompileSummary, parse_termination_message

from tests.engine.hub import LocalHub, Repo

#: The tiny model's stand-in files: the download must fetch them, not only ask about them.
FILES = {"config.json": b'{"model_type": "granite"}', "tokenizer.json": b"{}"}
#: A user who may read the gated and private repos, and one who may not (both valid tokens).
READER, OUTSIDER = "hf_reader", "hf_outsider"


@pytest.fixture(scope="module")
def hub() -> Iterator[LocalHub]:
    with LocalHub() as hub:
        hub.tokens |= {READER, OUTSIDER}
        hub.repos["org/gated"] = Repo(files=dict(FILES), gated=True, readers={READER})
        hub.repos["org/private"] = Repo(files=dict(FILES), private=True, readers={READER})
        yield hub


def _with_status(exc: Exception, status: int) -> Exception:
    """``exc`` with a ``response.status_code``, as huggingface_hub's HTTP errors carry."""
    exc.response = type("Response", (), {"status_code": status})()  # type: ignore[attr-defined]
    return exc


def _env(hub: LocalHub, token: str | None) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, **({"HF_TOKEN": token} if token else {})}


def _precompile(model: str, tmp_path: Path, env: dict[str, str]) -> tuple[int, object]:
    term = tmp_path / "term"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", model]
        + ["--artifact-dir", str(tmp_path / "art"), "--backend", "eager"]
        + ["--hf-cache-dir", str(tmp_path / "hf"), "--termination-log", str(term)]
        # the model resolution is under test: its stand-in files (a config, no tokenizer) are
        # no model vLLM could start for reference answers
        + ["--reference-answers", "off"],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        check=False,
    )
    return proc.returncode, parse_termination_message(term.read_text())


@pytest.mark.parametrize(
    "repo, token, status, reason, fragment",
    [
        ("org/gated", None, 401, "ModelAccessDenied", "gated"),
        ("org/gated", OUTSIDER, 403, "ModelAccessDenied", "gated"),
        ("org/gated", "hf_unknown", 401, "ModelAccessDenied", "model.tokenSecret"),
        ("org/private", None, 401, "ModelAccessDenied", "model.tokenSecret"),
        ("org/private", OUTSIDER, 404, "ModelNotFound", "no such repository"),
        ("org/missing", READER, 404, "ModelNotFound", "no such repository"),
    ],
)
def test_refused_downloads_say_why(
    hub: LocalHub, tmp_path: Path, repo: str, token: str | None, status: int, reason: str,
    fragment: str,
) -> None:
    code, failure = _precompile(f"hf://{repo}@main", tmp_path, _env(hub, token))
    assert code == 1
    assert isinstance(failure, FailureSummary), failure
    assert failure.reason == reason, failure
    assert fragment in failure.message and repo in failure.message, failure.message
    assert f"{status} Client" in failure.message or f"'{status} " in failure.message, failure
    # what users set is named, never an environment variable the CRD refuses
    assert "(HF_TOKEN)" not in failure.message, failure.message


def test_a_hub_that_cannot_be_reached_is_not_a_missing_repository(
    hub: LocalHub, tmp_path: Path
) -> None:
    """Nothing listens on the port (a refused connection), then the hub speaks plain HTTP
    where TLS is asked for: each is ModelDownloadFailed naming its cause and what to check."""
    with socket.socket() as s:  # a port that was free a moment ago; nothing listens on it
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    for endpoint, cause in (
        (f"http://127.0.0.1:{closed}", "the hub cannot be reached"),
        (hub.url.replace("http://", "https://"), "TLS failed"),
    ):
        code, failure = _precompile("hf://org/gated@main", tmp_path, {"HF_ENDPOINT": endpoint})
        assert code == 1
        assert isinstance(failure, FailureSummary), failure
        assert failure.reason == "ModelDownloadFailed", (endpoint, failure)
        assert failure.message.startswith(f"hf://org/gated@main: {cause}: "), failure.message
        assert "model.downloadEnv" in failure.message, failure.message


def _raised(outer: Exception, *causes: BaseException) -> Exception:
    """``outer`` raised from ``causes[0]``, raised from ``causes[1]``, ..."""
    chain = [outer, *causes]
    for exc, cause in zip(chain, chain[1:], strict=False):
        exc.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "exc, reason, fragment",
    [
        (_raised(RuntimeError("write failed"), OSError(errno.ENOSPC, "No space left on device")),
         "ModelDownloadFailed", "the cache claim is full: free space on the claim"),
        (_raised(RuntimeError("lookup"), httpx.ConnectError("x"),
                 socket.gaierror(-2, "Name or service not known")),
         "ModelDownloadFailed", "the hub's name does not resolve: check HF_ENDPOINT"),
        (httpx.ProxyError("407 Proxy Authentication Required"),
         "ModelDownloadFailed", "a proxy refused the connection: check HTTPS_PROXY"),
        (_raised(RuntimeError("slow"), httpx.ReadTimeout("timed out")),
         "ModelDownloadFailed", "the hub did not answer in time"),
        (_raised(RuntimeError("hub"), _with_status(Exception("503 Server Error"), 503)),
         "ModelDownloadFailed", "the hub answered with an error"),
        (ValueError("something else"), "ModelDownloadFailed", "download failed: see the message"),
        (_with_status(Exception("404 Client Error"), 404), "ModelNotFound", "check model.uri"),
        (_with_status(Exception("403 Client Error"), 403), "ModelAccessDenied",
         "model.tokenSecret"),
    ],
)
def test_a_download_error_is_told_apart_by_its_cause(
    exc: Exception, reason: str, fragment: str
) -> None:
    """By the exceptions' types, errno and HTTP status along the chain (never their text)."""
    err = _download_error("org/m", exc)
    assert err.reason == reason, err
    assert fragment in str(err), str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("repo", ["org/gated", "org/private"])
def test_the_readers_token_downloads_the_files(hub: LocalHub, tmp_path: Path, repo: str) -> None:
    script = (
        "import sys; from pathlib import Path; from spyre_engine.launch import resolve_model; "
        "from spyre_engine.settings import EngineSettings; "
        "print(resolve_model(EngineSettings(model=sys.argv[1], artifact_dir=Path(sys.argv[2]), "
        "hf_cache_dir=Path(sys.argv[3]))))"
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    full.update(_env(hub, READER))
    proc = subprocess.run(
        [sys.executable, "-c", script, f"hf://{repo}", str(tmp_path / "art"), str(tmp_path / "hf")],
        capture_output=True, text=True, timeout=120, env=full, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    snapshot = Path(proc.stdout.strip().splitlines()[-1])
    assert snapshot.name == hub.repos[repo].sha
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == FILES


def test_summary_records_the_commit_a_branch_resolved_to(tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "models--org--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "granite"}')
    code, summary = _precompile("hf://org/cached@main", tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert code == 0, summary
    assert isinstance(summary, PrecompileSummary)
    assert summary.model_revision == commit
    assert json.loads(summary.to_line())["modelRevision"] == commit
