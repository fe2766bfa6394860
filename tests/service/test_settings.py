import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.app import create_app
from service.settings import ServiceSettings, hash_token


def test_settings_come_from_perfmodel_env_vars(monkeypatch, tmp_path):
    digest = hash_token("t0ken")
    monkeypatch.setenv("PERFMODEL_PORT", "9123")
    monkeypatch.setenv("PERFMODEL_WORKERS", "3")
    monkeypatch.setenv("PERFMODEL_MODEL_VERSION", "xgb-ops/v1")
    monkeypatch.setenv("PERFMODEL_TOKEN_SHA256", f" {digest.upper()} ,{hash_token('other')}")
    monkeypatch.setenv("PERFMODEL_STORE_URL", f"sqlite:///{tmp_path}/s.db")
    settings = ServiceSettings()
    assert (settings.port, settings.workers, settings.model_version) == (9123, 3, "xgb-ops/v1")
    assert settings.token_sha256 == (digest, hash_token("other")) and not settings.writes_open
    assert settings.resolved_store_url() == f"sqlite:///{tmp_path}/s.db"
    assert settings.max_onnx_bytes == 200 * 2**20 and settings.host == "127.0.0.1"


def test_a_token_in_clear_is_refused():
    with pytest.raises(ValidationError, match="SHA-256 hex digests"):
        ServiceSettings(token_sha256="my-secret-token")


def test_create_app_does_no_io(tmp_path):
    url = f"sqlite:///{tmp_path / 'never' / 'store.db'}"
    create_app(ServiceSettings(store_url=url, models_dir=tmp_path / "no-models"))
    assert not (tmp_path / "never").exists()  # the store is opened and the models loaded in the lifespan


def test_serve_cli_hashes_tokens_and_refuses_bad_options():
    perfmodel = str(Path(sys.executable).parent / "perfmodel")
    out = subprocess.run([perfmodel, "serve", "--hash-token", "abc"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == hash_token("abc")
    bad = subprocess.run([perfmodel, "serve", "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "port" in bad.stderr
