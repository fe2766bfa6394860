"""Folders of the registry made with the permissions any folder the process creates gets (0777 less the umask: 0755
under the usual 022), like the shipped models: a service running as another user on a shared models volume can read
what `perfmodel retrain` writes (`tempfile.mkdtemp` makes 0700 folders, which a rename into place would keep). Files
are written with `perfmodel.core.atomic`, which keeps the umask too."""

from __future__ import annotations

import secrets
from pathlib import Path

_ATTEMPTS = 100


def new_folder(parent: Path, prefix: str) -> Path:
    """A new, empty folder `parent/<prefix><random>` (mode 0777 less the umask)."""
    for _ in range(_ATTEMPTS):
        path = parent / f"{prefix}{secrets.token_hex(8)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary folder name under {parent}")
