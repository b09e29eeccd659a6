"""Files on the cache claim, as gc sweeps them: sizes, and the trash removals go through.

Shared by the artifacts' gc (gc.py), the downloaded models' (weights.py) and the precompile
(its artifact's size). Pure: the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

#: What gc renames a directory to before deleting it (a reader sees it whole or not at all);
#: what a killed gc left under this prefix is deleted by the next.
TRASH_PREFIX = ".trash-"


def directory_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def empty_trash(directory: Path) -> int:
    """Delete the trash directories directly under ``directory`` (absent: nothing); bytes
    freed."""
    freed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.startswith(TRASH_PREFIX) and entry.is_dir(follow_symlinks=False):
                freed += directory_size(Path(entry.path))
                shutil.rmtree(entry.path, ignore_errors=True)
    return freed


__all__ = ["TRASH_PREFIX", "directory_size", "empty_trash"]
