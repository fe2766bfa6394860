import subprocess
import sys

import pytest


@pytest.mark.slow  # imports the model libraries in a fresh interpreter
def test_torchvision_timm_transformers_import_after_ensure_torchvision():
    # A fresh interpreter: the state of this test process must not hide an import failure.
    code = (
        "from perfmodel.compat import ensure_torchvision\n"
        "state = ensure_torchvision()\n"
        "assert ensure_torchvision() == state\n"
        "import torch, torchvision, timm, transformers\n"
        "from transformers import BertModel\n"
        "m = torchvision.models.resnet18()\n"
        "assert m(torch.randn(1, 3, 64, 64)).shape == (1, 1000)\n"
        "print(state)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    state = result.stdout.strip().splitlines()[-1]
    assert state in ("native", "fallback")
    import torch

    if torch.version.cuda is None:  # CPU torch next to PyPI's CUDA torchvision: the fallback is what makes it work
        assert state in ("fallback", "native")
