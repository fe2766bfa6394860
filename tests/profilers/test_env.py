import platform

import pytest
import torch

from perfmodel import __version__
from perfmodel.profilers.env import capture_environment, cpu_model_name


def test_cpu_environment_is_populated():
    env = capture_environment("cpu")
    assert (env.device, env.device_type, env.device_count) == ("cpu", "cpu", 1)
    assert env.device_name == env.cpu_model == cpu_model_name() and env.cpu_model
    assert env.cpu_cores >= 1 and env.threads == torch.get_num_threads()
    assert env.host and env.os and env.python_version == platform.python_version()
    assert env.torch_version == torch.__version__ and env.perfmodel_version == __version__
    assert env.onnxruntime_version  # a dependency of perfmodel
    assert env.cuda_version == torch.version.cuda and env.hip_version == torch.version.hip
    assert env.driver_version is None  # only looked up for GPUs
    assert env.captured_at.tzinfo is not None


@pytest.mark.gpu
def test_gpu_environment_names_the_device_as_torch_does():
    env = capture_environment("cuda:0")
    assert env.device == "cuda:0" and env.device_type == "cuda"
    assert env.device_name == torch.cuda.get_device_name(0)
    assert env.device_count == torch.cuda.device_count()
    assert env.cuda_version or env.hip_version
