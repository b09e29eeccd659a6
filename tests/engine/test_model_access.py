"""hf:// models: a refused download says why (ModelAccessDenied vs ModelNotFound), and the
summary records the commit an ``@main``-style revision resolved to.

A fake hub on 127.0.0.1 (``HF_ENDPOINT``) answers as huggingface.co does for gated, private and
missing repos; nothing leaves the machine. Pure (no vLLM): part of ``make test-unit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from spyre_engine.summary import FailureSummary, PrecompileSummary, parse_termination_message

# repo -> (status, X-Error-Code) as the hub answers an unauthorised client
ANSWERS = {
    "org/gated": (403, "GatedRepo"),
    "org/private": (401, "RepoNotFound"),
    "org/missing": (404, "RepoNotFound"),
}


class _Hub(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        for repo, (status, code) in ANSWERS.items():
            if repo in self.path:
                body = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _answer
    do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _precompile(model: str, tmp_path: Path, env: dict[str, str]) -> object:
    term = tmp_path / "term"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "precompile", "--model", model]
        + ["--artifact-dir", str(tmp_path / "art"), "--backend", "eager"]
        + ["--hf-cache-dir", str(tmp_path / "hf"), "--termination-log", str(term)],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        check=False,
    )
    return proc.returncode, parse_termination_message(term.read_text())


@pytest.mark.parametrize(
    "repo, reason, fragment",
    [
        ("org/gated", "ModelAccessDenied", "gated"),
        ("org/private", "ModelAccessDenied", "HF_TOKEN"),
        ("org/missing", "ModelNotFound", "download failed"),
    ],
)
def test_refused_downloads_say_why(
    hub: str, tmp_path: Path, repo: str, reason: str, fragment: str
) -> None:
    code, failure = _precompile(f"hf://{repo}@main", tmp_path, {"HF_ENDPOINT": hub})
    assert code == 1
    assert isinstance(failure, FailureSummary), failure
    assert failure.reason == reason, failure
    assert fragment in failure.message and repo in failure.message, failure.message


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
