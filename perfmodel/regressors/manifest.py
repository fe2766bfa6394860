"""The manifest every saved model carries (`manifest.json` next to its artifact). Loading never unpickles: artifacts
are XGBoost JSON, safetensors or JSON, and the manifest says which regressor class reads them."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfmodel.core.renamed import upgrade_feature_names

MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA_VERSION = 1
_LIBRARIES = ("perfmodel", "torch", "xgboost-cpu", "xgboost", "torch-geometric", "numpy", "safetensors")


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def data_hash(keys: Iterable[str]) -> str:
    """A stable hash of the training data's identity (e.g. sorted profile uids or sample keys)."""
    digest = hashlib.sha256()
    for key in sorted(keys):
        digest.update(key.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed_features(cls, data: Any) -> Any:
        """Models saved before the renames of issue 15 name some features by their old names."""
        if isinstance(data, dict) and "feature_names" in data:
            return {**data, "feature_names": upgrade_feature_names(data["feature_names"])}
        return data

    schema_version: int = MANIFEST_SCHEMA_VERSION
    regressor: str = Field(description="regressor class key, e.g. xgb-ops, xgb-graph, gnn, roofline")
    feature_names: tuple[str, ...] = Field(description="input columns, in the order the artifact expects")
    normalisation: dict[str, Any] = Field(default_factory=dict, description="e.g. per-feature mean/std, target "
                                          "transform, interval calibration")
    settings: dict[str, Any] = Field(default_factory=dict, description="the estimator's __init__ settings")
    artifacts: tuple[str, ...] = Field(default=(), description="files next to the manifest")
    training_data_hash: str | None = None
    training_samples: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    library_versions: dict[str, str] = Field(default_factory=library_versions)
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        from perfmodel.core.errors import PerfmodelError

        path = Path(directory) / MANIFEST_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PerfmodelError(f"no {MANIFEST_FILE} in {directory}") from None
        except json.JSONDecodeError as exc:
            raise PerfmodelError(f"{path} is not valid JSON: {exc}") from None
        if data.get("schema_version") != MANIFEST_SCHEMA_VERSION:
            raise PerfmodelError(f"{path}: manifest schema_version {data.get('schema_version')!r} is not "
                                 f"supported (expected {MANIFEST_SCHEMA_VERSION})")
        return cls.model_validate(data)

    @classmethod
    def read_for(cls, directory: str | Path, regressor: str) -> Manifest:
        """`read`, refusing a manifest of another regressor."""
        from perfmodel.core.errors import PerfmodelError

        manifest = cls.read(directory)
        if manifest.regressor != regressor:
            raise PerfmodelError(f"{directory} holds a {manifest.regressor!r} model, not {regressor!r}")
        return manifest

    def check_features(self, names: Sequence[str]) -> None:
        """Refuse an artifact whose feature columns differ from the code's."""
        from perfmodel.core.errors import PerfmodelError

        if tuple(names) != self.feature_names:
            missing = sorted(set(self.feature_names) ^ set(names))
            raise PerfmodelError(f"model expects other features than this perfmodel computes: {missing[:8]}")
