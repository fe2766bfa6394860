"""GET /v1/models says what the store promotes (what every worker serves), whoever promoted it, and lists the
store's model events: the service's own, the CLI's and retrain's."""

from __future__ import annotations

import json
import shutil

from perfmodel.registry.registry import ModelRegistry, actor
from perfmodel.store.jobs import JobStore


def test_promoted_follows_the_store_and_events_list_every_promotion(client, models_dir, store_url):
    shutil.copytree(models_dir / "xgb-ops" / "v1", models_dir / "xgb-ops" / "v2")
    assert client.post("/v1/models/xgb-ops/v2/promote").status_code == 200
    # a stale promoted.json (a host that missed the update) does not change what is promoted: the store says
    (models_dir / "promoted.json").write_text(json.dumps({"cpu-step": "xgb-ops/v1",
                                                          "device-ops": "xgb-device-ops/v3"}))
    listed = client.get("/v1/models").json()
    flags = {m["model"]: m["promoted"] for m in listed["models"]}
    assert flags["xgb-ops/v2"] is True and flags["xgb-ops/v1"] is False
    assert listed["serving"]["cpu-step"] == "xgb-ops/v2"
    # a promotion from the command line is a model event the service lists and follows
    with JobStore(store_url) as store:
        ModelRegistry(models_dir).promote("xgb-ops/v1", store=store, by=actor("models promote"))
    client.app.state.service.sync_once()
    listed = client.get("/v1/models").json()
    assert listed["serving"]["cpu-step"] == "xgb-ops/v1"
    assert {m["model"]: m["promoted"] for m in listed["models"]}["xgb-ops/v1"] is True
    newest, older = listed["events"][:2]
    assert (newest["model_version"], json.loads(newest["detail"])["by"]) == ("xgb-ops/v1", "cli")
    assert (older["action"], older["model_version"]) == ("promoted", "xgb-ops/v2")
    # the service's own event says who asked, the role and what it replaced, as the command line's does
    asked = json.loads(older["detail"])
    assert (asked["by"], asked["role"], asked["previous"]) == ("service", "cpu-step", "xgb-ops/v1")
    assert asked["client"] and asked["host"] and asked["models_dir"] == str(models_dir)
    assert client.post("/v1/models/xgb-ops/v9/promote").status_code == 404
