"""Hugging Face models from a config dict, with the task head, without downloading anything."""

from __future__ import annotations

from typing import Any

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import JobLoadError, UnknownNameError

# task -> transformers Auto class
TASK_CLASSES = {
    "base": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "question-answering": "AutoModelForQuestionAnswering",  # span start/end logits (SQuAD fine-tuning)
}


def build_hf_model(config: dict[str, Any], task: str | None = None) -> Any:
    """Build the model a config describes. The head is `task`, else the config's first `architectures` entry, else
    the base model. Caching is off (graph capture needs plain tensor outputs)."""
    ensure_torchvision()
    import transformers

    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise JobLoadError("HF config has no 'model_type'")
    architectures = cfg.pop("architectures", None) or []
    known = transformers.CONFIG_MAPPING.keys()
    if model_type not in known:
        raise UnknownNameError("HF config model_type", str(model_type), known)
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as exc:
        raise JobLoadError(f"HF config not loadable: {str(exc)[:500]}") from None
    hf_config.use_cache = False
    if task is not None:
        if task not in TASK_CLASSES:
            raise UnknownNameError("HF task", task, TASK_CLASSES)
        model_class = getattr(transformers, TASK_CLASSES[task])
    elif architectures and hasattr(transformers, architectures[0]):
        model_class = getattr(transformers, architectures[0])
    else:
        model_class = transformers.AutoModel
    try:
        if model_class.__name__.startswith("AutoModel"):
            return model_class.from_config(hf_config)
        return model_class(hf_config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise JobLoadError(f"cannot build {model_class.__name__} for model_type {model_type!r}: {exc}") from None
