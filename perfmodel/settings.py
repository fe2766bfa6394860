"""Settings from `PERFMODEL_*` environment variables (pydantic-settings). Read when asked, never at import."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path.home() / ".perfmodel"


def _default_datasets_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "shared" / "datasets"  # beside the checkout


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PERFMODEL_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="where the default SQLite store lives")
    store_url: str | None = Field(default=None, description="SQLAlchemy URL of the profile store; default: "
                                  "sqlite:///$PERFMODEL_HOME/perfmodel.db")
    datasets_dir: Path = Field(default_factory=_default_datasets_dir, description="the public GPU measurements "
                               "(read in place, never copied); default: shared/datasets beside the checkout")
    fleet_job_prior: float = Field(default=0.3, gt=0, le=5, allow_inf_nan=False,
                                   description="fleet calibration: prior standard deviation (log) of a job's own "
                                   "error; smaller lets other jobs' observations move a job's answer further")
    fleet_chip_prior: float = Field(default=0.5, gt=0, le=5, allow_inf_nan=False,
                                    description="fleet calibration: prior standard deviation (log) of a chip's error "
                                    "on every job of one math; larger lets other jobs' observations move it further")

    def resolved_store_url(self) -> str:
        if self.store_url:
            return self.store_url
        return f"sqlite:///{self.home / 'perfmodel.db'}"


def get_settings() -> Settings:
    return Settings()
