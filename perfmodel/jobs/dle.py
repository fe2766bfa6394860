"""The NVIDIA DeepLearningExamples (DLE) PyTorch training models of Lambda's GPU benchmark, in plain `torch.nn`.

Lambda's benchmark (../shared/datasets/lambda/PROVENANCE.md) trained eight DLE models: SSD300 v1.1, GNMT v2, NCF
(NeuMF), Tacotron 2, WaveGlow, Transformer-XL base and large, and Mask R-CNN R-50-FPN (maskrcnn_benchmark). Each
class below rebuilds one with the layers, sizes and defaults of the DLE reference implementation (named in its
docstring) and computes the real training loss inside `forward`, so that the graph `torch.export` captures from
`module(*args, **kwargs)` on the meta device holds the whole training step's forward, loss included.

Rules every model here follows:

- Every input's leading dimension is the batch (perfmodel reads an IR's batch there); models that DLE runs
  time-major (GNMT, Transformer-XL) transpose inside `forward`, as a view.
- `example_inputs(batch_size, seq_len)` builds `(args, kwargs)` under the caller's device context; `seq_len` means
  what the benchmark's unit counts (tokens, mel frames, audio samples; images ignore it).
- No padding: every sample of a batch has the full length (DLE's packed sequences and length masks then change
  nothing, so they are left out where they are data-dependent and kept where they are one static op).
- What DLE does with data-dependent shapes (Mask R-CNN's proposal selection, NMS and sampling, an adaptive
  softmax's per-cluster token selection) runs as a static equivalent doing the same work with fixed counts, in
  the spirit of `perfmodel.graph.moe`'s balanced routing; each model's docstring says which.
- LSTM cells (Tacotron 2's decoder) are written as their two GEMMs and gate arithmetic (`LSTMCell`): that is what
  PyTorch runs, and it keeps their FLOPs in the graph (`aten.lstm_cell` has no FLOP formula in
  `perfmodel.graph.flops`; `aten.lstm`, used for whole sequences, has one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import PerfmodelError

Inputs = tuple[tuple, dict]


def _need(seq_len: int, minimum: int, model: str, what: str) -> None:
    if seq_len < minimum:
        raise PerfmodelError(f"{model} needs seq_len >= {minimum} ({what}), got {seq_len}")


def _smooth_l1(x: torch.Tensor, y: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Element-wise smooth L1 (Huber with threshold `beta`), unreduced."""
    return F.smooth_l1_loss(x, y, reduction="none", beta=beta)


class LSTMCell(nn.LSTMCell):
    """`nn.LSTMCell` (same parameters) computed as PyTorch computes it: one GEMM for the input, one for the hidden
    state, then the i, f, g, o gates. Written out so that the two GEMMs appear in the captured graph as `linear`."""

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]  # type: ignore[override]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = state
        gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c


# --- SSD300 ------------------------------------------------------------------------------------------------------


def _ssd300_default_boxes() -> torch.Tensor:
    """DLE `dboxes300_coco()`: 8732 default boxes (cx, cy, w, h), relative to the 300x300 image, as (1, 4, 8732)."""
    fig_size, feat_size, steps = 300, (38, 19, 10, 5, 3, 1), (8, 16, 32, 64, 100, 300)
    scales, aspect_ratios = (21, 45, 99, 153, 207, 261, 315), ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
    boxes = []
    for idx, size in enumerate(feat_size):
        fk = fig_size / steps[idx]
        sk1, sk2 = scales[idx] / fig_size, scales[idx + 1] / fig_size
        sk3 = math.sqrt(sk1 * sk2)
        sizes = [(sk1, sk1), (sk3, sk3)]
        for alpha in aspect_ratios[idx]:
            w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
            sizes += [(w, h), (h, w)]
        for w, h in sizes:
            for i, j in itertools.product(range(size), repeat=2):
                boxes.append((min(1.0, (j + 0.5) / fk), min(1.0, (i + 0.5) / fk), min(1.0, w), min(1.0, h)))
    return torch.tensor(boxes, dtype=torch.float32).t().unsqueeze(0)


class SSD300(nn.Module):
    """DLE SSD300 v1.1 (PyTorch/Detection/SSD, `ssd/model.py`), as Lambda ran it (`backbone: resnet50`, 300x300).

    - Backbone: torchvision ResNet-50 up to layer3 (`children()[:7]`), the first layer3 block with stride 1 (DLE
      sets `conv1`, `conv2` and the downsample conv to stride 1): a 38x38x1024 map at 300x300.
    - Extra layers: five blocks (1x1 conv to 256/256/128/128/128, BN, ReLU, 3x3 conv, BN, ReLU; stride 2 and
      padding 1 for the first three, no padding after), giving maps 19, 10, 5, 3, 1 with 512, 512, 256, 256, 256
      channels.
    - Heads: one 3x3 conv per map for locations (4 x defaults) and one for confidences (81 COCO classes x
      defaults), 4, 6, 6, 6, 4, 4 defaults per cell: 8732 default boxes.
    - Loss (DLE `ssd/utils.py` `Loss`): smooth L1 over the positives' encoded offsets (scale_xy 0.1, scale_wh 0.2)
      plus cross entropy with hard negative mining: negatives ranked by a sort of their per-box loss and a sort of
      those ranks, three negatives per positive, normalised per image by its positive count. DLE's mining is
      already static apart from one boolean-mask assignment (`con_neg[mask] = 0`), written here as
      `torch.where` (the same work).

    Inputs: images (B, 3, 300, 300), encoded target boxes (B, 8732, 4) (the data loader's encoder output, xywh)
    and target labels (B, 8732). Training needs a batch of 2 or more, as in DLE: batch norm of the last, 1x1 map.
    """

    dboxes: torch.Tensor
    LABEL_NUM = 81
    NUM_DEFAULTS = (4, 6, 6, 6, 4, 4)
    OUT_CHANNELS = (1024, 512, 512, 256, 256, 256)
    N_BOXES = 8732

    def __init__(self) -> None:
        super().__init__()
        ensure_torchvision()
        import torchvision

        backbone = torchvision.models.resnet50(weights=None)
        block: Any = backbone.layer3[0]
        block.conv1.stride = (1, 1)
        block.conv2.stride = (1, 1)
        block.downsample[0].stride = (1, 1)
        self.feature_extractor = nn.Sequential(*list(backbone.children())[:7])
        blocks = []
        channels = (256, 256, 128, 128, 128)
        for i, (n_in, n_out, mid) in enumerate(zip(self.OUT_CHANNELS[:-1], self.OUT_CHANNELS[1:], channels)):
            stride, padding = (2, 1) if i < 3 else (1, 0)
            blocks.append(nn.Sequential(
                nn.Conv2d(n_in, mid, kernel_size=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, n_out, kernel_size=3, padding=padding, stride=stride, bias=False),
                nn.BatchNorm2d(n_out), nn.ReLU(inplace=True)))
        self.additional_blocks = nn.ModuleList(blocks)
        self.loc = nn.ModuleList(nn.Conv2d(c, nd * 4, kernel_size=3, padding=1)
                                 for nd, c in zip(self.NUM_DEFAULTS, self.OUT_CHANNELS))
        self.conf = nn.ModuleList(nn.Conv2d(c, nd * self.LABEL_NUM, kernel_size=3, padding=1)
                                  for nd, c in zip(self.NUM_DEFAULTS, self.OUT_CHANNELS))
        self.register_buffer("dboxes", _ssd300_default_boxes(), persistent=False)

    def _loc_vec(self, loc: torch.Tensor) -> torch.Tensor:
        gxy = 10.0 * (loc[:, :2, :] - self.dboxes[:, :2, :]) / self.dboxes[:, 2:, :]
        gwh = 5.0 * (loc[:, 2:, :] / self.dboxes[:, 2:, :]).log()
        return torch.cat((gxy, gwh), dim=1)

    def forward(self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.feature_extractor(images)
        feeds = [x]
        for block in self.additional_blocks:
            x = block(x)
            feeds.append(x)
        b = images.size(0)
        ploc = torch.cat([loc(f).view(b, 4, -1) for f, loc in zip(feeds, self.loc)], 2).contiguous().float()
        plabel = torch.cat([conf(f).view(b, self.LABEL_NUM, -1) for f, conf in zip(feeds, self.conf)],
                           2).contiguous().float()
        gloc = boxes.transpose(1, 2).contiguous()  # DLE's train loop: bbox.transpose(1, 2)
        mask = labels > 0
        pos_num = mask.sum(dim=1)
        sl1 = _smooth_l1(ploc, self._loc_vec(gloc)).sum(dim=1)
        sl1 = (mask.float() * sl1).sum(dim=1)
        con = F.cross_entropy(plabel, labels, reduction="none")
        con_neg = torch.where(mask, torch.zeros_like(con), con)
        _, con_idx = con_neg.sort(dim=1, descending=True)
        _, con_rank = con_idx.sort(dim=1)
        neg_num = torch.clamp(3 * pos_num, max=mask.size(1)).unsqueeze(-1)
        neg_mask = con_rank < neg_num
        closs = (con * (mask | neg_mask).float()).sum(dim=1)
        total = sl1 + closs
        num_mask = (pos_num > 0).float()
        return (total * num_mask / pos_num.float().clamp(min=1e-6)).mean(dim=0)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        images = torch.randn(batch_size, 3, 300, 300)
        boxes = torch.rand(batch_size, self.N_BOXES, 4) * 0.5 + 0.1  # centres and positive sizes
        labels = torch.randint(0, self.LABEL_NUM, (batch_size, self.N_BOXES))
        return (images, boxes, labels), {}


# --- GNMT v2 -----------------------------------------------------------------------------------------------------


class BahdanauAttention(nn.Module):
    """DLE GNMT `seq2seq/models/attention.py`, normalized: score = v . tanh(Wq q + Wk k + b) with
    v = g * v / |v|; softmax over the source; context = scores @ keys. Batch-first tensors here."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear_q = nn.Linear(size, size, bias=False)
        self.linear_k = nn.Linear(size, size, bias=False)
        self.linear_att = nn.Parameter(torch.empty(size).uniform_(-0.1, 0.1))
        self.normalize_scalar = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(size)))
        self.normalize_bias = nn.Parameter(torch.zeros(size))

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """query (B, Tq, H), keys (B, Tk, H), mask (B, Tk) True where padded -> context (B, Tq, H)."""
        q, k = self.linear_q(query), self.linear_k(keys)
        b, t_q, t_k, n = q.size(0), q.size(1), k.size(1), k.size(2)
        sum_qk = q.unsqueeze(2).expand(b, t_q, t_k, n) + k.unsqueeze(1).expand(b, t_q, t_k, n)
        sum_qk = sum_qk + self.normalize_bias
        linear_att = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        scores = torch.tanh(sum_qk).matmul(linear_att)
        scores = scores.masked_fill(mask.unsqueeze(1).expand(b, t_q, t_k), -65504.0)
        return torch.bmm(F.softmax(scores, dim=-1), keys)


class GNMT(nn.Module):
    """DLE GNMT v2 (PyTorch/Translation/GNMT, `seq2seq/models/gnmt.py`, defaults of `train.py`).

    - Shared source/target embedding: vocabulary 32,320 (BPE 32k plus specials, padded to a multiple of 8),
      hidden 1024.
    - Encoder: 4 LSTM layers of 1024, the first bidirectional (its 2048-wide output feeds layer 2), residual
      connections from the third layer on, dropout 0.2 on every layer's input.
    - Decoder: an attention LSTM (1024) whose outputs query a normalized Bahdanau attention over the encoder
      outputs; the attention context is concatenated to the input of each of the 3 further LSTM layers (GNMT v2),
      residual connections from the third layer on, dropout 0.2; a 1024 -> 32,320 classifier.
    - Loss (`seq2seq/train/smoothing.py`): label smoothing 0.1 over the vocabulary (confidence x NLL + 0.1 x mean
      -log p), padding excluded by a mask (DLE indexes with the mask: same sum), summed and divided by the batch.

    Teacher forcing as in DLE's trainer: the decoder reads target[:-1] and predicts target[1:]. DLE packs the
    encoder's first layer (`pack_padded_sequence`); with every sentence at full length packing changes nothing
    and is left out. The fused attention-score kernel of DLE computes the same tanh(Wq q + Wk k + b) . v as the
    PyTorch fallback used here. Inputs: source and target token ids (B, seq_len), batch-first (DLE runs
    time-major: transposed inside).
    """

    PAD, BOS, EOS = 0, 2, 3

    def __init__(self, vocab_size: int = 32320, hidden_size: int = 1024, num_layers: int = 4,
                 dropout: float = 0.2, smoothing: float = 0.1) -> None:
        super().__init__()
        h = hidden_size
        self.vocab_size, self.smoothing = vocab_size, smoothing
        self.embedder = nn.Embedding(vocab_size, h, padding_idx=self.PAD)
        self.encoder = nn.ModuleList([nn.LSTM(h, h, bidirectional=True), nn.LSTM(2 * h, h)]
                                     + [nn.LSTM(h, h) for _ in range(num_layers - 2)])
        self.att_rnn = nn.LSTM(h, h)
        self.attention = BahdanauAttention(h)
        self.decoder = nn.ModuleList(nn.LSTM(2 * h, h) for _ in range(num_layers - 1))
        self.classifier = nn.Linear(h, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        x, _ = self.encoder[0](self.dropout(self.embedder(src)))
        x, _ = self.encoder[1](self.dropout(x))
        for layer in self.encoder[2:]:
            residual = x
            x, _ = layer(self.dropout(x))
            x = x + residual
        return x

    def decode(self, tgt_in: torch.Tensor, context: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        x, _ = self.att_rnn(self.dropout(self.embedder(tgt_in)))
        attn = self.attention(x.transpose(0, 1), context.transpose(0, 1), src_mask).transpose(0, 1)
        x, _ = self.decoder[0](self.dropout(torch.cat((x, attn), dim=2)))
        for layer in self.decoder[1:]:
            residual = x
            x, _ = layer(self.dropout(torch.cat((x, attn), dim=2)))
            x = x + residual
        return self.classifier(x)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_t, tgt_t = src.t(), tgt.t()  # time-major, as DLE (batch_first=False)
        context = self.encode(src_t)
        logits = self.decode(tgt_t[:-1], context, src == self.PAD)
        labels = tgt_t[1:]
        logprobs = F.log_softmax(logits.float(), dim=-1)
        nll = -logprobs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        smooth = -logprobs.mean(dim=-1)
        loss = (1.0 - self.smoothing) * nll + self.smoothing * smooth
        return (loss * (labels != self.PAD).float()).sum() / src.size(0)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        _need(seq_len, 2, "gnmt", "the decoder reads target[:-1] and predicts target[1:]")
        src = torch.randint(4, self.vocab_size, (batch_size, seq_len))
        tgt = torch.randint(4, self.vocab_size, (batch_size, seq_len))
        return (src, tgt), {}


# --- NCF (NeuMF) -------------------------------------------------------------------------------------------------


class NeuMF(nn.Module):
    """DLE NCF (PyTorch/Recommendation/NCF, `neumf.py`, defaults of `ncf.py`) on MovieLens-20m.

    138,493 users and 26,744 items; GMF with 64 factors (element-wise product of user and item embeddings) next to
    an MLP [256, 256, 128, 64] on the concatenated 128-wide user and item MLP embeddings (ReLU, dropout 0.5 after
    each layer); one linear layer on [GMF, MLP] to a logit. Loss: binary cross entropy with logits, mean over
    the batch (DLE `ncf.py`). Inputs: user ids, item ids (B,) and 0/1 labels (B,); a benchmark sample is one
    user-item pair (positives and the 4 sampled negatives each).
    """

    def __init__(self, nb_users: int = 138493, nb_items: int = 26744, mf_dim: int = 64,
                 mlp_layer_sizes: Sequence[int] = (256, 256, 128, 64), dropout: float = 0.5) -> None:
        super().__init__()
        self.nb_users, self.nb_items = nb_users, nb_items
        self.mf_user_embed = nn.Embedding(nb_users, mf_dim)
        self.mf_item_embed = nn.Embedding(nb_items, mf_dim)
        self.mlp_user_embed = nn.Embedding(nb_users, mlp_layer_sizes[0] // 2)
        self.mlp_item_embed = nn.Embedding(nb_items, mlp_layer_sizes[0] // 2)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(mlp_layer_sizes))
        self.dropout = dropout
        self.final = nn.Linear(mlp_layer_sizes[-1] + mf_dim, 1)

    def forward(self, user: torch.Tensor, item: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        xmf = self.mf_user_embed(user) * self.mf_item_embed(item)
        xmlp = torch.cat((self.mlp_user_embed(user), self.mlp_item_embed(item)), dim=1)
        for layer in self.mlp:
            xmlp = F.dropout(F.relu(layer(xmlp)), p=self.dropout, training=self.training)
        logit = self.final(torch.cat((xmf, xmlp), dim=1))
        return F.binary_cross_entropy_with_logits(logit.view(-1), label)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        user = torch.randint(0, self.nb_users, (batch_size,))
        item = torch.randint(0, self.nb_items, (batch_size,))
        label = torch.randint(0, 2, (batch_size,)).float()
        return (user, item, label), {}


# --- Tacotron 2 --------------------------------------------------------------------------------------------------

# LJSpeech 1.1: 1,308,678 characters in 13,100 clips (99.9 per clip), mean clip 6.57 s = 565.9 mel frames
# (22,050 Hz, hop 256): about 0.1766 characters (text symbols) per mel frame.
TACOTRON2_SYMBOLS_PER_FRAME = 99.9 / 565.9


def tacotron2_text_len(n_frames: int) -> int:
    """Text symbols of an LJSpeech utterance with `n_frames` mel frames (`TACOTRON2_SYMBOLS_PER_FRAME`), at least
    2 (the encoder's batch norm needs more than one value per channel at batch 1)."""
    return max(2, round(n_frames * TACOTRON2_SYMBOLS_PER_FRAME))


def _conv_bn(n_in: int, n_out: int, kernel: int = 5) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(n_in, n_out, kernel, padding=(kernel - 1) // 2), nn.BatchNorm1d(n_out))


class Tacotron2(nn.Module):
    """DLE Tacotron 2 (PyTorch/SpeechSynthesis/Tacotron2, `tacotron2/model.py`, `tacotron2/arg_parser.py`
    defaults), trained with teacher forcing, n_frames_per_step 1.

    - Encoder: 148 symbols embedded in 512; 3 x (conv 512, kernel 5, batch norm, ReLU, dropout 0.5); a
      bidirectional LSTM of 2 x 256.
    - Attention (location-sensitive): query 1024 -> 128, memory 512 -> 128 (computed once), location features
      conv(2 -> 32, kernel 31) -> 128, energies v . tanh(sum), softmax over the text, context = weights @ memory.
    - Decoder: prenet 80 -> 256 -> 256 (ReLU, dropout 0.5 also at training and inference), attention LSTM cell
      (256 + 512 -> 1024, dropout 0.1), decoder LSTM cell (1024 + 512 -> 1024, dropout 0.1), projections of
      [decoder state, context] to 80 mel channels and to 1 gate logit. Like DLE, a Python loop over the mel
      frames: the graph holds one step's ops per frame.
    - Postnet: 5 x conv 512 (kernel 5, batch norm, tanh except the last, dropout 0.5), 80 -> 512 -> ... -> 80,
      added to the decoder's mels.
    - Loss (`tacotron2/loss_function.py`): MSE(mels, target) + MSE(postnet mels, target) + BCE-with-logits(gate).

    seq_len is the number of mel frames; the text has `tacotron2_text_len(seq_len)` symbols (LJSpeech's ratio,
    ~97 at 550 frames). Inputs: text ids (B, T_text), target mels (B, 80, seq_len), gate targets (B, seq_len).
    The per-frame loop makes the graph ~60 nodes per frame: 33,080 at 550 frames, whose capture takes ~50 s of
    CPU here (torch.export's time grows faster than linearly with the node count).
    """

    N_SYMBOLS, N_MELS = 148, 80

    def __init__(self, embedding_dim: int = 512, attention_rnn_dim: int = 1024, decoder_rnn_dim: int = 1024,
                 prenet_dim: int = 256, attention_dim: int = 128, location_filters: int = 32,
                 location_kernel: int = 31, postnet_dim: int = 512) -> None:
        super().__init__()
        e = embedding_dim
        self.embedding = nn.Embedding(self.N_SYMBOLS, e)
        self.encoder_convs = nn.ModuleList(_conv_bn(e, e) for _ in range(3))
        self.encoder_lstm = nn.LSTM(e, e // 2, batch_first=True, bidirectional=True)
        self.prenet = nn.ModuleList([nn.Linear(self.N_MELS, prenet_dim, bias=False),
                                     nn.Linear(prenet_dim, prenet_dim, bias=False)])
        self.attention_rnn = LSTMCell(prenet_dim + e, attention_rnn_dim)
        self.query_layer = nn.Linear(attention_rnn_dim, attention_dim, bias=False)
        self.memory_layer = nn.Linear(e, attention_dim, bias=False)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.location_conv = nn.Conv1d(2, location_filters, location_kernel, padding=(location_kernel - 1) // 2,
                                       bias=False)
        self.location_dense = nn.Linear(location_filters, attention_dim, bias=False)
        self.decoder_rnn = LSTMCell(attention_rnn_dim + e, decoder_rnn_dim)
        self.linear_projection = nn.Linear(decoder_rnn_dim + e, self.N_MELS)
        self.gate_layer = nn.Linear(decoder_rnn_dim + e, 1)
        sizes = [self.N_MELS] + [postnet_dim] * 4 + [self.N_MELS]
        self.postnet = nn.ModuleList(_conv_bn(a, b) for a, b in itertools.pairwise(sizes))
        self.attention_rnn_dim, self.decoder_rnn_dim = attention_rnn_dim, decoder_rnn_dim

    def encode(self, text: torch.Tensor) -> torch.Tensor:
        x = self.embedding(text).transpose(1, 2)
        for conv in self.encoder_convs:
            x = F.dropout(F.relu(conv(x)), 0.5, self.training)
        memory, _ = self.encoder_lstm(x.transpose(1, 2))
        return memory

    def decode(self, memory: torch.Tensor, mels: torch.Tensor, text_mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t_text = memory.size(0), memory.size(1)
        go = memory.new_zeros(1, b, self.N_MELS)
        x = torch.cat((go, mels.permute(2, 0, 1)), dim=0)  # (T + 1, B, 80): the previous frame at each step
        for layer in self.prenet:
            x = F.dropout(F.relu(layer(x)), 0.5, training=True)
        processed_memory = self.memory_layer(memory)
        attention_hidden = memory.new_zeros(b, self.attention_rnn_dim)
        attention_cell = memory.new_zeros(b, self.attention_rnn_dim)
        decoder_hidden = memory.new_zeros(b, self.decoder_rnn_dim)
        decoder_cell = memory.new_zeros(b, self.decoder_rnn_dim)
        weights = memory.new_zeros(b, t_text)
        weights_cum = memory.new_zeros(b, t_text)
        context = memory.new_zeros(b, memory.size(2))
        mel_outputs, gate_outputs = [], []
        for t in range(mels.size(2)):
            attention_hidden, attention_cell = self.attention_rnn(torch.cat((x[t], context), -1),
                                                                  (attention_hidden, attention_cell))
            attention_hidden = F.dropout(attention_hidden, 0.1, self.training)
            location = self.location_conv(torch.stack((weights, weights_cum), dim=1)).transpose(1, 2)
            energies = self.v(torch.tanh(self.query_layer(attention_hidden).unsqueeze(1)
                                         + self.location_dense(location) + processed_memory)).squeeze(-1)
            weights = F.softmax(energies.masked_fill(text_mask, -float("inf")), dim=1)
            context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
            weights_cum = weights_cum + weights
            decoder_hidden, decoder_cell = self.decoder_rnn(torch.cat((attention_hidden, context), -1),
                                                            (decoder_hidden, decoder_cell))
            decoder_hidden = F.dropout(decoder_hidden, 0.1, self.training)
            state = torch.cat((decoder_hidden, context), dim=1)
            mel_outputs.append(self.linear_projection(state))
            gate_outputs.append(self.gate_layer(state).squeeze(1))
        return torch.stack(mel_outputs, dim=2), torch.stack(gate_outputs, dim=1)

    def forward(self, text: torch.Tensor, mels: torch.Tensor, gate_target: torch.Tensor) -> torch.Tensor:
        memory = self.encode(text)
        mel_out, gate_out = self.decode(memory, mels, text == 0)
        x = mel_out
        for i, conv in enumerate(self.postnet):
            x = conv(x)
            x = F.dropout(torch.tanh(x) if i < len(self.postnet) - 1 else x, 0.5, self.training)
        mel_postnet = mel_out + x
        mel_loss = F.mse_loss(mel_out, mels) + F.mse_loss(mel_postnet, mels)
        return mel_loss + F.binary_cross_entropy_with_logits(gate_out, gate_target)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        text = torch.randint(1, self.N_SYMBOLS, (batch_size, tacotron2_text_len(seq_len)))
        mels = torch.randn(batch_size, self.N_MELS, seq_len)
        gate = torch.zeros(batch_size, seq_len)
        gate[:, -1] = 1.0  # the stop token at the last frame
        return (text, mels, gate), {}


# --- WaveGlow ----------------------------------------------------------------------------------------------------


def _weight_norm(conv: nn.Conv1d) -> nn.Conv1d:
    return nn.utils.parametrizations.weight_norm(conv, name="weight")


class Invertible1x1Conv(nn.Module):
    """A 1x1 convolution with a random orthonormal (det > 0) initial weight; returns z and log|det W| for every
    group of every sample (DLE: `batch_size * n_of_groups * logdet(W)`)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c, c, kernel_size=1, bias=False)
        if self.conv.weight.device.type != "meta":
            w = torch.linalg.qr(torch.randn(c, c))[0]
            if torch.det(w) < 0:
                w[:, 0] = -w[:, 0]
            with torch.no_grad():
                self.conv.weight.copy_(w.view(c, c, 1))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, _, n_groups = z.size()
        log_det_w = batch * n_groups * torch.logdet(self.conv.weight.squeeze(-1).float())
        return self.conv(z), log_det_w


class WN(nn.Module):
    """WaveNet-like affine coupling network of WaveGlow: weight-normed start conv, `n_layers` dilated (2^i) gated
    convs conditioned on the upsampled mels, residual/skip 1x1 convs, zero-initialised end conv."""

    def __init__(self, n_in: int, n_cond: int, n_layers: int = 8, n_channels: int = 256, kernel_size: int = 3
                 ) -> None:
        super().__init__()
        self.n_channels = n_channels
        self.start = _weight_norm(nn.Conv1d(n_in, n_channels, 1))
        self.end = end = nn.Conv1d(n_channels, 2 * n_in, 1)
        nn.init.zeros_(end.weight)
        assert end.bias is not None
        nn.init.zeros_(end.bias)
        self.in_layers, self.cond_layers, self.res_skip_layers = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for i in range(n_layers):
            dilation = 2**i
            padding = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(_weight_norm(nn.Conv1d(n_channels, 2 * n_channels, kernel_size,
                                                         dilation=dilation, padding=padding)))
            self.cond_layers.append(_weight_norm(nn.Conv1d(n_cond, 2 * n_channels, 1)))
            res_skip = 2 * n_channels if i < n_layers - 1 else n_channels
            self.res_skip_layers.append(_weight_norm(nn.Conv1d(n_channels, res_skip, 1)))

    def forward(self, audio: torch.Tensor, spect: torch.Tensor) -> torch.Tensor:
        audio = self.start(audio)
        n = self.n_channels
        output = None
        for i, (in_layer, cond_layer, res_skip_layer) in enumerate(
                zip(self.in_layers, self.cond_layers, self.res_skip_layers)):
            in_act = in_layer(audio) + cond_layer(spect)
            acts = torch.tanh(in_act[:, :n]) * torch.sigmoid(in_act[:, n:])
            res_skip = res_skip_layer(acts)
            if i < len(self.in_layers) - 1:
                audio = res_skip[:, :n] + audio
                skip = res_skip[:, n:]
            else:
                skip = res_skip
            output = skip if output is None else skip + output
        return self.end(output)


class WaveGlow(nn.Module):
    """DLE WaveGlow (PyTorch/SpeechSynthesis/Tacotron2, `waveglow/model.py`, `waveglow/arg_parser.py` defaults).

    80 mel channels upsampled by ConvTranspose1d(80, 80, 1024, stride 256) to the audio length; audio in groups
    of 8 samples; 12 flows, each an invertible 1x1 conv and an affine coupling whose WN has 8 layers of 512
    channels, kernel 3; every 4 flows 2 channels leave early (8 -> 6 -> 4 channels). Loss (`waveglow/loss_function.py`,
    sigma 1.0): sum(z^2) / (2 sigma^2) - sum(log s) - sum(log|det W|), divided by the number of elements of z.

    seq_len is the segment length in audio samples (DLE `--segment-length 8000`); the mel spectrogram of the
    segment has seq_len // 256 + 1 frames (STFT hop 256, centred). Inputs: mels (B, 80, frames), audio (B, seq_len).
    """

    N_MELS, HOP = 80, 256

    def __init__(self, n_flows: int = 12, n_group: int = 8, n_early_every: int = 4, n_early_size: int = 2,
                 wn_layers: int = 8, wn_channels: int = 512, wn_kernel: int = 3, sigma: float = 1.0) -> None:
        super().__init__()
        self.n_group, self.n_early_every, self.n_early_size, self.sigma = n_group, n_early_every, n_early_size, sigma
        self.upsample = nn.ConvTranspose1d(self.N_MELS, self.N_MELS, 1024, stride=self.HOP)
        self.WN, self.convinv = nn.ModuleList(), nn.ModuleList()
        n_half, n_remaining = n_group // 2, n_group
        for k in range(n_flows):
            if k % n_early_every == 0 and k > 0:
                n_half -= n_early_size // 2
                n_remaining -= n_early_size
            self.convinv.append(Invertible1x1Conv(n_remaining))
            self.WN.append(WN(n_half, self.N_MELS * n_group, wn_layers, wn_channels, wn_kernel))

    def forward(self, mels: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        spect = self.upsample(mels)[:, :, :audio.size(1)]
        spect = spect.unfold(2, self.n_group, self.n_group).permute(0, 2, 1, 3)
        spect = spect.contiguous().view(spect.size(0), spect.size(1), -1).permute(0, 2, 1)
        z = audio.unfold(1, self.n_group, self.n_group).permute(0, 2, 1)
        outputs, log_s_total, log_det_total = [], z.new_zeros(()), z.new_zeros(())
        for k, (convinv, wn) in enumerate(zip(self.convinv, self.WN)):
            if k % self.n_early_every == 0 and k > 0:
                outputs.append(z[:, :self.n_early_size])
                z = z[:, self.n_early_size:]
            z, log_det_w = convinv(z)
            n_half = z.size(1) // 2
            z_0, z_1 = z[:, :n_half], z[:, n_half:]
            out = wn(z_0, spect)
            log_s, b = out[:, n_half:], out[:, :n_half]
            z = torch.cat([z_0, torch.exp(log_s) * z_1 + b], 1)
            log_s_total = log_s_total + log_s.sum()
            log_det_total = log_det_total + log_det_w
        z = torch.cat(outputs + [z], 1)
        loss = (z * z).sum() / (2 * self.sigma**2) - log_s_total - log_det_total
        return loss / z.numel()

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        _need(seq_len, self.n_group, "waveglow", "one group of audio samples")
        mels = torch.randn(batch_size, self.N_MELS, seq_len // self.HOP + 1)
        audio = torch.rand(batch_size, seq_len) * 2 - 1
        return (mels, audio), {}


# --- Transformer-XL ----------------------------------------------------------------------------------------------

# WikiText-103: 267,735 words; DLE's adaptive softmax cutoffs for it.
WT103_VOCAB = 267735
WT103_CUTOFFS = (19997, 39997, 199997)


def zipf_cluster_shares(cutoffs: Sequence[int], n_token: int) -> tuple[float, ...]:
    """The share of tokens whose word lies in each adaptive-softmax cluster (head first), for a Zipf (s = 1)
    distribution over the `n_token`-word vocabulary ranked by frequency: H(r) ~ ln r + 0.5772."""
    def harmonic(r: int) -> float:
        return math.log(r) + 0.5772156649 if r > 0 else 0.0
    ends = [0, *cutoffs, n_token]
    return tuple((harmonic(b) - harmonic(a)) / harmonic(n_token) for a, b in itertools.pairwise(ends))


class RelPartialLearnableDecoderLayer(nn.Module):
    """One Transformer-XL layer (DLE `mem_transformer.py`, attn_type 0, post-norm): relative multi-head attention
    over [memory, segment] with the shared biases r_w (content) and r_r (position), then a ReLU feed-forward."""

    def __init__(self, n_head: int, d_model: int, d_head: int, d_inner: int, dropout: float, dropatt: float
                 ) -> None:
        super().__init__()
        self.n_head, self.d_head, self.scale = n_head, d_head, 1.0 / d_head**0.5
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.attn_norm = nn.LayerNorm(d_model)
        self.drop, self.dropatt = nn.Dropout(dropout), nn.Dropout(dropatt)
        self.ff = nn.Sequential(nn.Linear(d_model, d_inner), nn.ReLU(inplace=True), nn.Dropout(dropout),
                                nn.Linear(d_inner, d_model), nn.Dropout(dropout))
        self.ff_norm = nn.LayerNorm(d_model)

    @staticmethod
    def _rel_shift(x: torch.Tensor) -> torch.Tensor:
        zero_pad = x.new_zeros(x.size(0), x.size(1), x.size(2), 1)
        padded = torch.cat([zero_pad, x], dim=3).view(x.size(0), x.size(1), x.size(3) + 1, x.size(2))
        return padded[:, :, 1:].reshape_as(x)

    def forward(self, w: torch.Tensor, r: torch.Tensor, r_w_bias: torch.Tensor, r_r_bias: torch.Tensor,
                attn_mask: torch.Tensor, mems: torch.Tensor) -> torch.Tensor:
        qlen, rlen, bsz = w.size(0), r.size(0), w.size(1)
        w_heads = self.qkv_net(torch.cat([mems, w], 0))
        r_head_k = self.r_net(r).view(rlen, self.n_head, self.d_head)
        q, k, v = torch.chunk(w_heads, 3, dim=-1)
        klen = k.size(0)
        q = q[-qlen:].view(qlen, bsz, self.n_head, self.d_head)
        k = k.view(klen, bsz, self.n_head, self.d_head)
        v = v.view(klen, bsz, self.n_head, self.d_head)
        ac = torch.einsum("ibnd,jbnd->bnij", q + r_w_bias, k)
        bd = self._rel_shift(torch.einsum("ibnd,jnd->bnij", q + r_r_bias, r_head_k))
        score = ((ac + bd) * self.scale).masked_fill(attn_mask[None, None], -float("inf"))
        prob = self.dropatt(F.softmax(score, dim=3))
        vec = torch.einsum("bnij,jbnd->ibnd", prob, v).reshape(qlen, bsz, self.n_head * self.d_head)
        out = self.attn_norm(w + self.drop(self.o_net(vec)))
        return self.ff_norm(out + self.ff(out))


class MemTransformerLM(nn.Module):
    """DLE Transformer-XL (PyTorch/LanguageModeling/Transformer-XL, `pytorch/mem_transformer.py`) on WikiText-103
    (267,735 words), as Lambda's benchmark configured it.

    Embedding d_model wide (scaled by sqrt(d_model)), sinusoidal relative positions, dropout; n_layer post-norm
    layers of relative multi-head attention (n_head x d_head, shared r_w / r_r biases) over [memory, segment]
    with a causal mask, and a ReLU feed-forward of d_inner; the output layer's weight tied to the embedding
    (DLE `tie_weight`), with its own bias. Loss: the mean negative log-likelihood of the segment's tokens.

    Lambda's command lines (LambdaLabsML/lambda-deeplearning-benchmark config scripts) pass `--n_layer ...
    --tgt_len --mem_len --roll --cuda` but neither `--adaptive` nor `--div_val` nor `--config_file`, and DLE's
    `train.py` loads no YAML without `--config_file`: its `--adaptive` (store_true) is off and `--div_val` is 1.
    So Lambda's runs had a full softmax over the 267,735 words (cutoffs [], one output layer), for base and
    large alike, unlike DLE's own `wt103_base.yaml` (adaptive) and `wt103_large.yaml` (adaptive, div_val 4,
    tgt_len 384). Their memory footprint agrees: large OOMs at batch 1 on an 11 GB GTX 1080 Ti, which the
    520M-parameter full-softmax model does and the 257M-parameter div_val-4 one would not.
    `adaptive=True` builds DLE's adaptive softmax instead (cutoffs 19997/39997/199997, div_val 1, tied): the head
    (19,997 words + 3 cluster logits) for every token, each tail cluster for a static share of the tokens
    (`tail_shares`, default `zipf_cluster_shares`): DLE selects a cluster's tokens with `nonzero()`, a
    data-dependent shape.

    mem_len equals tgt_len (= seq_len), as in both DLE configurations Lambda ran (192/192, 256/256). Inputs,
    batch-first: data and target token ids (B, tgt_len), and the previous segment's memories stacked
    (B, n_layer, mem_len, d_model). `forward` returns (loss, new memories) like DLE's.
    """

    inv_freq: torch.Tensor

    def __init__(self, n_layer: int = 16, d_model: int = 512, n_head: int = 8, d_head: int = 64,
                 d_inner: int = 2048, dropout: float = 0.1, dropatt: float = 0.0, n_token: int = WT103_VOCAB,
                 adaptive: bool = False, tail_shares: Sequence[float] | None = None) -> None:
        super().__init__()
        self.n_token, self.n_layer, self.d_model = n_token, n_layer, d_model
        self.word_emb = nn.Embedding(n_token, d_model)
        self.emb_scale = d_model**0.5
        self.register_buffer("inv_freq", 1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model)),
                             persistent=False)
        self.drop = nn.Dropout(dropout)
        self.r_w_bias = nn.Parameter(torch.zeros(n_head, d_head))
        self.r_r_bias = nn.Parameter(torch.zeros(n_head, d_head))
        self.layers = nn.ModuleList(RelPartialLearnableDecoderLayer(n_head, d_model, d_head, d_inner, dropout,
                                                                    dropatt) for _ in range(n_layer))
        self.out_bias = nn.Parameter(torch.zeros(n_token))  # the output layer's weight is word_emb.weight (tied)
        self.cutoffs: tuple[int, ...] = WT103_CUTOFFS if adaptive else ()
        if adaptive:
            self.cluster_weight = nn.Parameter(torch.zeros(len(self.cutoffs), d_model))
            self.cluster_bias = nn.Parameter(torch.zeros(len(self.cutoffs)))
            shares = zipf_cluster_shares(self.cutoffs, n_token)
            self.tail_shares = tuple(tail_shares) if tail_shares is not None else shares[1:]

    def _nll(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-token negative log-likelihood: a full softmax, or DLE's adaptive softmax (static cluster sizes)."""
        weight = self.word_emb.weight
        if not self.cutoffs:
            logprob = F.log_softmax(F.linear(hidden, weight, self.out_bias), dim=-1)
            return -logprob.gather(1, target.unsqueeze(1)).squeeze(1)
        head = self.cutoffs[0]
        head_weight = torch.cat([weight[:head], self.cluster_weight], dim=0)
        head_bias = torch.cat([self.out_bias[:head], self.cluster_bias], dim=0)
        head_logprob = F.log_softmax(F.linear(hidden, head_weight, head_bias), dim=1)
        n = hidden.size(0)
        nll = -head_logprob.gather(1, target.clamp(max=head - 1).unsqueeze(1)).squeeze(1)
        ends = [*self.cutoffs, self.n_token]
        start = 0
        for i, share in enumerate(self.tail_shares, start=1):
            count = max(1, min(n, round(share * n)))
            idx = torch.arange(start, start + count, device=hidden.device) % n  # this cluster's tokens
            start = (start + count) % n
            lo, hi = ends[i - 1], ends[i]
            tail_logprob = F.log_softmax(F.linear(hidden.index_select(0, idx), weight[lo:hi],
                                                  self.out_bias[lo:hi]), dim=1)
            target_i = (target.index_select(0, idx) - lo).clamp(0, hi - lo - 1)
            logprob_i = head_logprob.index_select(0, idx)[:, -i] + tail_logprob.gather(
                1, target_i.unsqueeze(1)).squeeze(1)
            nll = nll.index_copy(0, idx, -logprob_i)
        return nll

    def forward(self, data: torch.Tensor, target: torch.Tensor, mems: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        data_t = data.t()  # (qlen, B): DLE is time-major
        qlen, mlen = data_t.size(0), mems.size(2)
        klen = mlen + qlen
        word_emb = self.word_emb(data_t) * self.emb_scale
        attn_mask = torch.triu(word_emb.new_ones(qlen, klen), diagonal=1 + mlen).bool()
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=word_emb.device, dtype=word_emb.dtype)
        sinusoid = torch.outer(pos_seq, self.inv_freq.to(word_emb.dtype))
        pos_emb = self.drop(torch.cat([sinusoid.sin(), sinusoid.cos()], dim=-1)[:, None, :])
        core = self.drop(word_emb)
        hids = [core]
        for i, layer in enumerate(self.layers):
            core = layer(core, pos_emb, self.r_w_bias, self.r_r_bias, attn_mask, mems[:, i].transpose(0, 1))
            hids.append(core)
        core = self.drop(core)
        with torch.no_grad():  # DLE `_update_mems`: the last mem_len positions of [memory, hidden], per layer
            new_mems = torch.stack([torch.cat([mems[:, i].transpose(0, 1), hids[i]], 0)[-mlen:].detach()
                                    for i in range(self.n_layer)], dim=0).permute(2, 0, 1, 3)
        loss = self._nll(core.reshape(-1, self.d_model), target.t().reshape(-1))
        return loss.float().mean(), new_mems

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        data = torch.randint(0, self.n_token, (batch_size, seq_len))
        target = torch.randint(0, self.n_token, (batch_size, seq_len))
        mems = torch.randn(batch_size, self.n_layer, seq_len, self.d_model)
        return (data, target, mems), {}


def transformer_xl_base(adaptive: bool = False) -> MemTransformerLM:
    """Lambda's transformerxlbase: 16 layers, d_model 512, 8 heads x 64, d_inner 2048, dropout 0.1, dropatt 0."""
    return MemTransformerLM(16, 512, 8, 64, 2048, dropout=0.1, dropatt=0.0, adaptive=adaptive)


def transformer_xl_large(adaptive: bool = False) -> MemTransformerLM:
    """Lambda's transformerxllarge: 18 layers, d_model 1024, 16 heads x 64, d_inner 4096, dropout 0.2, dropatt
    0.2 (div_val 1: Lambda passes no --div_val; DLE's wt103_large.yaml has 4)."""
    return MemTransformerLM(18, 1024, 16, 64, 4096, dropout=0.2, dropatt=0.2, adaptive=adaptive)


# --- Mask R-CNN --------------------------------------------------------------------------------------------------


def _box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of (B, N, 4) and (B, M, 4) boxes (x0, y0, x1, y1) -> (B, N, M)."""
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    lt = torch.maximum(a[:, :, None, :2], b[:, None, :, :2])
    rb = torch.minimum(a[:, :, None, 2:], b[:, None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area_a[:, :, None] + area_b[:, None, :] - inter).clamp(min=1e-6)


def _box_encode(boxes: torch.Tensor, ref: torch.Tensor, weights: tuple[float, ...]) -> torch.Tensor:
    """maskrcnn_benchmark BoxCoder.encode: the deltas that take `ref` to `boxes` (both (..., 4))."""
    wx, wy, ww, wh = weights
    rw, rh = ref[..., 2] - ref[..., 0] + 1, ref[..., 3] - ref[..., 1] + 1
    bw, bh = boxes[..., 2] - boxes[..., 0] + 1, boxes[..., 3] - boxes[..., 1] + 1
    dx = wx * ((boxes[..., 0] + 0.5 * bw) - (ref[..., 0] + 0.5 * rw)) / rw
    dy = wy * ((boxes[..., 1] + 0.5 * bh) - (ref[..., 1] + 0.5 * rh)) / rh
    return torch.stack((dx, dy, ww * torch.log(bw / rw), wh * torch.log(bh / rh)), dim=-1)


def _box_decode(deltas: torch.Tensor, ref: torch.Tensor, weights: tuple[float, ...], image_hw: tuple[int, int]
                ) -> torch.Tensor:
    """maskrcnn_benchmark BoxCoder.decode (exp clamped at log(1000/16)) and clip to the image."""
    wx, wy, ww, wh = weights
    rw, rh = ref[..., 2] - ref[..., 0] + 1, ref[..., 3] - ref[..., 1] + 1
    cx, cy = ref[..., 0] + 0.5 * rw + deltas[..., 0] / wx * rw, ref[..., 1] + 0.5 * rh + deltas[..., 1] / wy * rh
    w = torch.exp((deltas[..., 2] / ww).clamp(max=math.log(1000.0 / 16))) * rw
    h = torch.exp((deltas[..., 3] / wh).clamp(max=math.log(1000.0 / 16))) * rh
    height, width = image_hw
    return torch.stack(((cx - 0.5 * w).clamp(0, width - 1), (cy - 0.5 * h).clamp(0, height - 1),
                        (cx + 0.5 * w - 1).clamp(0, width - 1), (cy + 0.5 * h - 1).clamp(0, height - 1)), dim=-1)


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, N, ...) rows idx (B, K) -> (B, K, ...)."""
    shape = idx.shape + x.shape[2:]
    return x.gather(1, idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand(shape))


def roi_align(features: torch.Tensor, boxes: torch.Tensor, output_size: int, scale: float,
              sampling_ratio: int = 2) -> torch.Tensor:
    """RoIAlign (maskrcnn_benchmark `ROIAlign`, aligned=False) of (B, K, 4) image-space boxes on (B, C, H, W)
    features -> (B * K, C, output_size, output_size): sampling_ratio^2 bilinear samples per output cell (four
    gathered taps each, weighted), averaged. The same gathers and multiply-adds as the CUDA kernel; written in
    tensor ops because torchvision's compiled `roi_align` is not available next to this CPU build of torch."""
    b, c, height, width = features.shape
    k, s = boxes.size(1), output_size * sampling_ratio
    x0, y0, x1, y1 = (boxes * scale).unbind(-1)
    grid = (torch.arange(s, device=features.device, dtype=features.dtype) + 0.5) / s
    ys = (y0[..., None] + grid * (y1 - y0).clamp(min=1.0)[..., None]).clamp(0, height - 1)  # (B, K, S)
    xs = (x0[..., None] + grid * (x1 - x0).clamp(min=1.0)[..., None]).clamp(0, width - 1)
    y_lo, x_lo = ys.floor(), xs.floor()
    ly, lx = ys - y_lo, xs - x_lo
    y_lo, x_lo = y_lo.long(), x_lo.long()
    y_hi, x_hi = (y_lo + 1).clamp(max=height - 1), (x_lo + 1).clamp(max=width - 1)
    fmap = features.permute(0, 2, 3, 1)  # (B, H, W, C): each tap gathers C contiguous values
    batch = torch.arange(b, device=features.device)[:, None, None, None]

    def tap(yi: torch.Tensor, xi: torch.Tensor, wy: torch.Tensor, wx: torch.Tensor) -> torch.Tensor:
        values = fmap[batch, yi[:, :, :, None], xi[:, :, None, :]]  # (B, K, S, S, C)
        return values * (wy[:, :, :, None] * wx[:, :, None, :])[..., None]

    val = (tap(y_lo, x_lo, 1 - ly, 1 - lx) + tap(y_lo, x_hi, 1 - ly, lx) + tap(y_hi, x_lo, ly, 1 - lx)
           + tap(y_hi, x_hi, ly, lx))
    val = val.view(b, k, output_size, sampling_ratio, output_size, sampling_ratio, c).mean(dim=(3, 5))
    return val.permute(0, 1, 4, 2, 3).reshape(b * k, c, output_size, output_size)


class MaskRCNN(nn.Module):
    """Mask R-CNN R-50-FPN 1x as DLE's maskrcnn_benchmark trains it (PyTorch/Segmentation/MaskRCNN,
    `configs/e2e_mask_rcnn_R_50_FPN_1x.yaml` and `maskrcnn_benchmark/config/defaults.py`), 81 COCO classes.

    Modules (torchvision's, the same architecture: 44,347,573 parameters, those of torchvision's
    `maskrcnn_resnet50_fpn(num_classes=81)` with frozen batch norm): ResNet-50 with frozen batch norm, stem and
    layer1 frozen (FREEZE_CONV_BODY_AT 2), FPN 256 on C2-C5 plus a max-pooled P6; RPN head (3x3 conv 256, 3 anchors per
    location: objectness 3, deltas 12) on P2-P6; box head: RoIAlign 7x7 (sampling 2) from P2-P5, 2 FC 1024, 81
    class logits and 81 x 4 deltas; mask head: RoIAlign 14x14, 4 x conv 256, deconv 2x2 to 28x28, 81 mask logits.

    What maskrcnn_benchmark decides from the data runs as a static equivalent with fixed counts, doing the same
    work (like `perfmodel.graph.moe`'s balanced routing):

    - RPN targets: IoU of every anchor (sizes 32-512, ratios 0.5/1/2, strides 4-64) with every ground-truth box,
      best match, thresholds 0.7/0.3; 256 anchors sampled per image by a top-k over random scores with positives
      first (DLE samples with randperm over `nonzero()` sets). Loss: BCE on the 256, smooth L1 (beta 1/9) on
      their positives, / 256.
    - Proposals: per level and image the top 2000 anchors by objectness (PRE_NMS_TOP_N_TRAIN), decoded and
      clipped; NMS (0.7) as its pairwise IoU matrix and a one-pass suppression test, suppressed boxes ranked
      last rather than dropped (fixed counts); then the top FPN_POST_NMS_TOP_N_TRAIN = 4000 of the batch
      (FPN_POST_NMS_PER_BATCH; 4000 in the benchmark's `e2e_mask_rcnn_R_50_FPN_1x.yaml`), 4000 // B per image.
    - Box head sampling: proposals plus ground truth matched by IoU (0.5), 512 RoIs per image (or all
      candidates when fewer, as from B = 4 on) by a top-k over random scores with positives first; RoIs are
      split evenly over P2-P5 (DLE assigns each RoI to a level by its size: the same pooling work per RoI).
    - Mask head: the positive RoIs only (DLE `keep_only_positive_boxes`), 16 per image, with their 28x28 mask
      targets, an input here (cut from the polygons by the data pipeline). The benchmark trains at learning rate 0
      from an ImageNet backbone, so the RPN head keeps its random initialisation and its proposals are anchors
      in random order: the positives are the 7 ground-truth boxes DLE appends to the proposals plus the few
      proposals that overlap one by chance (DLE's cap is 128 = 25 % of 512; ~1 GFLOP forward per RoI).

    Images: 800 x 1344 (short side 800, long side 1333 padded to a multiple of 32: the largest batch DLE builds
    from COCO), 7 ground-truth boxes per image (COCO train2017: 860,001 instances in 118,287 images). Inputs:
    images (B, 3, 800, 1344), gt boxes (B, 7, 4), gt labels (B, 7), mask targets (B, 16, 28, 28).
    """

    N_CLASSES, IMAGE_HW, N_GT = 81, (800, 1344), 7
    ANCHOR_SIZES, STRIDES, RATIOS = (32, 64, 128, 256, 512), (4, 8, 16, 32, 64), (0.5, 1.0, 2.0)
    RPN_PRE_NMS, RPN_POST_NMS_BATCH, RPN_BATCH, ROI_BATCH, MASK_ROIS = 2000, 4000, 256, 512, 16

    def __init__(self) -> None:
        super().__init__()
        ensure_torchvision()
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
        from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
        from torchvision.models.detection.rpn import RPNHead

        self.backbone = resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=3)
        self.rpn_head = RPNHead(256, len(self.RATIOS))
        self.box_head = TwoMLPHead(256 * 7 * 7, 1024)
        self.box_predictor = FastRCNNPredictor(1024, self.N_CLASSES)
        self.mask_head = MaskRCNNHeads(256, [256, 256, 256, 256], 1)
        self.mask_predictor = MaskRCNNPredictor(256, 256, self.N_CLASSES)

    def _anchors(self, h: int, w: int, stride: int, size: int, device: torch.device) -> torch.Tensor:
        """maskrcnn_benchmark's anchors of one level: 3 per location, location-major (H * W * 3, 4)."""
        base = []
        for ratio in self.RATIOS:
            ws = round(math.sqrt(stride * stride / ratio)) * size / stride
            hs = round(math.sqrt(stride * stride / ratio) * ratio) * size / stride
            c = (stride - 1) / 2
            base.append((c - (ws - 1) / 2, c - (hs - 1) / 2, c + (ws - 1) / 2, c + (hs - 1) / 2))
        shift_x = torch.arange(w, device=device, dtype=torch.float32) * stride
        shift_y = torch.arange(h, device=device, dtype=torch.float32) * stride
        sy, sx = torch.meshgrid(shift_y, shift_x, indexing="ij")
        shifts = torch.stack((sx, sy, sx, sy), dim=-1).reshape(-1, 1, 4)
        return (shifts + torch.tensor(base, device=device)).reshape(-1, 4)

    def _rpn(self, features: list[torch.Tensor], gt_boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RPN loss and the per-image proposals (B, P, 4), P = 4000 // B."""
        b = gt_boxes.size(0)
        objectness, deltas = self.rpn_head(features)
        anchors, scores, regs, level_boxes, level_scores = [], [], [], [], []
        for feat, obj, reg, stride, size in zip(features, objectness, deltas, self.STRIDES, self.ANCHOR_SIZES):
            h, w = feat.shape[-2:]
            level_anchors = self._anchors(h, w, stride, size, feat.device)
            obj = obj.permute(0, 2, 3, 1).reshape(b, -1)
            reg = reg.view(b, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, 4)
            anchors.append(level_anchors)
            scores.append(obj)
            regs.append(reg)
            # proposals of this level: top-k by objectness, decoded, NMS as its IoU matrix (no gradient)
            k = min(self.RPN_PRE_NMS, obj.size(1))
            top_scores, top_idx = obj.detach().topk(k, dim=1)
            boxes = _box_decode(_gather_rows(reg.detach(), top_idx), level_anchors[top_idx], (1.0, 1.0, 1.0, 1.0),
                                self.IMAGE_HW)
            # greedy NMS in one pass: a box is suppressed when a higher-scoring one overlaps it by > 0.7
            suppressed = (_box_iou(boxes, boxes) > 0.7).triu(diagonal=1).any(dim=1)
            level_boxes.append(boxes)
            level_scores.append(top_scores.masked_fill(suppressed, -float("inf")))  # ranked last, not dropped
        all_anchors = torch.cat(anchors).expand(b, -1, -1)
        obj_all, reg_all = torch.cat(scores, dim=1), torch.cat(regs, dim=1)
        # targets: best ground truth per anchor, 256 anchors sampled per image (positives first)
        iou = _box_iou(all_anchors, gt_boxes)
        best_iou, best_gt = iou.max(dim=2)
        positive = best_iou >= 0.7
        labels = positive.float()
        rank = torch.rand_like(best_iou) + positive.float() + (best_iou >= 0.3).logical_not().float() * 0.5
        sampled = rank.topk(self.RPN_BATCH, dim=1).indices
        obj_loss = F.binary_cross_entropy_with_logits(obj_all.gather(1, sampled), labels.gather(1, sampled))
        targets = _box_encode(_gather_rows(gt_boxes, best_gt), all_anchors, (1.0, 1.0, 1.0, 1.0))
        box_loss = (_smooth_l1(_gather_rows(reg_all, sampled), _gather_rows(targets, sampled), beta=1 / 9).sum(-1)
                    * labels.gather(1, sampled)).sum() / (b * self.RPN_BATCH)
        candidates, candidate_scores = torch.cat(level_boxes, dim=1), torch.cat(level_scores, dim=1)
        post = min(max(1, self.RPN_POST_NMS_BATCH // b), candidates.size(1))
        proposals = _gather_rows(candidates, candidate_scores.topk(post, dim=1).indices)
        return obj_loss + box_loss, proposals

    def _pool(self, features: list[torch.Tensor], rois: torch.Tensor, size: int) -> torch.Tensor:
        """RoIAlign of (B, R, 4) RoIs, split evenly over P2-P5 -> (B * R, 256, size, size), image-major."""
        b, r = rois.shape[:2]
        bounds = [round(i * r / 4) for i in range(5)]
        pooled = [roi_align(feat, rois[:, lo:hi], size, 1.0 / stride).view(b, hi - lo, -1, size, size)
                  for feat, stride, lo, hi in zip(features[:4], self.STRIDES, bounds[:-1], bounds[1:]) if hi > lo]
        return torch.cat(pooled, dim=1).flatten(0, 1)

    def forward(self, images: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor,
                mask_targets: torch.Tensor) -> torch.Tensor:
        features = list(self.backbone(images).values())  # P2, P3, P4, P5, P6
        rpn_loss, proposals = self._rpn(features, gt_boxes)
        # box head targets: proposals and ground truth, matched by IoU, 512 sampled per image
        candidates = torch.cat([proposals, gt_boxes], dim=1)
        best_iou, best_gt = _box_iou(candidates, gt_boxes).max(dim=2)
        positive = best_iou >= 0.5
        n_rois = min(self.ROI_BATCH, candidates.size(1))
        sampled = (torch.rand_like(best_iou) + positive.float()).topk(n_rois, dim=1).indices
        rois = _gather_rows(candidates, sampled)
        roi_labels = (gt_labels.gather(1, best_gt) * positive.long()).gather(1, sampled)
        roi_targets = _gather_rows(_box_encode(_gather_rows(gt_boxes, best_gt), candidates, (10.0, 10.0, 5.0, 5.0)),
                                   sampled)
        x = self.box_head(self._pool(features, rois, 7))
        class_logits, box_regression = self.box_predictor(x)
        labels = roi_labels.reshape(-1)
        class_loss = F.cross_entropy(class_logits, labels)
        class_deltas = box_regression.view(-1, self.N_CLASSES, 4).gather(
            1, labels.view(-1, 1, 1).expand(-1, 1, 4)).squeeze(1)
        box_loss = (_smooth_l1(class_deltas, roi_targets.reshape(-1, 4)).sum(-1)
                    * (labels > 0).float()).sum() / labels.numel()
        # mask head: the first MASK_ROIS sampled RoIs (positives first)
        n_masks = min(self.MASK_ROIS, n_rois)
        mask_logits = self.mask_predictor(self.mask_head(self._pool(features, rois[:, :n_masks], 14)))
        mask_labels = roi_labels[:, :n_masks].reshape(-1)
        mask_logits = mask_logits.gather(1, mask_labels.view(-1, 1, 1, 1).expand(-1, 1, 28, 28)).squeeze(1)
        mask_loss = F.binary_cross_entropy_with_logits(mask_logits, mask_targets[:, :n_masks].reshape(-1, 28, 28))
        return rpn_loss + class_loss + box_loss + mask_loss

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        height, width = self.IMAGE_HW
        images = torch.randn(batch_size, 3, height, width)
        xy = torch.rand(batch_size, self.N_GT, 2) * torch.tensor([width * 0.7, height * 0.7])
        wh = torch.rand(batch_size, self.N_GT, 2) * 200 + 16
        gt_boxes = torch.cat([xy, xy + wh], dim=-1)
        gt_labels = torch.randint(1, self.N_CLASSES, (batch_size, self.N_GT))
        mask_targets = torch.randint(0, 2, (batch_size, self.MASK_ROIS, 28, 28)).float()
        return (images, gt_boxes, gt_labels, mask_targets), {}
