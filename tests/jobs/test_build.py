import textwrap

import pytest
import torch

from perfmodel.core.errors import DeviceError, JobLoadError, PerfmodelError
from perfmodel.jobs.build import build_job, first_tensor, mean_loss
from perfmodel.jobs.spec import JobSpec, ZooSource


def zoo(name, **kw):
    return JobSpec(source=ZooSource(name=name), **{"batch_size": 2, **kw})


@pytest.mark.parametrize("name", ["resnet18", "vit_tiny_patch16_224", "bert-small", "t5-small", "lstm-lm",
                                  "mlp-recommender", "regnet_y_400mf", "gpt2"])
def test_meta_build_allocates_nothing_and_has_inputs(name):
    job = build_job(zoo(name, seq_len=16), "meta")
    assert all(p.device.type == "meta" for p in job.module.parameters())
    inputs = list(job.args) + list(job.kwargs.values())
    assert inputs and all(t.device.type == "meta" and t.shape[0] == 2 for t in inputs)
    assert job.module.training


def test_cpu_build_runs_a_training_step_and_inference_mode():
    job = build_job(zoo("bert-small", seq_len=16), "cpu")
    loss = job.loss_fn(job.forward())
    loss.backward()
    assert loss.ndim == 0 and any(p.grad is not None for p in job.module.parameters())
    assert not build_job(zoo("bert-small", seq_len=16, mode="inference"), "cpu").module.training


def test_precision_casts_weights_and_float_inputs():
    job = build_job(zoo("resnet18", precision="bf16"), "meta")
    assert next(job.module.parameters()).dtype == torch.bfloat16
    assert job.args[0].dtype == torch.bfloat16
    tokens = build_job(zoo("bert-small", precision="fp16"), "meta")
    assert tokens.kwargs["input_ids"].dtype == torch.int64  # ids stay integers


def test_seq_len_beyond_model_limit_is_a_user_error():
    with pytest.raises(PerfmodelError, match="max_position_embeddings"):
        build_job(zoo("bert-small", seq_len=4096), "meta")


def test_cuda_without_gpu_is_a_device_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceError):
        build_job(zoo("resnet18"), "cuda")


def test_hf_config_with_head_from_architectures():
    spec = JobSpec.from_options(hf_config={"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                           "architectures": ["GPT2LMHeadModel"]}, batch_size=1, seq_len=8)
    job = build_job(spec, "cpu")  # GPT-2's mask code calls .item(), which meta tensors cannot answer eagerly
    assert type(job.module).__name__ == "GPT2LMHeadModel"
    assert first_tensor(job.forward()).shape == (1, 8, 50257)


def test_user_module_with_and_without_loss(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent("""
        import torch
        def plain(batch_size):
            return torch.nn.Linear(4, 3), torch.randn(batch_size, 4)
        def with_loss(batch_size):
            return torch.nn.Linear(4, 3), (torch.randn(batch_size, 4),), lambda out: out.pow(2).sum()
        def broken(batch_size):
            raise RuntimeError("boom")
    """))
    plain = build_job(JobSpec.from_options(module=f"{path}:plain", batch_size=5), "cpu")
    assert plain.forward().shape == (5, 3) and plain.loss_fn is mean_loss
    custom = build_job(JobSpec.from_options(module=f"{path}:with_loss", batch_size=5), "cpu")
    out = custom.forward()
    assert torch.equal(custom.loss_fn(out), out.pow(2).sum())
    with pytest.raises(JobLoadError, match="boom"):
        build_job(JobSpec.from_options(module=f"{path}:broken", batch_size=1), "cpu")
    with pytest.raises(JobLoadError) as info:
        build_job(JobSpec.from_options(module=f"{path}:missing", batch_size=1), "cpu")
    assert str(info.value) == (f"{path} defines no 'missing'; the functions and classes it defines: plain, "
                               "with_loss, broken")
    with pytest.raises(JobLoadError, match="not found"):
        build_job(JobSpec.from_options(module=f"{tmp_path}/nope.py:f", batch_size=1), "cpu")


def test_a_channels_last_job_builds_its_weights_and_images_channels_last():
    """As a channels-last training script converts them: the 4-D weights and the image batch; a plain job keeps
    PyTorch's default layout."""
    import torch

    plain = build_job(JobSpec.from_options(zoo="resnet18", batch_size=2), "meta")
    converted = build_job(JobSpec.from_options(zoo="resnet18", batch_size=2, channels_last=True), "meta")
    assert converted.args[0].is_contiguous(memory_format=torch.channels_last)
    assert not plain.args[0].is_contiguous(memory_format=torch.channels_last)
    weights = [p for p in converted.module.parameters() if p.dim() == 4]
    assert weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
