"""The zoo's transformers entries are the public models they are named after: built on the meta device from the
architecture of their hub config, they hold the published parameter counts (tied embeddings counted once)."""

from __future__ import annotations

import pytest
import torch

from perfmodel.jobs.zoo import ZOO, build_model

# the parameter counts their model cards and papers publish
PUBLISHED_PARAMS = {"gpt2": 124.4e6, "gpt2-medium": 354.8e6, "gpt2-large": 774.0e6, "gpt2-xl": 1.558e9,
                    "opt-125m": 125.2e6, "opt-350m": 331.2e6, "opt-1.3b": 1.316e9, "llama-2-7b": 6.738e9,
                    "llama-2-13b": 13.016e9, "llama-3-8b": 8.030e9, "mistral-7b": 7.242e9, "t5-small": 60.5e6,
                    "t5-base": 222.9e6, "t5-large": 737.7e6, "bert-base": 109.5e6, "bert-large": 335.1e6}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_a_transformers_entry_has_its_published_parameter_count(name):
    entry = ZOO[name]
    with torch.device("meta"):
        module = build_model(entry, task="base" if entry.family == "bert" else None)
    unique = {id(p): p for p in module.parameters()}.values()  # a tied embedding and head count once
    assert sum(p.numel() for p in unique) == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005)
