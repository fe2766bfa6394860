"""The engine's domain errors. All are `PerfmodelError`s (the CLI prints them and exits 2); the service maps each
to its HTTP status (`service/errors.py`): `FieldError` 422 naming the field, `NotFound` 404, `Refused` 409. Nothing
in the engine raises an HTTP error, and nothing turns an unexpected exception (a bug) into one of these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError

Loc = tuple[str | int, ...]


class NotFound(PerfmodelError):
    """No such job, observation or model."""


class Refused(PerfmodelError):
    """A request the engine declines in its current state: a model whose artifact does not load, a promotion of a
    role this server pins. Nothing changed."""


class FieldError(PerfmodelError):
    """Bad input at a known place of the request: `errors` is a list of {"loc", "msg", "type"} whose `loc` is
    relative to the request body (the service prefixes "body")."""

    def __init__(self, loc: Sequence[str | int], message: str, *, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.loc: Loc = tuple(loc)
        self.errors = errors if errors is not None else [{"loc": list(self.loc), "msg": message,
                                                          "type": "value_error"}]

    @classmethod
    def from_validation(cls, exc: ValidationError, prefix: Sequence[str | int]) -> FieldError:
        """A pydantic error about part of a request, its locations under `prefix`."""
        errors = [{"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors(include_url=False, include_input=False, include_context=False)]
        first = errors[0] if errors else {"loc": list(prefix), "msg": str(exc)}
        return cls(first["loc"], str(first["msg"]), errors=errors)
