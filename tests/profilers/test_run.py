from perfmodel.jobs.spec import JobSpec
from perfmodel.profilers.run import profile_job
from perfmodel.records import Outcome

from .helpers import user_spec


def test_profile_job_runs_every_stage():
    spec = user_spec("tiny_cnn", batch_size=2)
    messages = []
    profile = profile_job(spec, "cpu", warmup=1, repeats=4, onnx=True, op_steps=2, progress=messages.append)
    assert profile.job == spec and profile.job_id == spec.key()
    assert profile.family.startswith("module:") and profile.environment.device == "cpu"
    assert profile.iteration.outcome == Outcome.ok and len(profile.iteration.samples_ms) == 4
    assert profile.ops.steps == 2 and {r.phase for r in profile.ops.ops} >= {"forward", "backward", "optimizer"}
    # every layer's op is matched to its IR node; what is not is the loss's reduction and casts, a few µs that
    # a loaded host can stretch past a tenth of this tiny forward, hence the margin on the time share
    forward = [r for r in profile.ops.ops if r.phase == "forward"]
    layers = {"aten::conv2d", "aten::convolution", "aten::linear", "aten::addmm", "aten::relu"}
    assert {r.name for r in forward} & layers and all(r.ir_node for r in forward if r.name in layers)
    assert profile.ops.matched_fraction > 0.75
    assert {n.graph_optimization for n in profile.onnx.nodes} == {"disabled", "enabled"}
    assert any("ONNX" in m for m in messages) and any("coverage" in m for m in messages)


def test_profile_job_out_of_memory_stops_after_the_iteration():
    profile = profile_job(user_spec("too_much"), "cpu", warmup=1, repeats=2, onnx=True)
    assert profile.iteration.outcome == Outcome.oom
    assert profile.ops is None and profile.onnx is None


def test_profile_job_of_an_onnx_file_uses_onnx_runtime_only(tmp_path):
    from perfmodel.jobs.onnx_export import export_onnx

    path = export_onnx(user_spec("tiny_mlp", batch_size=2), tmp_path / "mlp.onnx")
    spec = JobSpec.from_options(onnx=path, batch_size=2)
    profile = profile_job(spec, "cpu")
    assert profile.family == "onnx" and profile.iteration is None and profile.ops is None
    assert profile.onnx.provider == "CPUExecutionProvider" and profile.onnx.nodes


def test_profile_job_time_budget_scales_the_step_counts():
    profile = profile_job(user_spec("sleepy"), "cpu", warmup=5, repeats=40, op_steps=5, time_budget_s=0.5)
    assert 3 <= profile.iteration.repeats < 40 and profile.iteration.warmup >= 2
    assert 1 <= profile.ops.steps < 5
    unbounded = profile_job(user_spec("sleepy"), "cpu", warmup=1, repeats=4, op_steps=2, time_budget_s=None)
    assert (unbounded.iteration.warmup, unbounded.iteration.repeats, unbounded.ops.steps) == (1, 4, 2)
