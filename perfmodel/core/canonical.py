"""Canonical JSON (sorted keys, no spaces: what content hashes are taken of), written in pieces.

`json.dumps(value, sort_keys=True, separators=(",", ":"))` of a job spec holding a graph IR is one C call over
megabytes: it holds the GIL for tens of milliseconds, and a server's event loop waits that long. `canonical_chunks`
yields the very same text piece by piece (each element of a long list on its own), so other threads run between
the pieces; `canonical_sha256` hashes them.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterator
from typing import Any

from pydantic import Field

SEPARATORS = (",", ":")
PIECE_ITEMS = 64  # lists and dicts longer than this are written an item at a time


def opt_in_flag(description: str) -> Any:
    """A boolean field of a record, false unless set, and left out of its JSON (so of its content hash) while false:
    a flag added to a record keeps every existing record's key and text."""
    return Field(default=False, exclude_if=operator.not_, description=description)


def canonical_json(value: Any) -> str:
    """The canonical text of `value` in one call."""
    return json.dumps(value, sort_keys=True, separators=SEPARATORS)


def canonical_chunks(value: Any) -> Iterator[str]:
    """`canonical_json(value)`, in pieces whose concatenation is exactly that text."""
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        if len(value) > PIECE_ITEMS or any(isinstance(v, (dict, list, tuple)) for v in value.values()):
            yield "{"
            for i, k in enumerate(sorted(value)):
                yield ("," if i else "") + json.dumps(k) + ":"
                yield from canonical_chunks(value[k])
            yield "}"
            return
    elif isinstance(value, (list, tuple)) and len(value) > PIECE_ITEMS:
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield canonical_json(item)
        yield "]"
        return
    yield canonical_json(value)


def canonical_sha256(value: Any) -> str:
    """sha256 (hex) of `canonical_json(value)`, written and hashed in pieces."""
    digest = hashlib.sha256()
    for chunk in canonical_chunks(value):
        digest.update(chunk.encode())
    return digest.hexdigest()
