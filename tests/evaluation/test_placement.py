"""The placement model against Pollux's measured T4 placements (adaptdl), leave-one-model-out."""


import numpy as np
import pytest

from perfmodel.core.accuracy import mape_pct
from perfmodel.evaluation.placement import ADAPTDL_MODELS, adaptdl_rows, evaluate_adaptdl
from perfmodel.settings import get_settings

ADAPTDL = get_settings().datasets_dir / "adaptdl"


@pytest.fixture(scope="module")
def rows():
    if not ADAPTDL.is_dir():
        pytest.skip(f"adaptdl dataset not found at {ADAPTDL} (set PERFMODEL_DATASETS_DIR, or put shared/datasets "
                    "beside the checkout)")
    return adaptdl_rows(ADAPTDL)


def test_rows_carry_layout_and_the_one_gpu_compute(rows):
    assert set(rows.app) == set(ADAPTDL_MODELS)
    row = rows[rows.placement == "1443"].iloc[0]
    assert row.devices == 12 and row.nodes == 4
    single = rows[rows.placement == "1"]
    np.testing.assert_allclose(single.single_ms, single.step_ms, rtol=0.5)  # its own (median) step


@pytest.mark.slow  # fits one model per held-out model
def test_leave_one_model_out_beats_ignoring_communication(rows):
    results, frame = evaluate_adaptdl(rows)
    assert {r.held_out for r in results} == set(ADAPTDL_MODELS)
    assert not frame.predicted_ms.isna().any()
    ours = mape_pct(frame.predicted_ms.to_numpy(), frame.step_ms.to_numpy())
    compute_only = mape_pct(frame.single_ms.to_numpy(), frame.step_ms.to_numpy())
    assert ours < 15 and ours < compute_only / 2
