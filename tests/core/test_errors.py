"""perfmodel.core.errors: an unknown name says what it could have been."""

from __future__ import annotations

from perfmodel.core.errors import LIST_KNOWN_UP_TO, UnknownNameError


def test_an_unknown_name_lists_close_matches_or_the_few_known_ones():
    few = ["base", "causal-lm", "masked-lm"]
    assert str(UnknownNameError("task", "causal_lm", few)) == "unknown task 'causal_lm'; did you mean: causal-lm?"
    listed = "one of base, causal-lm, masked-lm"
    assert str(UnknownNameError("task", "nonsense", few)) == f"unknown task 'nonsense'; {listed}"
    assert str(UnknownNameError("task", " ", few)).endswith(f": the name is empty; {listed}")
    many = [f"gpu-{i}" for i in range(LIST_KNOWN_UP_TO + 1)]
    message = str(UnknownNameError("accelerator", "nonsense", many))
    assert message == f"unknown accelerator 'nonsense'; {len(many)} known (list them to choose)"
