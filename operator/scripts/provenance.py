"""What a release's images say about where they come from (issue 48, 4): the OCI labels
``version``, ``revision``, ``created`` and ``source``, and where the source is. Used by
release.py; standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The repository the images name as their source (``--source``): wins over git's origin.
SOURCE_ENV = "SPYRE_RELEASE_SOURCE"


_URL_PATH = re.compile(r"[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]+)*")
_HOST = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")


def public_url(remote: str) -> str | None:
    """A git remote as the https URL a reader can open, credentials dropped: ``https://`` and
    ``http://`` as they are, ``ssh://[user@]host[:port]/path``, ``git://host/path`` and
    scp-like ``user@host:path`` as ``https://host/path`` (no ``.git``); None for anything
    else (a local path, ``file://``, a host without a domain, odd characters): no source is
    better than a wrong one."""
    from urllib.parse import urlsplit

    remote = remote.strip()
    if "://" not in remote:  # scp-like: [user@]host:path
        head, sep, path = remote.partition(":")
        remote = f"ssh://{head}/{path}" if sep and "/" not in head else ""
    try:
        u = urlsplit(remote)
        host, port = u.hostname or "", u.port
    except ValueError:
        return None
    path = u.path.strip("/").removesuffix(".git")
    if (u.scheme not in ("https", "http", "ssh", "git") or not _HOST.fullmatch(host)
            or not _URL_PATH.fullmatch(path) or u.query or u.fragment):
        return None
    if u.scheme in ("https", "http"):
        return f"{u.scheme}://{host}{f':{port}' if port else ''}/{path}"
    return f"https://{host}/{path}"


def source_url(root: Path = ROOT) -> str | None:
    """Where the release's source lives: ``$SPYRE_RELEASE_SOURCE`` (``--source``), else git's
    ``origin`` (:func:`public_url`); None when neither names a public repository."""
    given = os.environ.get(SOURCE_ENV, "").strip()
    if given:
        url = public_url(given)
        if url is None:
            raise SystemExit(f"--source {given!r}: not an http(s), ssh or git URL")
        return url
    r = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                       capture_output=True, text=True)  # fmt: skip
    return public_url(r.stdout) if r.returncode == 0 else None


def release_labels(version: str, commit: str, when: int, source: str | None) -> dict[str, str]:
    """The OCI labels of a release's images: version, revision (the commit, ``-dirty`` for a
    dirty tree), created (the commit's time, so a commit gives one image) and, when known,
    source (:func:`source_url`; left out rather than made up)."""
    import datetime

    created = datetime.datetime.fromtimestamp(when, datetime.UTC)
    labels = {"org.opencontainers.image.version": version,
              "org.opencontainers.image.revision": commit,
              "org.opencontainers.image.created": created.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if source:
        labels["org.opencontainers.image.source"] = source
    return labels
