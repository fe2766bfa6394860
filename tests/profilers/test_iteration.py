import pytest
import torch

from perfmodel.jobs.build import build_job
from perfmodel.profilers.iteration import (
    MasterWeightsOptimizer,
    iteration_stats,
    make_optimizer,
    make_step,
    peak_allocated_bytes,
    profile_iteration,
    time_step_ms,
)
from perfmodel.records import Outcome

from .helpers import user_spec, zoo_spec


def test_tiny_module_statistics_are_consistent():
    job = build_job(user_spec("tiny_mlp", batch_size=4))
    stats = profile_iteration(job, warmup=2, repeats=7)
    assert stats.outcome == Outcome.ok and stats.error is None
    assert (stats.warmup, stats.repeats, len(stats.samples_ms)) == (2, 7, 7)
    assert all(t > 0 for t in stats.samples_ms)
    assert stats.iter_time_ms_p10 <= stats.iter_time_ms_median <= stats.iter_time_ms_p90
    assert min(stats.samples_ms) <= stats.iter_time_ms_mean <= max(stats.samples_ms)
    assert stats.iter_time_cv >= 0
    assert stats.throughput_samples_per_s == pytest.approx(4 * 1000 / stats.iter_time_ms_median)
    assert stats.peak_memory_bytes > 0  # activations and gradients of the step


def test_resnet18_training_step():
    job = build_job(zoo_spec("resnet18", batch_size=2))
    stats = profile_iteration(job, warmup=1, repeats=3)
    assert stats.outcome == Outcome.ok and len(stats.samples_ms) == 3
    assert stats.iter_time_ms_median > 0 and stats.batch_size == 2
    # resnet18 at 224x224 keeps tens of MB of activations per sample for backward
    assert stats.peak_memory_bytes > 2 * 10 * 2**20


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_train_step_updates_the_weights(optimizer):
    job = build_job(user_spec("tiny_mlp", optimizer=optimizer))
    before = job.module.fc1.weight.detach().clone()
    make_step(job)()
    assert not torch.equal(before, job.module.fc1.weight)
    assert job.module.fc1.weight.grad is None  # zero_grad(set_to_none=True)


@pytest.mark.parametrize("precision", ["fp32", "fp16-master"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_a_fused_optimizer_is_torchs_fused_implementation_and_steps_as_the_default_one(optimizer, precision):
    """`fused_optimizer`: the profiled step runs torch's fused implementation (on a master-weight recipe, over the
    fp32 masters), whose update equals the default (foreach) one's to rounding."""
    weights = {}
    for fused in (False, True):
        torch.manual_seed(0)
        job = build_job(user_spec("tiny_mlp", optimizer=optimizer, precision=precision, fused_optimizer=fused))
        stepper = make_optimizer(job.spec.optimizer, job.module.parameters(), job.spec.precision.master_weights,
                                 fused=job.spec.fused_optimizer)
        inner = stepper.inner if isinstance(stepper, MasterWeightsOptimizer) else stepper
        assert bool(inner.defaults["fused"]) is fused
        torch.manual_seed(1)
        job.loss_fn(job.forward()).backward()
        stepper.step()
        weights[fused] = job.module.fc1.weight.detach().float().clone()
        make_step(job)()  # and the training step runs
    torch.testing.assert_close(weights[True], weights[False], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_master_weight_step_updates_fp32_masters_and_writes_them_back(optimizer):
    """fp16-master (apex O2): the module is fp16, the optimizer steps fp32 copies of the weights from fp32 copies of
    the gradients made at the step, and the module holds the masters rounded to fp16."""
    job = build_job(user_spec("tiny_mlp", optimizer=optimizer, precision="fp16-master"))
    weight = job.module.fc1.weight
    assert weight.dtype == torch.float16
    make_step(job)()  # the training step runs it
    assert weight.grad is None
    stepper = make_optimizer(job.spec.optimizer, job.module.parameters(), master_weights=True)
    assert isinstance(stepper, MasterWeightsOptimizer)
    master = stepper.master[[id(p) for p in stepper.params].index(id(weight))]
    before = master.detach().clone()
    assert before.dtype == torch.float32 and torch.equal(before.to(torch.float16), weight.detach())
    job.loss_fn(job.forward()).backward()
    stepper.step()
    assert master.grad is not None and master.grad.dtype == torch.float32
    assert torch.equal(master.grad, weight.grad.float())
    stepper.zero_grad(set_to_none=True)
    assert master.grad is None  # the fp32 gradients exist at the step only, as apex frees them
    assert not torch.equal(master.detach(), before)
    assert torch.equal(weight.detach(), master.detach().to(torch.float16))
    assert weight.grad is None  # the half gradients are freed


def test_bf16_master_accumulates_the_gradients_in_persistent_fp32_buffers():
    """bf16-master (Megatron-LM's main_grad): each bf16 gradient is added into an fp32 buffer as backward produces
    it and freed; two backwards (gradient accumulation) sum in fp32; the step reads the buffers, `zero_grad` zeroes
    them and keeps them."""
    spec = user_spec("tiny_mlp", optimizer="adamw", precision="bf16-master")
    stepped = build_job(spec)
    make_step(stepped)()  # the training step runs it
    assert stepped.module.fc1.weight.dtype == torch.bfloat16 and stepped.module.fc1.weight.grad is None
    job = build_job(spec)  # one optimizer per module: its hooks own the module's gradients
    weight = job.module.fc1.weight
    stepper = make_optimizer(job.spec.optimizer, job.module.parameters(), master_weights=True, fp32_gradients=True)
    assert isinstance(stepper, MasterWeightsOptimizer)
    master = stepper.master[[id(p) for p in stepper.params].index(id(weight))]
    job.loss_fn(job.forward()).backward()
    assert weight.grad is None and master.grad is not None and master.grad.dtype == torch.float32
    once = master.grad.clone()
    job.loss_fn(job.forward()).backward()
    assert torch.allclose(master.grad, 2 * once, rtol=1e-2, atol=1e-6)  # accumulated in fp32
    before = master.detach().clone()
    stepper.step()
    assert not torch.equal(master.detach(), before)
    assert torch.equal(weight.detach(), master.detach().to(torch.bfloat16))
    buffer = master.grad
    stepper.zero_grad(set_to_none=True)
    assert master.grad is buffer and not buffer.any()  # persistent, zeroed


def test_inference_step_computes_no_gradients():
    job = build_job(user_spec("tiny_mlp", mode="inference"))
    before = job.module.fc1.weight.detach().clone()
    make_step(job)()
    assert job.module.fc1.weight.grad is None and torch.equal(before, job.module.fc1.weight)
    assert profile_iteration(job, warmup=1, repeats=3).outcome == Outcome.ok


def test_out_of_memory_is_recorded_not_raised():
    job = build_job(user_spec("too_much"))
    stats = profile_iteration(job, warmup=1, repeats=3)
    assert stats.outcome == Outcome.oom
    assert "allocate" in stats.error and "\n" not in stats.error
    assert stats.samples_ms == () and stats.iter_time_ms_median is None


def test_other_errors_propagate():
    job = build_job(user_spec("broken"))
    with pytest.raises(ValueError, match="a bug in the user's forward"):
        profile_iteration(job, warmup=1, repeats=2)


def test_time_step_ms_measures_wall_time():
    import time

    elapsed = time_step_ms(lambda: time.sleep(0.02), torch.device("cpu"))
    assert 20 <= elapsed < 200


def test_iteration_stats_pure():
    stats = iteration_stats((10.0, 20.0, 30.0, 40.0, 50.0), warmup=1, batch_size=8)
    assert stats.iter_time_ms_median == 30.0 and stats.iter_time_ms_mean == 30.0
    assert stats.iter_time_ms_p10 == pytest.approx(14.0) and stats.iter_time_ms_p90 == pytest.approx(46.0)
    assert stats.iter_time_cv == pytest.approx(15.811388 / 30.0)
    assert stats.throughput_samples_per_s == pytest.approx(8 * 1000 / 30.0)
    assert iteration_stats((5.0,), warmup=0, batch_size=1).iter_time_cv == 0.0


def test_peak_allocated_bytes_replays_events_in_time_order():
    events = [(3, -100), (1, 100), (2, 50), (4, 30), (5, -80)]
    assert peak_allocated_bytes(events) == 150
    assert peak_allocated_bytes([]) == 0


@pytest.mark.gpu
def test_cuda_iteration_uses_device_timing_and_allocator_peak():
    job = build_job(zoo_spec("resnet18", batch_size=2), "cuda")
    stats = profile_iteration(job, warmup=2, repeats=3)
    assert stats.outcome == Outcome.ok and stats.iter_time_ms_median > 0
    assert stats.peak_memory_bytes > sum(p.numel() * 4 for p in job.module.parameters())


@pytest.mark.gpu
def test_cuda_out_of_memory_is_recorded():
    job = build_job(user_spec("too_much"), "cuda")
    stats = profile_iteration(job, warmup=1, repeats=2)
    assert stats.outcome == Outcome.oom and "out of memory" in stats.error.lower()


def test_time_budget_cuts_warmup_and_repeats_but_keeps_the_minimums():
    job = build_job(user_spec("sleepy"))  # 30 ms steps
    stats = profile_iteration(job, warmup=10, repeats=50, time_budget_s=0.3)
    assert 2 <= stats.warmup <= 4  # 30 % of the budget is 90 ms: about three 30 ms steps
    assert 3 <= stats.repeats < 10 and len(stats.samples_ms) == stats.repeats
    assert all(t >= 30 for t in stats.samples_ms)
    assert profile_iteration(job, warmup=1, repeats=3, time_budget_s=0.001).repeats == 3  # never fewer than 3
