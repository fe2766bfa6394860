"""The model zoo: architectures built from code or configs, never from downloaded weights.

One table, `ZOO`, maps a name to its family (all variants of one architecture: k-fold evaluation never puts a
family in both train and test), its input kind and a builder; any other image classifier of torchvision or timm
is a zoo model by its library name too (`find_entry`, `perfmodel.jobs.library_models`). Builders import their
library lazily and build under whatever `torch.device` context the caller set (the meta device for graph capture,
a real one for profiling).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.jobs.library_models import library_models
from perfmodel.jobs.spec import TRANSFORMERS_OPTIMIZER, ZooSource


class InputKind(str, Enum):
    custom = "custom"  # the entry's own `make_inputs(module, batch_size, seq_len)`
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
    # InputKind.custom: (module, batch_size, seq_len) -> (args, kwargs), built under the caller's device context
    make_inputs: Callable[[Any, int, int], tuple[tuple, dict]] | None = field(default=None, repr=False)
    # what the model's benchmarks count: `unit` is the item (image, token, mel frame, audio sample, ...) and
    # `items_per_sample(seq_len)` how many one sample of the job's batch holds (1 for image classifiers)
    unit: str = "samples"
    items_per_sample: Callable[[int], float] = field(default=lambda seq_len: 1.0, repr=False)
    # the sequence length the reference implementation trains at (None: the job's seq_len is the only one): for a
    # benchmark that pads each batch to its longest sequence, the padded length the step computes on
    reference_seq_len: int | None = None
    # the share of those items that are real, not padding, in the reference data set's padded batches (benchmarks
    # count real items: tokens, mel frames); 1 where nothing is padded
    real_item_share: float = 1.0
    # the head built when the job names no task (transformers models: `task` of the job spec overrides it)
    default_task: str | None = None
    # the optimizer the reference implementation trains with (a job that names none gets it; None: `sgd`)
    reference_optimizer: str | None = None
    # the PyTorch (major.minor) the reference implementation pins (a job that names none gets it; None: the newest)
    reference_pytorch: str | None = None
    # whether the reference implementation's steps vary from one to the next (`JobSpec.steps_vary`; None: not known)
    reference_steps_vary: bool | None = None
    # what the reference implementation does on the host each step that the graph does not show (an environment
    # stepped on the CPU, ...): its answers say the step is likely host-bound ("" : nothing known)
    host_work: str = ""
    description: str = ""

    def items(self, seq_len: int) -> float:
        """The benchmark's items (real, not padding) in one sample computed at `seq_len`."""
        return float(self.items_per_sample(seq_len)) * self.real_item_share


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


@dataclass(frozen=True)
class _HF:
    """Builder of a transformers zoo model: its config, with the entry's head or the one a job's `task` names."""

    model_type: str
    head: str
    config: dict[str, Any]

    def __call__(self, task: str | None = None) -> Any:
        from perfmodel.jobs.hf import build_hf_model

        return build_hf_model({"model_type": self.model_type, **self.config}, task=task or self.head)


def _hf(model_type: str, head: str, **config: Any) -> _HF:
    return _HF(model_type, head, config)


def build_model(entry: ZooEntry, task: str | None = None) -> Any:
    """Build a zoo entry's module; `task` picks the head of a transformers model and is refused for any other."""
    if task is None:
        return entry.build()
    if not isinstance(entry.build, _HF):
        raise PerfmodelError(f"task: zoo model {entry.name!r} is a {entry.library} model with one head; a task "
                             "applies to transformers zoo models and --hf-config")
    return entry.build(task)


def _dle(factory: str) -> Callable[[], Any]:
    def build() -> Any:
        from perfmodel.jobs import dle

        return getattr(dle, factory)()

    return build


GAVEL_PYTORCH = "1.4"  # the torch Gavel's workloads pin (stanford-futuredata/gavel scheduler/requirements.txt)


def _gavel(factory: str) -> Callable[[], Any]:
    def build() -> Any:
        from perfmodel.jobs import gavel_zoo

        return getattr(gavel_zoo, factory)()

    return build


def _own_inputs(module: Any, batch_size: int, seq_len: int) -> tuple[tuple, dict]:
    """Inputs of a module that builds its own (`example_inputs`, perfmodel.jobs.dle)."""
    return module.example_inputs(batch_size, seq_len)


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
    # BERT's public training runs (NVIDIA's DeepLearningExamples BERT in NGC containers, pre-training and SQuAD)
    # compute attention eagerly (matmul, scale, mask, softmax, dropout, matmul), as do transformers releases before
    # PyTorch 2's fused attention: the zoo's BERT does too. Other transformers entries (and any `hf_config` job) get
    # transformers' default, `sdpa`: one fused kernel on a GPU that has one.
    eager = {"attn_implementation": "eager"}
    hf = [
        ("bert-small", "bert", tok, _hf("bert", cls, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                                        intermediate_size=2048, **eager)),
        ("bert-base", "bert", tok, _hf("bert", cls, **eager)),
        ("bert-large", "bert", tok, _hf("bert", cls, hidden_size=1024, num_hidden_layers=24,
                                        num_attention_heads=16, intermediate_size=4096, **eager)),
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
        # the public configs of the models people fine-tune (their hub repositories' config.json, architecture only)
        ("gpt2-large", "gpt2", tok, _hf("gpt2", clm, n_embd=1280, n_layer=36, n_head=20)),
        ("gpt2-xl", "gpt2", tok, _hf("gpt2", clm, n_embd=1600, n_layer=48, n_head=25)),
        ("opt-1.3b", "opt", tok, _hf("opt", clm, hidden_size=2048, num_hidden_layers=24, ffn_dim=8192,
                                     num_attention_heads=32, word_embed_proj_dim=2048)),
        ("llama-2-7b", "llama", tok, _hf("llama", clm, hidden_size=4096, intermediate_size=11008,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                         vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5)),
        ("llama-2-13b", "llama", tok, _hf("llama", clm, hidden_size=5120, intermediate_size=13824,
                                          num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                                          vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5)),
        ("llama-3-8b", "llama", tok, _hf("llama", clm, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                         vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                                         rope_theta=500000.0)),
        ("mistral-7b", "mistral", tok, _hf("mistral", clm, hidden_size=4096, intermediate_size=14336,
                                           num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                           vocab_size=32000, max_position_embeddings=32768, sliding_window=4096)),
        ("t5-small", "t5", s2s, _hf("t5", s2slm, d_model=512, d_ff=2048, num_layers=6, num_heads=8)),
        ("t5-base", "t5", s2s, _hf("t5", s2slm, d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
        ("t5-large", "t5", s2s, _hf("t5", s2slm, d_model=1024, d_ff=4096, num_layers=24, num_heads=16)),
        ("bart-base", "bart", s2s, _hf("bart", s2slm, d_model=768, encoder_layers=6, decoder_layers=6,
                                       encoder_attention_heads=12, decoder_attention_heads=12,
                                       encoder_ffn_dim=3072, decoder_ffn_dim=3072)),
    ]
    # The encoders' reference fine-tuning and pre-training (Google's and NVIDIA's BERT, transformers' run_glue and
    # run_qa, which pad to max_seq_length) feed pre-tokenized features of one fixed length, read from memory: their
    # steps do not vary (`reference_steps_vary`). Decoder and seq2seq fine-tuning often pads each batch to its
    # longest sequence (and pre-training packs to a fixed one): not known.
    fixed_length = {"bert", "roberta", "albert", "electra"}
    # the eager BERTs stand for NVIDIA's BERT, whose mixed precision is apex AMP O2 (`fp16-master`), not autocast
    nvidia_bert = ("BERT as NVIDIA's DeepLearningExamples trains it (eager attention); its mixed precision there is "
                   "apex AMP O2 stepping apex's FusedAdam: ask `fp16-master` with `fused_optimizer` for that recipe, "
                   "`amp` for torch.autocast")
    entries += [ZooEntry(n, f, "transformers", k, b, default_task=b.head, reference_optimizer=TRANSFORMERS_OPTIMIZER,
                         reference_steps_vary=False if f in fixed_length else None,
                         description=nvidia_bert if n in ("bert-small", "bert-base", "bert-large") else "")
                for n, f, k, b in hf]
    entries += [
        ZooEntry("lstm-lm", "rnn", "perfmodel", InputKind.rnn_tokens, _rnn_lm("lstm")),
        ZooEntry("gru-lm", "rnn", "perfmodel", InputKind.rnn_tokens, _rnn_lm("gru")),
        ZooEntry("mlp-recommender", "recommender", "perfmodel", InputKind.recsys, _recommender),
    ]
    # NVIDIA DeepLearningExamples models of Lambda's GPU benchmark (perfmodel.jobs.dle): seq_len is what the
    # benchmark's unit counts per sample (tokens, mel frames, audio samples)
    # (reference_steps_vary: SSD's DALI pipeline decodes and augments on the GPU at a fixed 300x300, NCF's data set
    # and Transformer-XL's corpus sit in GPU memory, their batches fixed in shape; GNMT's bucketed sentences,
    # Tacotron 2's utterances and Mask R-CNN's images vary in size, and Tacotron 2's, WaveGlow's and Mask R-CNN's
    # inputs are read and decoded on the CPU by DataLoader workers every step)
    own, per_item = InputKind.custom, lambda seq_len: float(seq_len)
    entries += [
        ZooEntry("ssd300", "ssd", "perfmodel", own, _dle("SSD300"), make_inputs=_own_inputs, unit="images",
                 reference_optimizer="sgd", reference_steps_vary=False,
                 description="DLE SSD300 v1.1: ResNet-50 to layer3 (stride 1), 5 extra blocks, 8732 default boxes, "
                             "81 COCO classes, 300x300; smooth-L1 + hard-negative-mined cross-entropy loss; its mixed "
                             "precision: apex AMP O2 (`fp16-master`) in NGC 20.xx-21.xx, torch.autocast (`amp`) since"),
        # DLE counts real source tokens + target tokens - 1 (the decoder reads target[:-1]) per sentence pair and
        # computes on padded ones: its bucketing sampler (5 buckets of width 10 over max(src, tgt) length, pairs
        # kept at <= 50 tokens with BOS/EOS) pads each side of a batch to the top of its bucket, ~5 tokens above the
        # real mean. Lambda's data is News Commentary v11 (its patched `wmt16_en_de.sh`): ~50 real tokens per pair,
        # padded to ~32 a side, so 50 of the 63 computed tokens are real.
        ZooEntry("gnmt", "gnmt", "perfmodel", own, _dle("GNMT"), make_inputs=_own_inputs, unit="tokens",
                 items_per_sample=lambda seq_len: 2.0 * seq_len - 1, reference_seq_len=32, real_item_share=50 / 63,
                 reference_optimizer="adam", reference_steps_vary=True,
                 description="DLE GNMT v2: vocab 32320, 4+4 LSTM layers of 1024 (first encoder layer bidirectional), "
                             "normalized Bahdanau attention fed to all decoder layers, label-smoothed loss; seq_len = "
                             "tokens a side the batch is padded to (32, of which ~25 real); its mixed precision: "
                             "apex AMP O2 (`fp16-master`)"),
        ZooEntry("ncf", "ncf", "perfmodel", own, _dle("NeuMF"), make_inputs=_own_inputs, unit="samples",
                 reference_optimizer="adam", reference_steps_vary=False,
                 description="DLE NCF NeuMF on MovieLens-20m: 138493 users, 26744 items, GMF 64 + MLP "
                             "[256, 256, 128, 64], BCE-with-logits; a sample is one user-item pair; its mixed "
                             "precision: apex AMP O2 (`fp16-master`)"),
        # DLE pads every batch to its longest utterance (random batches, no bucketing) and counts the real mel
        # frames: LJSpeech's clips average 566 frames, the longest 870, so a batch of 16-336 clips computes ~850
        ZooEntry("tacotron2", "tacotron2", "perfmodel", own, _dle("Tacotron2"), make_inputs=_own_inputs,
                 unit="mel frames", items_per_sample=per_item, reference_seq_len=850, real_item_share=566 / 850,
                 reference_optimizer="adam", reference_steps_vary=True,
                 description="DLE Tacotron 2: 512-d conv+BiLSTM encoder, location-sensitive attention, 2 x 1024 "
                             "LSTM decoder looped per mel frame, 5-conv postnet; seq_len = mel frames the batch is "
                             "padded to (LJSpeech: 850, of which 566 real)"),
        ZooEntry("waveglow", "waveglow", "perfmodel", own, _dle("WaveGlow"), make_inputs=_own_inputs,
                 unit="audio samples", items_per_sample=per_item, reference_seq_len=8000,
                 reference_optimizer="adam", reference_steps_vary=True,
                 description="DLE WaveGlow: 12 flows, groups of 8, WN 8 layers x 512, 80 mels upsampled x256; "
                             "NLL loss (sigma 1); seq_len = audio samples per segment"),
        ZooEntry("transformer-xl-base", "transformer-xl", "perfmodel", own, _dle("transformer_xl_base"),
                 make_inputs=_own_inputs, unit="tokens", items_per_sample=per_item, reference_seq_len=192,
                 reference_optimizer="adam", reference_steps_vary=False,
                 description="DLE Transformer-XL on WikiText-103 as Lambda ran it: 16 layers, d 512, 8 x 64 heads, "
                             "full tied softmax over 267735 words; tgt_len = mem_len = seq_len; its mixed precision: "
                             "apex AMP O2 (`fp16-master`)"),
        ZooEntry("transformer-xl-large", "transformer-xl", "perfmodel", own, _dle("transformer_xl_large"),
                 make_inputs=_own_inputs, unit="tokens", items_per_sample=per_item, reference_seq_len=256,
                 reference_optimizer="adam", reference_steps_vary=False,
                 description="DLE Transformer-XL on WikiText-103 as Lambda ran it: 18 layers, d 1024, 16 x 64 heads, "
                             "full tied softmax over 267735 words; tgt_len = mem_len = seq_len; its mixed precision: "
                             "apex AMP O2 (`fp16-master`)"),
        ZooEntry("maskrcnn", "maskrcnn", "perfmodel", own, _dle("MaskRCNN"), make_inputs=_own_inputs,
                 unit="images",
                 reference_optimizer="sgd", reference_steps_vary=True,
                 description="Mask R-CNN R-50-FPN 1x (DLE maskrcnn_benchmark), 81 classes, 800x1344; proposal "
                             "selection, NMS and RoI sampling as static equivalents with fixed counts"),
    ]
    # Gavel's seven job types (perfmodel.jobs.gavel_zoo; ../shared/datasets/gavel/PROVENANCE.md), loss in the graph.
    # Gavel counts steps: a sample is what one step's batch holds one of. A job that names no optimizer gets the one
    # Gavel trains the model with (A3C's shared Adam with amsgrad and LM's plain SGD priced as Adam and SGD), and one
    # that names no PyTorch version Gavel's: its workloads pin torch 1.4.0 (scheduler/requirements.txt). Their steps
    # vary (reference_steps_vary) but the LM's: CIFAR-10's, ImageNet's and CycleGAN's images are decoded and augmented
    # by DataLoader workers, the Transformer's sentence batches and the Recommendation's item sets vary in size, A3C
    # steps its emulator on the CPU; the LM's corpus sits on the GPU and every batch is bptt tokens long.
    entries += [
        ZooEntry("gavel-resnet18", "resnet", "perfmodel", own, _gavel("CifarResNet18"), make_inputs=_own_inputs,
                 unit="images",
                 reference_optimizer="sgd", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 description="Gavel ResNet-18: CIFAR-10 ResNet-18 (kuangliu: 3x3 stem at stride 1, no max-pool, "
                             "stages 64-512, avgpool, linear 10), 32x32, cross-entropy; Gavel: SGD momentum 0.9"),
        ZooEntry("gavel-resnet50", "resnet", "perfmodel", own, _gavel("ImageNetResNet50"), make_inputs=_own_inputs,
                 unit="images",
                 reference_optimizer="sgd", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 description="Gavel ResNet-50: torchvision ResNet-50, ImageNet 224x224, cross-entropy; Gavel: SGD "
                             "momentum 0.9"),
        ZooEntry("gavel-transformer", "transformer-nmt", "perfmodel", own, _gavel("Transformer"),
                 make_inputs=_own_inputs, unit="sentence pairs", reference_seq_len=27,
                 reference_optimizer="adam", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 description="Gavel Transformer (jadore801120) on Multi30k en-de: 6+6 layers, d 512, inner 2048, 8 "
                             "heads, vocab 2911/3149, target projection shared with the target embedding, summed "
                             "cross-entropy (no label smoothing: Gavel omits the flag); seq_len = padded sentence "
                             "length (BOS/EOS included; 27 is an estimate at batch 64); Gavel: Adam"),
        ZooEntry("gavel-lm", "rnn", "perfmodel", own, _gavel("WordLanguageModel"), make_inputs=_own_inputs,
                 unit="tokens", items_per_sample=per_item, reference_seq_len=35,
                 reference_optimizer="sgd", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=False,
                 description="Gavel LM: PyTorch word_language_model on WikiText-2, 2-layer LSTM 200/200, vocab "
                             "33278, untied (Gavel omits --tied), dropout 0.2, cross-entropy; seq_len = bptt; Gavel: "
                             "plain SGD with gradient clipping"),
        ZooEntry("gavel-recommendation", "recoder", "perfmodel", own, _gavel("DynamicAutoencoder"),
                 make_inputs=_own_inputs, unit="users",
                 reference_optimizer="adam", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 description="Gavel Recommendation: recoder DynamicAutoencoder on MovieLens-20M, 20108 items -> 200 "
                             "(tanh) -> items, input noise 0.5, BCE-with-logits; input width = all 20108 items (the "
                             "static bound of the batch's item union); a sample is one user; Gavel: Adam"),
        ZooEntry("gavel-cyclegan", "cyclegan", "perfmodel", own, _gavel("CycleGAN"), make_inputs=_own_inputs,
                 unit="image pairs",
                 reference_optimizer="adam", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 description="Gavel CycleGAN (PyTorch-GAN) 256x256: two 9-block ResNet generators, two PatchGAN "
                             "discriminators; generator (adversarial + cycle + identity) and discriminator losses "
                             "summed in one graph: 6 generator and 6 discriminator passes; Gavel: batch 1, Adam"),
        ZooEntry("gavel-a3c", "a3c", "perfmodel", own, _gavel("A3C"), make_inputs=_own_inputs, unit="rollouts",
                 reference_seq_len=20,
                 reference_optimizer="adam", reference_pytorch=GAVEL_PYTORCH, reference_steps_vary=True,
                 host_work="steps the Atari emulator on the CPU between the rollout's forwards, runs Adam on the CPU "
                           "copy of the shared model and copies weights and gradients between it and the GPU",
                 description="Gavel A3C (rl_a3c_pytorch) on Pong: 4 convs + max-pools on 1x80x80, LSTM cell 1024 -> "
                             "512, actor (6) and critic heads; a seq_len-step rollout (20 in Gavel) + bootstrap "
                             "value and the A3C loss (GAE) per sample; batch = rollouts stacked (Gavel: 1 per worker, "
                             "4 workers); Gavel: shared Adam (amsgrad)"),
    ]
    return entries


ZOO: dict[str, ZooEntry] = {e.name: e for e in _entries()}


def find_entry(name: str) -> ZooEntry | None:
    """The zoo entry called `name`: the table's (`ZOO`), else an image classifier torchvision or timm builds by that
    name (`perfmodel.jobs.library_models`); None if neither has it. Reads no library."""
    return ZOO.get(name) or _library_entry(name)


@functools.lru_cache(maxsize=4096)  # bounded: a stream of unknown names asked of a server cannot grow it
def _library_entry(name: str) -> ZooEntry | None:
    found = library_models().get(name)
    if found is None:
        return None
    build = _torchvision(name) if found.library == "torchvision" else _timm(name)
    return ZooEntry(name, found.family, found.library, InputKind.image, build, image_size=found.image_size,
                    builds_on_meta=found.builds_on_meta,
                    description=f"{found.library}'s {name} image classifier ({found.family}), built by name")


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called `name` (`find_entry`); an unknown name raises an error listing the closest names."""
    entry = find_entry(name)
    if entry is None:
        raise UnknownNameError("zoo model", name, {*ZOO, *library_models()})
    return entry


def items_of(spec: Any) -> tuple[str, float]:
    """(unit, items per sample) of a job: its zoo entry's benchmark unit at the job's sequence length, else one
    sample per sample."""
    source = getattr(spec, "source", None)
    entry = find_entry(source.name) if isinstance(source, ZooSource) else None
    if entry is not None:
        return entry.unit, entry.items(spec.seq_len)
    return "samples", 1.0
