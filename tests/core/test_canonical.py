"""Canonical JSON written in pieces is exactly the one-call text, whatever the value."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.core.canonical import PIECE_ITEMS, canonical_chunks, canonical_json, canonical_sha256

_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
_values = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=PIECE_ITEMS + 6)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=PIECE_ITEMS + 4)
                       | st.tuples(inner, inner), max_leaves=400)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_the_pieces_join_to_the_one_call_text_and_hash_alike(value):
    assert "".join(canonical_chunks(value)) == json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert canonical_sha256(value) == hashlib.sha256(canonical_json(value).encode()).hexdigest()


def test_a_long_list_is_written_an_item_at_a_time():
    nodes = [{"op": "linear", "shape": [i, 4]} for i in range(3 * PIECE_ITEMS)]
    chunks = list(canonical_chunks({"nodes": nodes, "name": "g"}))
    assert len(chunks) > 3 * PIECE_ITEMS and max(len(c) for c in chunks) < 64


def test_keys_that_are_not_strings_are_left_to_json():
    value = {2: "a", 1: [2] * (PIECE_ITEMS + 1)}
    assert "".join(canonical_chunks(value)) == canonical_json(value)
