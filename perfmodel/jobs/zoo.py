"""The model zoo: architectures built from code or configs, never from downloaded weights.

One table, `ZOO`, maps a name to its family (all variants of one architecture: k-fold evaluation never puts a
family in both train and test), its input kind and a builder. Builders import their library lazily and build under
whatever `torch.device` context the caller set (the meta device for graph capture, a real one for profiling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import UnknownNameError


class InputKind(str, Enum):
    image = "image"  # float (B, 3, S, S)
    tokens = "tokens"  # input_ids (B, seq_len)
    seq2seq = "seq2seq"  # input_ids and decoder_input_ids (B, seq_len)
    rnn_tokens = "rnn_tokens"  # token ids (B, seq_len) into a recurrent LM
    recsys = "recsys"  # dense (B, 13) floats and sparse (B, 26) ids


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    library: str  # torchvision, timm, transformers, perfmodel
    inputs: InputKind
    build: Callable[[], Any] = field(repr=False)
    image_size: int = 224
    # False where the constructor computes with tensors (regnet's width schedule): build on the CPU, then move.
    builds_on_meta: bool = True


# --- builders ---------------------------------------------------------------------------------------------------


def _torchvision(name: str, **kwargs: Any) -> Callable[[], Any]:
    def build() -> Any:
        ensure_torchvision()
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kwargs)

    return build


def _timm(name: str) -> Callable[[], Any]:
    def build() -> Any:
        ensure_torchvision()
        import timm

        return timm.create_model(name, pretrained=False)

    return build


def _hf(model_type: str, head: str, **config: Any) -> Callable[[], Any]:
    def build() -> Any:
        from perfmodel.jobs.hf import build_hf_model

        return build_hf_model({"model_type": model_type, **config}, task=head)

    return build


def _rnn_lm(cell: str) -> Callable[[], Any]:
    def build() -> Any:
        from perfmodel.jobs.custom import RecurrentLM

        return RecurrentLM(cell=cell)

    return build


def _recommender() -> Any:
    from perfmodel.jobs.custom import MLPRecommender

    return MLPRecommender()


def _entries() -> list[ZooEntry]:
    img, tok, s2s = InputKind.image, InputKind.tokens, InputKind.seq2seq
    tv = [
        ("resnet18", "resnet"), ("resnet34", "resnet"), ("resnet50", "resnet"), ("resnet101", "resnet"),
        ("resnet152", "resnet"), ("resnext50_32x4d", "resnet"), ("wide_resnet50_2", "resnet"),
        ("vgg11", "vgg"), ("vgg16", "vgg"), ("vgg19", "vgg"),
        ("alexnet", "alexnet"), ("squeezenet1_1", "squeezenet"),
        ("mobilenet_v2", "mobilenet"), ("mobilenet_v3_small", "mobilenet"), ("mobilenet_v3_large", "mobilenet"),
        ("efficientnet_b0", "efficientnet"), ("efficientnet_b1", "efficientnet"), ("efficientnet_b3", "efficientnet"),
        ("densenet121", "densenet"), ("densenet169", "densenet"),
        ("shufflenet_v2_x1_0", "shufflenet"), ("mnasnet1_0", "mnasnet"),
        ("regnet_y_400mf", "regnet"), ("regnet_x_1_6gf", "regnet"),
    ]
    entries = [ZooEntry(n, f, "torchvision", img, _torchvision(n), builds_on_meta=f != "regnet") for n, f in tv]
    entries += [
        ZooEntry("googlenet", "inception", "torchvision", img,
                 _torchvision("googlenet", aux_logits=False, init_weights=False)),
        ZooEntry("inception_v3", "inception", "torchvision", img,
                 _torchvision("inception_v3", aux_logits=False, init_weights=False), image_size=299),
    ]
    timm_models = [
        ("vit_tiny_patch16_224", "vit"), ("vit_small_patch16_224", "vit"), ("vit_base_patch16_224", "vit"),
        ("deit_small_patch16_224", "vit"), ("convnext_atto", "convnext"), ("convnext_tiny", "convnext"),
        ("swin_tiny_patch4_window7_224", "swin"), ("mixer_s16_224", "mlp-mixer"), ("resmlp_12_224", "mlp-mixer"),
        ("poolformer_s12", "poolformer"),
    ]
    entries += [ZooEntry(n, f, "timm", img, _timm(n)) for n, f in timm_models]
    cls, clm, s2slm = "sequence-classification", "causal-lm", "seq2seq-lm"
    hf = [
        ("bert-small", "bert", tok, _hf("bert", cls, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                                        intermediate_size=2048)),
        ("bert-base", "bert", tok, _hf("bert", cls)),
        ("bert-large", "bert", tok, _hf("bert", cls, hidden_size=1024, num_hidden_layers=24,
                                        num_attention_heads=16, intermediate_size=4096)),
        ("distilbert-base", "bert", tok, _hf("distilbert", cls)),
        ("roberta-base", "roberta", tok, _hf("roberta", cls, vocab_size=50265, max_position_embeddings=514,
                                             type_vocab_size=1, pad_token_id=1)),
        ("albert-base", "albert", tok, _hf("albert", cls, embedding_size=128, hidden_size=768,
                                           num_attention_heads=12, intermediate_size=3072)),
        ("electra-small", "electra", tok, _hf("electra", cls)),
        ("gpt2", "gpt2", tok, _hf("gpt2", clm)),
        ("gpt2-medium", "gpt2", tok, _hf("gpt2", clm, n_embd=1024, n_layer=24, n_head=16)),
        ("opt-125m", "opt", tok, _hf("opt", clm)),
        ("opt-350m", "opt", tok, _hf("opt", clm, hidden_size=1024, num_hidden_layers=24, ffn_dim=4096,
                                     num_attention_heads=16, word_embed_proj_dim=512, do_layer_norm_before=False)),
        ("llama-160m", "llama", tok, _hf("llama", clm, hidden_size=768, intermediate_size=3072,
                                         num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                                         vocab_size=32000, max_position_embeddings=2048)),
        ("t5-small", "t5", s2s, _hf("t5", s2slm, d_model=512, d_ff=2048, num_layers=6, num_heads=8)),
        ("t5-base", "t5", s2s, _hf("t5", s2slm, d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
        ("bart-base", "bart", s2s, _hf("bart", s2slm, d_model=768, encoder_layers=6, decoder_layers=6,
                                       encoder_attention_heads=12, decoder_attention_heads=12,
                                       encoder_ffn_dim=3072, decoder_ffn_dim=3072)),
    ]
    entries += [ZooEntry(n, f, "transformers", k, b) for n, f, k, b in hf]
    entries += [
        ZooEntry("lstm-lm", "rnn", "perfmodel", InputKind.rnn_tokens, _rnn_lm("lstm")),
        ZooEntry("gru-lm", "rnn", "perfmodel", InputKind.rnn_tokens, _rnn_lm("gru")),
        ZooEntry("mlp-recommender", "recommender", "perfmodel", InputKind.recsys, _recommender),
    ]
    return entries


ZOO: dict[str, ZooEntry] = {e.name: e for e in _entries()}


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called `name`; an unknown name raises an error listing the closest names."""
    try:
        return ZOO[name]
    except KeyError:
        raise UnknownNameError("zoo model", name, ZOO) from None
