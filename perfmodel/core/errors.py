"""Errors a user can cause. The CLI turns them into a one-line message and exit code 2, the service into 4xx."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class PerfmodelError(ValueError):
    """Bad input from the user (a name, a value, a file). Never a bug in perfmodel."""


LIST_KNOWN_UP_TO = 12  # an unknown name among this few known ones gets them all in its message


class UnknownNameError(PerfmodelError, KeyError):
    """A look-up by name failed; the message lists the closest known names."""

    def __init__(self, what: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.6) if name.strip() else []
        if not close and name.strip():
            close = [k for k in known if name.lower() in k.lower()][:5]
        choices = (f"one of {', '.join(known)}" if len(known) <= LIST_KNOWN_UP_TO
                   else f"{len(known)} known (list them to choose)")
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; {choices}"
        if not name.strip():
            hint = f": the name is empty; {choices}"
        super().__init__(f"unknown {what} {name!r}{hint}")
        self.name = name
        self.close_matches = close

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DeviceError(PerfmodelError):
    """The requested device does not exist on this machine."""


class JobLoadError(PerfmodelError):
    """A job's model could not be built or loaded (user module, ONNX file, HF config)."""


_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def validation_message(exc: ValidationError, options: Mapping[str, str] | None = None) -> str:
    """A pydantic error as one line in the user's terms: each field at fault named by its option in `options`
    (field -> option, e.g. batch_size -> -b/--batch-size), else by the field; pydantic's "Value error, " prefix
    dropped; an error of the whole model (no field) is its message alone, its leading field named as an option."""
    options = options or {}
    parts = []
    for error in exc.errors():
        field = ".".join(str(x) for x in error["loc"] if not isinstance(x, int))
        message = str(error["msg"])
        for prefix in _PYDANTIC_PREFIXES:
            message = message.removeprefix(prefix)
        if not field:  # a model validator's message names its own field: "global_batch_size: ..."
            named, sep, rest = message.partition(": ")
            parts.append(f"{options[named]}: {rest}" if sep and named in options else message)
            continue
        given = error.get("input")
        shown = f" (got {given!r})" if isinstance(given, (str, int, float)) else ""
        parts.append(f"{options.get(field, field)}: {message}{shown}")
    return "; ".join(parts)
