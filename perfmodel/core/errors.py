"""Errors a user can cause. The CLI turns them into a one-line message and exit code 2, the service into 4xx."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfmodelError(ValueError):
    """Bad input from the user (a name, a value, a file). Never a bug in perfmodel."""


class UnknownNameError(PerfmodelError, KeyError):
    """A look-up by name failed; the message lists the closest known names."""

    def __init__(self, what: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5) if name.strip() else []
        if not close and name.strip():
            close = [k for k in known if name.lower() in k.lower()][:5]
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; {len(known)} known (list them to choose)"
        if not name.strip():
            hint = f": the name is empty; {len(known)} known (list them to choose)"
        super().__init__(f"unknown {what} {name!r}{hint}")
        self.name = name
        self.close_matches = close

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DeviceError(PerfmodelError):
    """The requested device does not exist on this machine."""


class JobLoadError(PerfmodelError):
    """A job's model could not be built or loaded (user module, ONNX file, HF config)."""
