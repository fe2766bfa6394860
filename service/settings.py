"""The service's settings: perfmodel's `Settings` (home, store URL) plus where and how `perfmodel serve` runs.

Every field comes from a `PERFMODEL_<NAME>` environment variable (or a `ServiceSettings(...)` argument); nothing is
needed: the defaults serve the shipped models from the SQLite store under `PERFMODEL_HOME` on 127.0.0.1:8000.

Tokens are never configured in clear: `PERFMODEL_TOKEN_SHA256` holds the SHA-256 hex digests of the bearer tokens
that may write (register jobs, post observations, promote models), comma-separated. `PERFMODEL_READ_TOKEN_SHA256`
adds tokens that may only read; reads need a token only with `PERFMODEL_READ_REQUIRES_TOKEN=true`. With no write
token configured, writes are open (the default host is loopback only; the server logs a warning).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from perfmodel.settings import Settings

MIB = 2**20
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

TokenHashes = Annotated[tuple[str, ...], NoDecode]


def hash_token(token: str) -> str:
    """The SHA-256 hex digest of a bearer token: what `PERFMODEL_TOKEN_SHA256` holds."""
    return hashlib.sha256(token.encode()).hexdigest()


class ServiceSettings(Settings):
    model_config = SettingsConfigDict(env_prefix="PERFMODEL_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0: any free port)")
    workers: int = Field(default=1, ge=1, le=64, description="uvicorn worker processes")
    log_level: str = Field(default="info", description="uvicorn log level")
    models_dir: Path | None = Field(default=None, description="model registry folder; default: the shipped models/")
    model_version: str | None = Field(default=None, description="NAME/VERSION to serve instead of the promoted "
                                                                "model of its role")
    token_sha256: TokenHashes = Field(default=(), description="SHA-256 hex digests of the write tokens")
    read_token_sha256: TokenHashes = Field(default=(), description="SHA-256 hex digests of read-only tokens")
    read_requires_token: bool = Field(default=False, description="reads need a (read or write) token too")
    max_request_bytes: int = Field(default=32 * MIB, ge=1024, description="largest JSON request body")
    max_onnx_bytes: int = Field(default=200 * MIB, ge=1024, description="largest ONNX upload (multipart body)")
    max_cached_jobs: int = Field(default=20_000, ge=1, description="jobs whose graph stays in memory")
    sync_interval_s: float = Field(default=2.0, ge=0, description="how often a worker picks up what other workers "
                                                                   "wrote (observations, deleted jobs, promotions); "
                                                                   "0: never")

    @field_validator("token_sha256", "read_token_sha256", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("token_sha256", "read_token_sha256")
    @classmethod
    def _hex_digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        digests = tuple(v.lower() for v in value)
        bad = [v for v in digests if not _SHA256_HEX.match(v)]
        if bad:
            raise ValueError(f"expected SHA-256 hex digests (64 hex characters) of the tokens, not the tokens; "
                             f"{len(bad)} entry(ies) are not (hash a token with `perfmodel serve --hash-token`)")
        return digests

    @property
    def writes_open(self) -> bool:
        return not self.token_sha256
