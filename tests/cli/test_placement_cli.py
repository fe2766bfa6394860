"""`perfmodel predict` with placement options and `perfmodel export gavel`, through typer's runner."""

import json

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_predict_on_a_spread_placement_reports_communication_memory_and_fit():
    result = run("predict", "resnet18", "-b", 64, "--accelerator", "NVIDIA T4", "--nodes", 2, "--per-node", 2,
                 "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["devices"] == 4 and data["nodes"] == 2 and data["accelerator"] == "t4"
    assert data["breakdown_ms"]["communication"] > 0
    assert data["iter_time_ms"] == sum(data["breakdown_ms"].values())
    assert data["fits"] is True and 0 < data["peak_memory_bytes"] < data["memory_capacity_bytes"]
    assert data["placement"]["parallelism"]["data"] == 4
    assert data["placement"]["global_batch_size"] == 4 * 64  # -b is one replica's batch (README, "Batch size")


def test_bad_placements_exit_2_naming_the_problem():
    result = run("predict", "resnet18", "-b", 8, "--global-batch-size", 10, "--accelerator", "t4", "--nodes", 4)
    assert result.exit_code == 2 and "--global-batch-size 10 does not split" in result.output
    result = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--per-node", 4, "--tp", 3)
    assert result.exit_code == 2 and "--tp" in result.output
    result = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--devices-per-node", "4,x")
    assert result.exit_code == 2 and "--devices-per-node" in result.output


def one_error_line(result):
    """The one `error:` line of a refused command (exit code 2)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("options,message", [
    (("--tp", 0), "error: --tp must be >= 1, got 0"),
    (("--per-node", 8, "--tp", 0), "error: --tp must be >= 1, got 0"),
    (("--pp", 0), "error: --pp must be >= 1, got 0"),
    (("--tp", -2), "error: --tp must be >= 1, got -2"),
    (("--ep", 0), "error: --ep must be >= 1, got 0"),
    (("--micro-batches", 0), "error: --micro-batches must be >= 1, got 0"),
])
def test_a_degree_below_one_is_refused_naming_its_option(options, message):
    assert one_error_line(run("predict", "resnet18", "-b", 4, "--accelerator", "h100", *options)) == message


@pytest.mark.parametrize("options,message", [
    (("-b", 10**12), "error: -b/--batch-size 1,000,000,000,000 is over the limit of 2,147,483,647 samples per "
                     "replica"),
    (("-b", 4, "--global-batch-size", 7, "--per-node", 2),
     "error: --global-batch-size 7 does not split into 2 data-parallel replica(s) x 1 micro-batch(es)"),
    (("-b", 0), "error: -b/--batch-size: Input should be greater than 0 (got 0)"),
    (("-b", 4, "--zero", 5), "error: --zero: Input should be 0, 1, 2 or 3 (got 5)"),
    (("-b", 4, "--devices-per-node", "4,0"), "error: --devices-per-node: every node needs ≥ 1 device, got [4, 0]"),
])
def test_refused_values_are_named_in_the_users_terms_without_pydantics_wrapper(options, message):
    line = one_error_line(run("predict", "resnet18", "--accelerator", "a100", *options))
    assert line == message and "Value error" not in line


def test_the_header_shows_the_jobs_batch_and_the_global_batch_where_it_differs():
    header = {}
    for name, options in (("one", ("-b", 8)), ("data", ("-b", 32, "--per-node", 2)),
                          ("micro", ("-b", 1, "--micro-batches", 16))):
        result = run("predict", "resnet18", "--accelerator", "a100", *options)
        assert result.exit_code == 0, result.output
        header[name] = result.stdout.splitlines()[0]
    assert header["one"].startswith("resnet18 b=8 train on 1 x ") and "global batch" not in header["one"]
    assert header["data"].startswith("resnet18 b=32 (global batch 64) train on 2 x ")
    assert header["micro"].startswith("resnet18 b=1 (global batch 16) train on 1 x ")
    shared = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--per-node", 2, "--with", "gavel-lm:16")
    assert shared.exit_code == 0, shared.output
    lines = shared.stdout.splitlines()
    assert lines[0].startswith("resnet18 b=8 (global batch 16): ") and lines[1].startswith("gavel-lm b=16 (global "
                                                                                            "batch 32): ")


def test_a_batch_axis_and_an_explicit_batch_are_refused_together():
    line = one_error_line(run("predict", "resnet18", "--batch-sizes", "8,16", "-b", 32, "--accelerator", "t4"))
    assert line == "error: --batch-sizes replaces -b/--batch-size: give one or the other"
    line = one_error_line(run("predict", "resnet18", "--batch-sizes", "8,16", "-b", 1, "--accelerator", "t4"))
    assert "--batch-sizes replaces -b/--batch-size" in line  # given, even at its default


def test_predict_over_a_batch_axis_answers_each_batch_as_predict_at_that_batch_would():
    result = run("predict", "resnet18", "--batch-sizes", "4,16,40", "--accelerator", "t4", "--per-node", 2, "--json")
    assert result.exit_code == 0, result.output
    answers = json.loads(result.stdout)
    assert [a["placement"]["global_batch_size"] for a in answers] == [8, 32, 80]
    for batch, answer in zip((4, 16, 40), answers):
        one = run("predict", "resnet18", "-b", batch, "--accelerator", "t4", "--per-node", 2, "--json")
        assert one.exit_code == 0, one.output
        want = json.loads(one.stdout)
        assert abs(answer["throughput_samples_per_s"] / want["throughput_samples_per_s"] - 1) < 0.005
        assert abs(answer["peak_memory_bytes"] / want["peak_memory_bytes"] - 1) < 0.005
    bad = run("predict", "resnet18", "--batch-sizes", "4,0", "--accelerator", "t4")
    assert bad.exit_code == 2 and "--batch-sizes" in bad.output


def test_export_gavel_writes_gavels_file_with_named_worker_and_job_types_and_pairs(tmp_path):
    out = tmp_path / "throughputs.json"
    result = run("export", "gavel", out, "--job", "ResNet-18 (batch size 16)=resnet18:16", "--job", "gavel-lm:8",
                 "--worker-type", "t4=t4", "--worker-type", "v100=v100-sxm2-32gb", "--scale-factors", "1,2,4",
                 "--colocation")
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    assert set(raw) == {"t4", "t4_unconsolidated", "v100", "v100_unconsolidated"}
    resnet, lm = "ResNet-18 (batch size 16)", "gavel-lm (batch size 8)"
    for worker in raw:
        assert set(raw[worker]) == {str((job, sf)) for job in (resnet, lm) for sf in (1, 2, 4)}
    for sf in (1, 2, 4):
        alone = raw["t4"][str((resnet, sf))]["null"]
        shared, other = raw["t4"][str((resnet, sf))][str((lm, sf))]
        assert 0 < shared <= alone and 0 < other <= raw["t4"][str((lm, sf))]["null"]
        assert raw["t4"][str((lm, sf))][str((resnet, sf))] == [other, shared]
        assert 0 < raw["t4_unconsolidated"][str((resnet, sf))]["null"] <= alone * (1 + 1e-9)
    one, four = (raw["t4"][str((resnet, sf))]["null"] for sf in (1, 4))
    assert one < four <= 4 * one  # steps/s summed over the workers


def test_export_gavel_rejects_a_malformed_job(tmp_path):
    result = run("export", "gavel", tmp_path / "x.json", "--job", "resnet18", "--accelerators", "t4")
    assert result.exit_code == 2 and "ZOO_NAME:BATCH" in result.output
    assert not (tmp_path / "x.json").exists()


def test_export_gavel_refuses_a_missing_folder_before_predicting(tmp_path):
    result = run("export", "gavel", tmp_path / "nowhere" / "x.json", "--job", "resnet18:16", "--accelerators", "t4")
    assert result.exit_code == 2 and "no such folder" in result.output
    assert not (tmp_path / "nowhere").exists()


def test_tensor_parallelism_over_whole_nodes_and_the_catalog_network_by_default():
    common = ("predict", "resnet18", "-b", 8, "--accelerator", "h100-sxm5", "--nodes", 2, "--per-node", 8,
              "--tp", 16, "--json")
    default = run(*common)
    assert default.exit_code == 0, default.output
    data = json.loads(default.stdout)
    assert data["devices"] == 16 and data["nodes"] == 2 and data["placement"]["parallelism"]["tensor"] == 16
    assert data["placement"].get("inter_node_bandwidth_gbit_s") is None  # the catalog's network
    slow = json.loads(run(*common, "--inter-node-gbps", 10).stdout)
    assert slow["placement"]["inter_node_bandwidth_gbit_s"] == 10
    assert slow["breakdown_ms"]["communication"] > data["breakdown_ms"]["communication"] > 0


def test_expert_parallelism_must_divide_the_data_parallel_degree():
    result = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--per-node", 4, "--ep", 3)
    assert result.exit_code == 2 and "--ep" in result.output
    dense = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--per-node", 4, "--ep", 2)
    assert dense.exit_code == 2 and "parallelism.expert" in dense.output and "dense" in dense.output


def test_predict_with_a_second_job_answers_both_sharing_the_gpu():
    result = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm:16", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["sharing"] == "time-slicing" and len(body["throughput_samples_per_s"]) == 2
    for shared, alone in zip(body["throughput_samples_per_s"], body["isolated_throughput_samples_per_s"]):
        assert 0 < shared <= alone
    bad = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm")
    assert bad.exit_code == 2 and "--with" in bad.output
    mps = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm:16", "--sharing", "mig")
    assert mps.exit_code == 2 and "--sharing" in mps.output


def test_export_gavel_has_a_batch_axis(tmp_path):
    out = tmp_path / "throughputs.json"
    result = run("export", "gavel", out, "--job", "MLP (batch size 8)=mlp-recommender:8", "--worker-type", "t4=t4",
                 "--scale-factors", "1", "--batch-sizes", "8,32,100")
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    steps = {b: raw["t4"][str((f"MLP (batch size {b})", 1))]["null"] for b in (8, 32, 100)}
    assert all(v > 0 for v in steps.values())
    assert steps[8] * 8 < steps[100] * 100  # more samples per second at the larger batch


def test_export_gavel_on_servers_without_peer_to_peer(tmp_path):
    """`--intra-link host` (cloud VMs: no GPU peer-to-peer): consolidated multi-GPU steps/s at most those over the
    catalog's PCIe peer-to-peer, one GPU unchanged; an unknown link is exit 2 naming the choices."""
    files = {}
    for name, extra in (("p2p", ()), ("host", ("--intra-link", "host"))):
        files[name] = tmp_path / f"{name}.json"
        result = run("export", "gavel", files[name], "--job", "LM (batch size 8)=gavel-lm:8", "--worker-type",
                     "p100=p100-pcie-16gb", "--scale-factors", "1,4", *extra)
        assert result.exit_code == 0, result.output
    p2p, host = (json.loads(files[name].read_text())["p100"] for name in ("p2p", "host"))
    one, four = (str(("LM (batch size 8)", sf)) for sf in (1, 4))
    assert host[one]["null"] == p2p[one]["null"]
    assert 0 < host[four]["null"] < p2p[four]["null"]
    bad = run("export", "gavel", tmp_path / "x.json", "--job", "gavel-lm:8", "--accelerators", "t4",
              "--intra-link", "nvlink9")
    assert bad.exit_code == 2 and "--intra-link" in bad.output and "host" in bad.output
    assert not (tmp_path / "x.json").exists()


def test_predict_with_a_second_job_answers_registered_jobs_with_their_reports_while_sharing():
    """Two jobs the service registered, one of which reported a throughput while sharing a T4 with the other:
    `--with` answers it calibrated by that report and says so."""
    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.jobs.spec import JobSpec, ZooSource
    from perfmodel.settings import get_settings
    from perfmodel.store.jobs import JobStore

    first, second = (JobSpec(source=ZooSource(name=name), batch_size=batch) for name, batch in
                     (("resnet18", 8), ("gavel-lm", 16)))
    plain = json.loads(run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm:16",
                           "--json").output)
    with JobStore(get_settings().store_url) as store:  # the graphs the CLI kept: no second capture
        engine = PredictionEngine.open(EngineConfig(isolate_captures=False, graph_dir=get_settings().home / "graphs"),
                                       store=store)
        a, b = (engine.register(spec)[0].key for spec in (first, second))
        engine.observe(a, _t4(8), plain["throughput_samples_per_s"][0] * 0.5,
                       colocated_with=b)
    text = run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm:16")
    assert text.exit_code == 0, text.output
    assert "by its 1 report(s) while sharing t4 with 1 other job(s)" in " ".join(text.output.split())
    body = json.loads(run("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "gavel-lm:16",
                          "--json").output)
    assert body["calibration"][0]["level"] == "job" and body["calibration"][1]["level"] == "none"
    assert body["throughput_samples_per_s"][0] < plain["throughput_samples_per_s"][0] * 0.6
    assert body["throughput_samples_per_s"][1] == pytest.approx(plain["throughput_samples_per_s"][1])


def _t4(batch: int):
    from perfmodel.placement.spec import PlacementSpec

    return PlacementSpec(accelerator="t4", devices_per_node=(1,), global_batch_size=batch)


def test_channels_last_predicts_a_half_precision_convolutional_job_without_layout_transposes():
    args = ("predict", "resnet18", "-b", 16, "--precision", "amp", "--accelerator", "a100", "--json")
    plain, converted = (json.loads(run(*args, *extra).output) for extra in ((), ("--channels-last",)))
    assert converted["iter_time_ms"] < plain["iter_time_ms"]
    assert converted["job_id"] != plain["job_id"]


def test_an_older_pytorch_is_answered_slower_and_a_version_that_is_not_one_exits_2_naming_the_option():
    args = ("predict", "resnet18", "-b", 16, "--precision", "amp", "--accelerator", "a100")
    newest, older = (json.loads(run(*args, *extra, "--json").output) for extra in ((), ("--pytorch-version", "1.4.0")))
    assert older["iter_time_ms"] > newest["iter_time_ms"] and older["job_id"] != newest["job_id"]
    assert "(PyTorch 1.4)" in run("predict", "gavel-resnet18", "-b", 16, "--accelerator", "p100-pcie-16gb").output
    bad = run(*args, "--pytorch-version", "latest")
    assert bad.exit_code == 2 and "--pytorch-version" in bad.output
