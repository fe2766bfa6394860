"""The model lifecycle of a prediction engine: which model serves each role, where every worker and replica reads
it, and how it changes.

- The store is the truth: a promotion is a `promoted` row of the store's model events (an insert: two workers
  promoting at once both land, nothing is lost), and each role serves the model of its newest `promoted` event.
  A role the store never promoted serves the registry's `promoted.json` (the offline CLI's view, which a promotion
  also updates, under a file lock).
- A pin (`model_version`, NAME/VERSION) fixes its role for this process: promotions of that role elsewhere do not
  move it, and promoting that role here is refused.
- `sync` (each worker, every few seconds) loads what the store says when it differs from what is served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.engine.errors import NotFound, Refused
from perfmodel.registry.registry import ROLES, ModelRegistry, load_errors, role_of

if TYPE_CHECKING:
    from perfmodel.store.jobs import ModelAction, ModelEvent

log = logging.getLogger("perfmodel.engine")


@dataclass(frozen=True)
class Pin:
    ref: str
    role: str


class ModelEvents(Protocol):
    """What the lifecycle asks of the store (`perfmodel.store.jobs.JobStore`): its model events, newest first, and
    a new one."""

    def model_events(self, limit: int | None = None) -> list[ModelEvent]: ...

    def add_model_event(self, action: ModelAction, model_version: str, detail: str | None = None) -> ModelEvent: ...


class ModelLifecycle:
    """Decides the models each role serves (pin > store > registry) and loads them through `load(refs)`."""

    def __init__(self, registry: ModelRegistry, store: ModelEvents | None, pin: Pin | None,
                 load: Callable[[dict[str, str | None]], Any]):
        self.registry = registry
        self.store = store
        self.pin = pin
        self._load = load
        self._roles: dict[str, str | None] = {}  # ref -> role, from manifests (None: not in the registry)
        self.events_seen = 0

    @classmethod
    def resolve_pin(cls, registry: ModelRegistry, model_version: str | None) -> Pin | None:
        if model_version is None:
            return None
        try:
            entry = registry.get(model_version)
        except UnknownNameError as exc:
            raise NotFound(f"model_version: {exc}") from None
        return Pin(entry.ref, role_of(entry.manifest.regressor))

    def _role(self, ref: str) -> str | None:
        if ref not in self._roles:
            try:
                self._roles[ref] = role_of(self.registry.get(ref).manifest.regressor)
            except PerfmodelError:  # promoted once, gone from this registry since
                self._roles[ref] = None
        return self._roles[ref]

    def store_promotions(self) -> dict[str, str]:
        """role -> NAME/VERSION of the newest `promoted` event of the store for it (roles never promoted there are
        left out); remembers the newest event id seen."""
        if self.store is None:
            return {}
        out: dict[str, str] = {}
        events = self.store.model_events()
        if events:
            self.events_seen = max(self.events_seen, events[0].id)
        for event in events:  # newest first
            if event.action != "promoted":
                continue
            role = self._role(event.model_version)
            if role is not None:
                out.setdefault(role, event.model_version)
        return out

    def wanted(self) -> dict[str, str | None]:
        """role -> the model it should serve (None: the registry's promoted one)."""
        refs: dict[str, str | None] = {role: None for role in ROLES}
        refs.update(self.store_promotions())
        if self.pin is not None:
            refs[self.pin.role] = self.pin.ref
        return refs

    def resolved(self, refs: dict[str, str | None]) -> dict[str, str]:
        """`refs` with None replaced by the registry's promoted model (roles with none left out)."""
        out = {}
        for role, ref in refs.items():
            ref = ref if ref is not None else self.registry.promoted_ref(role)
            if ref is not None:
                out[role] = ref
        return out

    def load_wanted(self) -> Any:
        return self._load(self.wanted())

    def changed_since_seen(self) -> bool:
        """Whether the store holds a model event newer than the last one seen (one cheap query)."""
        if self.store is None:
            return False
        newest = self.store.model_events(limit=1)
        return bool(newest) and newest[0].id != self.events_seen

    def prepare_promotion(self, version: str) -> tuple[str, str, dict[str, str | None]]:
        """(ref, role, refs to load) for promoting `version`; NotFound / Refused if it cannot be."""
        try:
            entry = self.registry.get(version)
        except UnknownNameError as exc:
            raise NotFound(str(exc)) from None
        role = role_of(entry.manifest.regressor)
        if self.pin is not None and self.pin.role == role and self.pin.ref != entry.ref:
            raise Refused(f"this server pins {self.pin.ref} for role {role!r} (model_version): it does not serve "
                          f"promotions of that role; restart it without PERFMODEL_MODEL_VERSION to follow them")
        return entry.ref, role, {**self.wanted(), role: entry.ref}

    def record(self, action: ModelAction, ref: str, detail: str | None = None) -> None:
        """A model event in the store (not marked seen: the next sync reads it with any other worker's)."""
        if self.store is not None:
            self.store.add_model_event(action, ref, detail)



def promoted_by_store(registry: ModelRegistry, store: ModelEvents | None) -> dict[str, str]:
    """role -> the model the store promotes (its newest `promoted` event for the role, else the registry's
    promoted.json): what every service on that store serves, a pin apart, and what `perfmodel retrain` takes as the
    champion. Read with a lifecycle of its own, so that no engine's record of the events it has seen moves."""
    lifecycle = ModelLifecycle(registry, store, None, load=lambda refs: refs)
    return lifecycle.resolved(lifecycle.wanted())


LOAD_ERRORS = load_errors()
