"""Print the pins of a few packages from a pip-compile'd lock, with their hashes, one line each:
``python3 lock_pick.py requirements.lock uv > uv.txt``, then ``pip install --require-hashes
--no-deps -r uv.txt``.

engine/Containerfile installs uv with it (the tool that installs everything else): at the
version and with the hashes of the project's lock, not whatever PyPI serves that day. Stdlib
only: it runs before anything is installed in the image. The lock is the project's own file
(hashes a site can audit); a package it does not pin is an error naming it.
"""

from __future__ import annotations

import re
import sys

_NAME = re.compile(r"[-_.]+")


def _canonical(name: str) -> str:
    return _NAME.sub("-", name).lower()


def pins(text: str) -> dict[str, str]:
    """Each requirement of the lock by canonical name: ``name==version [; marker]`` followed by
    its ``--hash`` options, continuation lines joined and comments dropped."""
    out: dict[str, str] = {}
    logical = ""
    for raw in [*text.splitlines(), ""]:
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        cont = line.endswith("\\")
        logical = f"{logical} {line.rstrip(chr(92)).strip()}".strip()
        if cont:
            continue
        if logical and not logical.startswith("-"):
            name = re.split(r"[=<>!~;\[\s]", logical, maxsplit=1)[0]
            out[_canonical(name)] = logical
        logical = ""
    return out


def pick(text: str, names: list[str]) -> str:
    """The lines for ``names`` (each pinned with ``==`` and hashed), or SystemExit naming what
    the lock lacks."""
    found = pins(text)
    lines = []
    for name in names:
        req = found.get(_canonical(name))
        if req is None or "==" not in req or "--hash=" not in req:
            raise SystemExit(f"the lock pins no {name!r} with hashes")
        lines.append(req)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit("usage: lock_pick.py LOCK NAME...")
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(pick(f.read(), sys.argv[2:]))
