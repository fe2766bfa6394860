"""`POST /v1/predict/matrix` with `layout: gavel`: the file Gavel's simulator reads, with `<worker type>_unconsolidated`
at every scale factor by default, and `worker_types` checked entry by entry (the 422 names the entry at fault)."""

from __future__ import annotations

import ast
from typing import Any

from tests.service.conftest import SMALL_JOB, make_client

JOB_TYPE = "MLP (batch size 8)"


def read_like_gavel(throughputs: dict[str, Any]) -> dict[str, dict[tuple[str, int], dict[Any, Any]]]:
    """What Gavel's `read_all_throughputs_json_v2` makes of the file: keys parsed with `ast.literal_eval` into
    (job type, scale factor) tuples, "null" kept as is."""
    parsed: dict[str, dict[tuple[str, int], dict[Any, Any]]] = {}
    for worker_type, table in throughputs.items():
        parsed[worker_type] = {}
        for job_type, entry in table.items():
            key = ast.literal_eval(job_type)
            assert isinstance(key[0], str) and isinstance(key[1], int)
            parsed[worker_type][key] = {other if other == "null" else ast.literal_eval(other): value
                                        for other, value in entry.items()}
    return parsed


def _gavel(client, **fields: Any):
    body = {"jobs": [SMALL_JOB], "layout": "gavel", "job_types": [JOB_TYPE], **fields}
    body.setdefault("grid", {"accelerators": ["k80"], "device_counts": [1, 2, 4]})
    return client.post("/v1/predict/matrix", json={k: v for k, v in body.items() if v is not None})


def test_the_gavel_layout_has_unconsolidated_workers_at_every_scale_factor_by_default(client):
    response = _gavel(client)
    assert response.status_code == 200, response.text
    parsed = read_like_gavel(response.json()["throughputs"])
    assert set(parsed) == {"k80", "k80_unconsolidated"}
    for scale_factor in (1, 2, 4):
        consolidated = parsed["k80"][(JOB_TYPE, scale_factor)]["null"]
        spread = parsed["k80_unconsolidated"][(JOB_TYPE, scale_factor)]["null"]
        assert 0 < spread <= consolidated * (1 + 1e-9)  # one device per server is never faster
    assert parsed["k80_unconsolidated"][(JOB_TYPE, 4)]["null"] < parsed["k80"][(JOB_TYPE, 4)]["null"]

    off = _gavel(client, grid={"accelerators": ["k80"], "device_counts": [1, 2, 4], "spread": False})
    assert off.status_code == 200, off.text
    unconsolidated = read_like_gavel(off.json()["throughputs"])["k80_unconsolidated"]
    assert set(unconsolidated) == {(JOB_TYPE, 1)}  # one device is both; spread: false leaves out the rest


def test_the_matrix_layout_spreads_only_when_asked(client):
    grid = {"accelerators": ["k80"], "device_counts": [1, 2]}
    default = client.post("/v1/predict/matrix", json={"jobs": [SMALL_JOB], "grid": grid}).json()
    assert [(p["devices"], p["nodes"]) for p in default["placements"]] == [(1, 1), (2, 1)]
    spread = client.post("/v1/predict/matrix", json={"jobs": [SMALL_JOB], "grid": {**grid, "spread": True}}).json()
    assert [(p["devices"], p["nodes"]) for p in spread["placements"]] == [(1, 1), (2, 1), (2, 2)]


def test_the_column_limit_counts_the_unconsolidated_placements_of_the_gavel_layout(settings):
    """k80 at 1, 2 and 4 devices: 3 consolidated placements, 5 with one device per server."""
    with make_client(settings.model_copy(update={"max_matrix_columns": 4})) as client:
        refused = _gavel(client)
        assert refused.status_code == 422, refused.text
        assert "max_matrix_columns" in refused.text and "5 placements" in refused.text
        assert _gavel(client, grid={"accelerators": ["k80"], "device_counts": [1, 2, 4], "spread": False}
                      ).status_code == 200
        matrix = client.post("/v1/predict/matrix", json={
            "jobs": [SMALL_JOB], "grid": {"accelerators": ["k80"], "device_counts": [1, 2, 4]}})
        assert matrix.status_code == 200, matrix.text


def _errors(response) -> dict[tuple[Any, ...], str]:
    assert response.status_code == 422, response.text
    return {tuple(error["loc"]): error["msg"] for error in response.json()["detail"]}


def test_an_unknown_accelerator_in_worker_types_is_a_422_at_its_entry(client):
    grid = {"accelerators": ["k80", "t4"], "device_counts": [1]}
    errors = _errors(_gavel(client, grid=grid, worker_types={"k80": "k8O"}))
    assert list(errors) == [("body", "worker_types", "k80")]
    assert "did you mean: k80?" in errors[("body", "worker_types", "k80")]
    ambiguous = _errors(_gavel(client, grid=grid, worker_types={"k80": "P100"}))[("body", "worker_types", "k80")]
    assert "p100-pcie-16gb" in ambiguous and "p100-sxm2-16gb" in ambiguous
    in_grid = _errors(_gavel(client, grid={**grid, "accelerators": ["k80", "t44"]}))
    assert list(in_grid) == [("body", "grid", "accelerators", 1)] and "did you mean" in in_grid[
        ("body", "grid", "accelerators", 1)]
    explicit = _errors(_gavel(client, grid=None, placements=[{"accelerator": "k80"}],
                              worker_types={"K80 (GCP)": "k8O"}))
    assert "did you mean: k80?" in explicit[("body", "worker_types", "K80 (GCP)")]


def test_a_worker_type_that_would_file_nothing_is_refused(client):
    grid = {"accelerators": ["k80"], "device_counts": [1]}
    errors = _errors(_gavel(client, grid=grid, worker_types={"p100": "p100-pcie-16gb"}))
    assert list(errors) == [("body", "worker_types", "p100")]
    assert "not in grid.accelerators" in errors[("body", "worker_types", "p100")]
    named = _gavel(client, grid={**grid, "accelerators": ["k80", "p100"]}, worker_types={"p100": "p100-pcie-16gb"})
    assert named.status_code == 200, named.text
    assert named.json()["worker_types"] == {"k80": "k80", "p100": "p100-pcie-16gb"}

    placements = [{"accelerator": "k80"}, {"accelerator": "k80", "devices_per_node": [1, 1]}]
    unused = _errors(_gavel(client, grid=None, placements=placements, worker_types={"p100": "p100-pcie-16gb"}))
    assert "no placement is on p100-pcie-16gb" in unused[("body", "worker_types", "p100")]
    twice = _errors(_gavel(client, grid=None, placements=placements, worker_types={"a": "k80", "b": "K80"}))
    assert list(twice) == [("body", "worker_types", "b")]
    filed = _gavel(client, grid=None, placements=placements, worker_types={"K80 (GCP)": "k80"})
    assert filed.status_code == 200, filed.text
    assert set(filed.json()["throughputs"]) == {"K80 (GCP)", "K80 (GCP)_unconsolidated"}


def test_the_gavel_layout_says_which_cells_observations_calibrated(client):
    """Gavel's file has no place for it: the response's `calibrated` names the cells, keyed as in the file."""
    response = _gavel(client)
    assert response.status_code == 200 and response.json()["calibrated"] == {}
    job = client.post("/v1/jobs", json=SMALL_JOB).json()["job_id"]
    steps = read_like_gavel(response.json()["throughputs"])["k80"][(JOB_TYPE, 1)]["null"]
    observed = client.post("/v1/observations", json={"job": job, "placement": {"accelerator": "k80"},
                                                    "throughput_samples_per_s": steps * SMALL_JOB["batch_size"] * 0.7})
    assert observed.status_code == 201, observed.text
    after = _gavel(client).json()
    key = str((JOB_TYPE, 1))
    assert after["calibrated"]["k80"][key] == "job" and after["calibrated"]["k80_unconsolidated"][key] == "job"
    assert read_like_gavel(after["throughputs"])["k80"][(JOB_TYPE, 1)]["null"] < steps


def test_a_job_whose_reference_implementation_works_on_the_host_is_named_host_bound_in_both_layouts(client):
    a3c = {"source": {"kind": "zoo", "name": "gavel-a3c"}, "batch_size": 1}
    jobs, grid = [SMALL_JOB, a3c], {"accelerators": ["k80", "v100-sxm2-16gb"], "device_counts": [1]}
    gavel = client.post("/v1/predict/matrix", json={"jobs": jobs, "layout": "gavel", "grid": grid,
                                                    "job_types": [JOB_TYPE, "A3C"]})
    assert gavel.status_code == 200, gavel.text
    named = gavel.json()["host_bound"]
    assert set(named) == {"A3C"} and "Atari" in named["A3C"]
    matrix = client.post("/v1/predict/matrix", json={"jobs": jobs, "grid": grid}).json()
    assert matrix["host_bound"][0] is None and "Atari" in matrix["host_bound"][1]
    one = client.post("/v1/predict", json={"job": a3c, "placement": {"accelerator": "v100-sxm2-16gb"}}).json()
    assert one["host_bound_likely"] is True and one["host_bound_reason"] == matrix["host_bound"][1]
