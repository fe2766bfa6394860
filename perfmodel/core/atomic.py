"""Write a file so that readers and crashes see the old file or the new one, never part of one: the bytes go to a
temporary file beside the target (same filesystem), which is then renamed over it (`os.replace` is atomic). The
temporary file is created as any file the process creates is (0666 less the umask: 0644 under the usual 022), so
the renamed file is readable by whom a plain write would let read it (`tempfile.mkstemp`'s 0600 would be kept by the
rename: a service running as another user could not read a model's manifest on a shared volume)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TEMP_NAME_ATTEMPTS = 100


def atomic_write(path: str | Path, write: Callable[[Path], object], *, make_parents: bool = True) -> Path:
    """Call `write(tmp)` to fill a temporary file beside `path`, then rename it over `path`. On any failure the
    temporary file is removed and `path` is left as it was. Unique temp names let concurrent writers coexist (the
    last rename wins). Returns `path`."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: no such folder {path.parent}")
    tmp = _new_temp_file(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _new_temp_file(path: Path) -> Path:
    """A new, empty file beside `path` with a unique name, mode 0666 less the umask."""
    for _ in range(_TEMP_NAME_ATTEMPTS):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary file name beside {path}")


def write_text_atomically(path: str | Path, text: str, *, make_parents: bool = True) -> Path:
    """`text` (UTF-8) at `path`, atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), make_parents=make_parents)


def write_json_atomically(path: str | Path, data: Any, *, make_parents: bool = True) -> Path:
    """`data` as indented, key-sorted JSON at `path`, atomically (values JSON cannot hold are written as str)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return write_text_atomically(path, text, make_parents=make_parents)
