"""The model registry: `models/<name>/<version>/` folders, each an artifact plus `manifest.json` (and
`domain.json`: the range of the training data, for `extrapolated`), and `models/promoted.json` naming the promoted
model of each role: `cpu-step` (iteration time on the host the corpus was profiled on), `device-ops` (per-op
latency on any catalog accelerator) and `whole-step` (the learned correction of a composed GPU step, learned from
real end-to-end training runs).

The shipped `models/` folder of a checkout is the default root; `PERFMODEL_MODELS_DIR` points elsewhere.

What is promoted: a service, `perfmodel predict` and `perfmodel retrain` follow the newest `promoted` model event of
their store for each role, and `promoted.json` for a role the store never promoted (`perfmodel.engine.models`).
`ModelRegistry.promote` with a store (what `perfmodel models promote`, `train --promote` and `retrain` do) records
the event there and updates `promoted.json`, as `POST /v1/models/{NAME/VERSION}/promote` does.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.core.atomic import write_json_atomically
from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.core.renamed import upgrade_roles
from perfmodel.regressors.manifest import Manifest

PROMOTED_FILE = "promoted.json"
ROLES = ("cpu-step", "device-ops", "whole-step")
DOMAIN_FILE = "domain.json"
_VERSION = re.compile(r"^v(\d+)$")


class PromotionRefused(PerfmodelError):
    """A model whose artifact does not load: it is not promoted, and the old model stays promoted."""


@functools.cache
def load_errors() -> tuple[type[BaseException], ...]:
    """What loading a model artifact raises when the artifact is bad (not when perfmodel has a bug)."""
    errors: list[type[BaseException]] = [PerfmodelError, OSError, ValueError, KeyError, EOFError]
    try:
        from xgboost.core import XGBoostError

        errors.append(XGBoostError)
    except ImportError:  # xgboost not installed: no xgboost artifacts either
        pass
    return tuple(errors)


def load_failure(exc: BaseException) -> str:
    """One line saying why an artifact did not load (a native library's stack trace left out)."""
    text = str(exc) if isinstance(exc, PerfmodelError) else f"{type(exc).__name__}: {exc}"
    text = text.split("Stack trace:")[0]
    return " ".join(text.split())[:500]


def actor(command: str) -> dict[str, str]:
    """Who asked for a model event from the command line: the command, the OS user and the host."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry for this uid (some containers)
        user = str(os.getuid())
    return {"by": "cli", "command": command, "user": user, "host": socket.gethostname()}


def default_models_dir() -> Path:
    configured = os.environ.get("PERFMODEL_MODELS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "models"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    version: str
    path: Path
    manifest: Manifest
    promoted: bool

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"


class ModelRegistry:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_models_dir()

    def entries(self) -> list[ModelEntry]:
        promoted = set(self._promoted().values())
        found = []
        for manifest_path in sorted(self.root.glob("*/v*/manifest.json")):
            version_dir = manifest_path.parent
            if not _VERSION.match(version_dir.name):
                continue
            ref = f"{version_dir.parent.name}/{version_dir.name}"
            found.append(ModelEntry(version_dir.parent.name, version_dir.name, version_dir,
                                    Manifest.read(version_dir), ref in promoted))
        return found

    def next_version_dir(self, name: str) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise PerfmodelError(f"model name {name!r}: use letters, digits, '.', '_' and '-'")
        versions = [int(m.group(1)) for p in (self.root / name).glob("v*") if (m := _VERSION.match(p.name))]
        return self.root / name / f"v{max(versions, default=0) + 1}"

    def save(self, regressor: Any, name: str, domain: dict[str, Any]) -> ModelEntry:
        """Save a fitted regressor as the next version of `name`, with its training domain."""
        directory = self.next_version_dir(name)
        regressor.save(directory)
        (directory / DOMAIN_FILE).write_text(json.dumps(domain, indent=2, sort_keys=True) + "\n")
        return self.get(f"{name}/{directory.name}")

    def get(self, ref: str | None = None, role: str = "cpu-step") -> ModelEntry:
        """`name/version`, `name` (its newest version), or None (the model promoted for `role`)."""
        entries = self.entries()
        if ref is None:
            ref = self.promoted_ref(role)
            if ref is None:
                raise PerfmodelError(f"no promoted model (role {role!r}) in {self.root}: run "
                                     "`perfmodel train --promote` "
                                     f"or `perfmodel models promote NAME/VERSION`")
        by_ref = {e.ref: e for e in entries}
        if ref in by_ref:
            return by_ref[ref]
        newest = [e for e in entries if e.name == ref]
        if newest:
            return max(newest, key=lambda e: int(e.version[1:]))
        raise UnknownNameError("model", ref, list(by_ref) + sorted({e.name for e in entries}))

    def promote(self, ref: str, role: str | None = None, *, store: Any | None = None,
                by: Mapping[str, Any] | None = None, previous: str | None = None) -> ModelEntry:
        """Make `ref` the promoted model of `role` (by default the role of its regressor kind). An artifact that
        does not load is never promoted (`PromotionRefused`).

        With `store` (a `perfmodel.store.jobs.JobStore`), the promotion is a `promoted` model event there, which
        every service worker and `perfmodel predict` on that store follow, and a refusal a `refused` event, as
        `POST /v1/models/.../promote` records them; the event's detail is JSON: the role, the previous model
        (`previous`, by default promoted.json's), the registry and `by` (who asked). promoted.json is updated
        after the event is recorded; a registry that cannot be written raises OSError then."""
        from perfmodel.regressors import load_regressor

        entry = self.get(ref)
        role = role or role_of(entry.manifest.regressor)
        if role not in ROLES:
            raise UnknownNameError("model role", role, ROLES)
        previous = previous if previous is not None else self.promoted_ref(role)
        about = {"role": role, **(by or {}), "models_dir": str(self.root), "previous": previous}
        try:
            load_regressor(entry.path)
        except load_errors() as exc:
            reason = load_failure(exc)
            if store is not None:
                store.add_model_event("refused", entry.ref, json.dumps({**about, "reason": reason}))
            kept = f"{previous} stays promoted for {role}" if previous else f"{role} has no promoted model"
            raise PromotionRefused(f"model {entry.ref} was not promoted, its artifact does not load ({reason}); "
                                   f"{kept}") from None
        if store is not None:
            store.add_model_event("promoted", entry.ref, json.dumps(about))
        self.set_promoted(entry.ref, role)
        return self.get(entry.ref)

    def set_promoted(self, ref: str, role: str) -> None:
        """Write `ref` as the promoted model of `role` in promoted.json (no load check: `promote` does that). The
        read-modify-write holds an exclusive lock on a lock file beside it, and the new file is written under a
        unique temporary name and renamed over the old one: processes promoting at once lose no role's entry,
        and readers see the old or the new file, never half a file. The file is readable as the shipped one is
        (0666 less the umask)."""
        import fcntl

        if role not in ROLES:
            raise UnknownNameError("model role", role, ROLES)
        path = self.root / PROMOTED_FILE
        with open(self.root / f".{PROMOTED_FILE}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            write_json_atomically(path, {**self._promoted(), role: ref})

    def _promoted(self) -> dict[str, str]:
        path = self.root / PROMOTED_FILE
        return upgrade_roles(json.loads(path.read_text())) if path.is_file() else {}

    def promoted_ref(self, role: str = "cpu-step") -> str | None:
        return self._promoted().get(role)


def role_of(regressor: str) -> str:
    """The role a regressor kind is promoted for: per-op device models answer `device-ops`, the learned whole-step
    stage `whole-step`, the rest `cpu-step`."""
    return {"xgb-device-ops": "device-ops", "xgb-whole-step": "whole-step",
            "device-whole-step": "whole-step"}.get(regressor, "cpu-step")


def read_domain(directory: Path) -> dict[str, Any]:
    path = Path(directory) / DOMAIN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def training_domain(samples: Sequence[Any]) -> dict[str, Any]:
    """What the training data covered: hardware, op kinds, modes, precisions and the range of batch size and total
    FLOPs. A query outside it is flagged `extrapolated`."""
    flops = [s.graph.totals.flops_fwd + s.graph.totals.flops_bwd for s in samples]
    return {
        "hardware": sorted({s.hardware.name for s in samples}),
        "kinds": sorted({k for s in samples for k in s.graph.totals.ops_by_kind}),
        "modes": sorted({s.spec.mode.value for s in samples}),
        "precisions": sorted({s.spec.precision.value for s in samples}),
        "batch_size": [min(s.spec.batch_size for s in samples), max(s.spec.batch_size for s in samples)],
        "total_flops": [min(flops), max(flops)],
        "samples": len(samples),
    }
