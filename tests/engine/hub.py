"""A local stand-in for huggingface.co's model API, for ``HF_ENDPOINT``: nothing leaves the
machine.

It serves real files (a model directory) to the real download code (``huggingface_hub``'s
``snapshot_download``: ``/api/models/<repo>/revision/<rev>``, ``/api/models/<repo>/tree/<sha>``,
``HEAD``/``GET /<repo>/resolve/<sha>/<file>``) and refuses the way the Hub does, deciding by the
``Authorization`` header and the repo's access list (never by the URL alone):

=====================  ==================  ==========================  ======================
repo                   no token            unknown token               known token, no access
=====================  ==================  ==========================  ======================
gated                  401 ``GatedRepo``   401 invalid credentials     403 ``GatedRepo``
private, missing       401 ``RepoNotFound`` 401 invalid credentials    404 ``RepoNotFound``
=====================  ==================  ==========================  ======================

A public repo and a token on the repo's access list get 200. The error codes and messages are
the Hub's ``X-Error-Code``/``X-Error-Message`` headers, which ``huggingface_hub`` turns into
``GatedRepoError``/``RepositoryNotFoundError`` (see ``hf_raise_for_status``; 401 for a missing
repo without a token is the Hub's own behaviour, huggingface_hub's comment there says so).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


@dataclass
class Repo:
    """A model repo: its files (relative path -> bytes), who may read it, one commit."""

    files: dict[str, bytes] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    #: Tokens whose user may read a gated or private repo (accepted its terms / a member).
    readers: set[str] = field(default_factory=set)

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + hashlib.sha1(self.files[name]).digest())
        return digest.hexdigest()

    @classmethod
    def from_dir(cls, path: Path, **kw: object) -> Repo:
        """The regular files under ``path`` (dotfiles skipped) as a repo."""
        files = {
            str(p.relative_to(path)): p.read_bytes()
            for p in sorted(path.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        }
        return cls(files=files, **kw)  # type: ignore[arg-type]


class LocalHub:
    """The hub on ``host`` (an address of this machine), in a thread; :attr:`url` is the
    ``HF_ENDPOINT``. ``repos`` and ``tokens`` (the tokens the hub knows, i.e. valid
    credentials) may change while it runs; :attr:`requests` records (method, path, token)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.repos: dict[str, Repo] = {}
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def __enter__(self) -> LocalHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def refusal(self, repo_id: str, token: str | None) -> tuple[int, str, str] | None:
        """(status, X-Error-Code, X-Error-Message) the Hub answers ``token`` for ``repo_id``,
        or None when it may read the repo."""
        repo = self.repos.get(repo_id)
        if token is not None and token not in self.tokens:
            return 401, "", INVALID_CREDENTIALS
        if repo is not None and not (repo.gated or repo.private):
            return None
        if repo is not None and token in repo.readers:
            return None
        if repo is not None and repo.gated:
            if token is None:
                return (401, "GatedRepo", f"Access to model {repo_id} is restricted. You must "
                        "have access to it and be authenticated to access it. Please log in.")
            return (403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not "
                    f"in the authorized list. Visit {self.url}/{repo_id} to ask for access.")
        return 401 if token is None else 404, "RepoNotFound", "Repository not found"


class _Handler(BaseHTTPRequestHandler):
    owner: LocalHub

    def log_message(self, *args: object) -> None:
        pass

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization")
        if auth is None:
            return None
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else auth

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        for k, v in {"Content-Type": content_type, "Content-Length": str(len(body)),
                     **(headers or {})}.items():  # fmt: skip
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), headers)

    def _route(self) -> tuple[str, str, str, str] | None:
        """(kind, repo_id, revision, rest) for the paths huggingface_hub requests."""
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            return parts[4], f"{parts[2]}/{parts[3]}", parts[5], "/".join(parts[6:])
        if len(parts) >= 5 and parts[2] == "resolve":
            return "resolve", f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        return None

    def _answer(self) -> None:
        token = self._token()
        self.owner.requests.append((self.command, self.path, token))
        route = self._route()
        if route is None:
            return self._send(404, b'{"error": "Not Found"}')
        kind, repo_id, revision, rest = route
        refused = self.owner.refusal(repo_id, token)
        if refused is not None:
            status, code, message = refused
            headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
            return self._send(status, json.dumps({"error": message}).encode(), headers)
        repo = self.owner.repos[repo_id]
        if revision not in ("main", repo.sha):
            return self._send(404, b'{"error": "Invalid rev id"}',
                              {"X-Error-Code": "RevisionNotFound"})  # fmt: skip
        if kind == "revision":
            return self._json({
                "id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            })  # fmt: skip
        if kind == "tree":
            return self._json([
                {"type": "file", "path": name, "size": len(data),
                 "oid": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(repo.files.items())
            ])  # fmt: skip
        data = repo.files.get(rest)
        if data is None:
            return self._send(404, b'{"error": "Entry not found"}',
                              {"X-Error-Code": "EntryNotFound"})  # fmt: skip
        etag = f'"{hashlib.sha1(data).hexdigest()}"'
        self._send(200, data, {"ETag": etag, "X-Repo-Commit": repo.sha},
                   content_type="application/octet-stream")  # fmt: skip

    do_GET = _answer
    do_HEAD = _answer
