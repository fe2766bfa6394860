"""Names used before issue 15's renames are still accepted on input (perfmodel.core.renamed)."""

import json

import numpy as np
import pytest
from pydantic import ValidationError

from perfmodel.core.renamed import RENAMED_FIELDS, upgrade_feature_names, upgrade_names, upgrade_roles
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.hardware.custom import validate_spec_sheet
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.placement.comm import links_path, load_link_table
from perfmodel.placement.spec import PlacementSpec
from perfmodel.registry.registry import ROLES, ModelRegistry, default_models_dir
from perfmodel.regressors import load_regressor
from perfmodel.regressors.manifest import Manifest


def _old(new: str) -> str:
    return next(old for old, name in RENAMED_FIELDS.items() if name == new)


def test_old_keys_are_upgraded_and_both_at_once_is_an_error():
    old = _old("memory_bandwidth_gb_s")
    assert upgrade_names({old: 1.0, "name": "x"}) == {"memory_bandwidth_gb_s": 1.0, "name": "x"}
    assert upgrade_names([1, 2]) == [1, 2]
    with pytest.raises(ValueError, match="memory_bandwidth_gb_s"):
        upgrade_names({old: 1.0, "memory_bandwidth_gb_s": 2.0})
    assert all(name not in RENAMED_FIELDS for name in RENAMED_FIELDS.values())  # no chains


def test_a_hardware_spec_in_old_names_equals_the_new_one():
    spec = get_accelerator("a100-sxm4-40gb")
    data = spec.model_dump(mode="json")
    old = {_old(k) if k in RENAMED_FIELDS.values() else k: v for k, v in data.items()}
    assert old != data and HardwareSpec.model_validate(old) == spec
    with pytest.raises(ValidationError):
        HardwareSpec.model_validate({**data, _old("memory_bandwidth_gb_s"): 1.0})


def test_a_spec_sheet_in_old_names_with_units():
    sheet = {"name": "acme-x9", "kind": "gpu", "peak_fp32_gflops": "60 TFLOP/s", "memory_gb": "80 GB",
             "compute_units": 100, _old("memory_bandwidth_gb_s"): "3.35 TB/s"}
    spec = validate_spec_sheet(sheet, catalog={})
    assert spec.memory_bandwidth_gb_s == pytest.approx(3350.0)


def test_a_placement_in_old_names_keeps_its_gbit_per_s():
    placement = PlacementSpec.model_validate({"accelerator": "t4", "global_batch_size": 8,
                                            _old("inter_node_bandwidth_gbit_s"): 25})
    assert placement.inter_node_bandwidth_gbit_s == 25


def test_promoted_json_with_the_old_role_name(tmp_path):
    assert upgrade_roles({"default": "a/v1", "device-ops": "b/v1"}) == {"cpu-step": "a/v1", "device-ops": "b/v1"}
    assert "cpu-step" in ROLES and "default" not in ROLES
    (tmp_path / "promoted.json").write_text(json.dumps({"default": "xgb-ops/v1"}))
    registry = ModelRegistry(tmp_path)
    assert registry.promoted_ref("cpu-step") == "xgb-ops/v1"
    registry.set_promoted("xgb-device-ops/v3", "device-ops")
    assert json.loads((tmp_path / "promoted.json").read_text()) == {"cpu-step": "xgb-ops/v1",
                                                                     "device-ops": "xgb-device-ops/v3"}


def test_a_model_saved_with_old_feature_names_loads_and_predicts_the_same(tmp_path):
    shipped = default_models_dir() / "xgb-ops" / "v1"
    new, old = "log_hw_bandwidth_gb_s", _old("log_hw_bandwidth_gb_s")
    assert upgrade_feature_names(["a", old]) == ("a", new)
    copy = tmp_path / "xgb-ops-old"
    copy.mkdir()
    for path in shipped.iterdir():  # the artifact as it was saved before the rename
        (copy / path.name).write_bytes(path.read_bytes().replace(new.encode(), old.encode()))
    assert old in (copy / "manifest.json").read_text()
    assert Manifest.read(copy).feature_names == Manifest.read(shipped).feature_names
    before, after = load_regressor(copy), load_regressor(shipped)
    rows = np.random.default_rng(0).normal(size=(64, len(after.booster_.feature_names)))
    assert np.array_equal(before.booster_.inplace_predict(rows), after.booster_.inplace_predict(rows))


def test_a_links_file_in_old_names(tmp_path):
    text = links_path().read_text()
    old = text
    for new in ("bandwidth_per_dir_gb_s", "nominal_per_dir_gb_s"):
        old = old.replace(f'"{new}"', f'"{_old(new)}"')
    assert old != text
    (tmp_path / "links.json").write_text(old)
    assert load_link_table(tmp_path / "links.json") == load_link_table()
