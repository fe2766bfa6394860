"""Write a file so that readers and crashes see the old file or the new one, never part of one: the bytes go to a
temporary file beside the target (same filesystem), which is then renamed over it (`os.replace` is atomic)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: str | Path, write: Callable[[Path], object], *, make_parents: bool = True) -> Path:
    """Call `write(tmp)` to fill a temporary file beside `path`, then rename it over `path`. On any failure the
    temporary file is removed and `path` is left as it was. Unique temp names let concurrent writers coexist (the
    last rename wins). Returns `path`."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: no such folder {path.parent}")
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomically(path: str | Path, text: str, *, make_parents: bool = True) -> Path:
    """`text` (UTF-8) at `path`, atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), make_parents=make_parents)


def write_json_atomically(path: str | Path, data: Any, *, make_parents: bool = True) -> Path:
    """`data` as indented, key-sorted JSON at `path`, atomically (values JSON cannot hold are written as str)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return write_text_atomically(path, text, make_parents=make_parents)
