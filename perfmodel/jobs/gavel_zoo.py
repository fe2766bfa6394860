"""The seven job types Gavel schedules (Narayanan et al., OSDI 2020; ../shared/datasets/gavel/PROVENANCE.md), in
plain `torch.nn`, each as one training step with its loss inside `forward`.

Gavel's `scheduler/job_table.py` builds each job's command and `workloads/pytorch/*` holds the training scripts;
every class below rebuilds the model one script trains, with that script's layers, sizes and the flags Gavel's
command line passes, and computes that script's loss in `forward`, so that the graph `torch.export` captures holds
the whole step's forward, loss included. The rules of `perfmodel.jobs.dle` hold here too:

- Every input's leading dimension is the batch; models that Gavel runs time-major (the LM) transpose inside.
- `example_inputs(batch_size, seq_len)` builds `(args, kwargs)` under the caller's device context; what `seq_len`
  means is each model's (the Transformer's padded sentence length, the LM's bptt, A3C's rollout length; the image
  models and the recommender ignore it).
- Static shapes: what a Gavel batch decides at run time (per-batch padding, the recommender's item set, A3C's
  early episode ends, CycleGAN's replay buffer) is given its static equivalent; each docstring says which.
- LSTM cells run step by step (A3C) are `perfmodel.jobs.dle.LSTMCell`: their two GEMMs appear in the graph.

The optimizer of each Gavel job (SGD with momentum, plain SGD, Adam) is named in its zoo description: a zoo entry
has no field for a default optimizer, the job spec's `optimizer` (default sgd) is what the step is priced with.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.compat import ensure_torchvision
from perfmodel.jobs.dle import LSTMCell, _need

Inputs = tuple[tuple, dict]

# --- ResNet-18 (CIFAR-10) and ResNet-50 (ImageNet) ----------------------------------------------------------------


class _BasicBlock(nn.Module):
    """kuangliu/pytorch-cifar `BasicBlock`: two 3x3 convs with batch norm, a 1x1 conv + BN shortcut when the shape
    changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    """Gavel's ResNet-18 job (`workloads/pytorch/image_classification/cifar10`, `models/resnet.py` of
    kuangliu/pytorch-cifar): a 3x3 stem conv 3 -> 64 at stride 1 with batch norm and no max-pool, four stages of two
    basic blocks (64, 128, 256, 512 channels, strides 1, 2, 2, 2), a 4x4 average pool and a linear layer to 10
    classes: 11,173,962 parameters. Loss: cross entropy (mean); Gavel trains it with SGD, momentum 0.9, weight
    decay 5e-4. Inputs: images (B, 3, 32, 32) and labels (B,)."""

    IMAGE_SIZE, NUM_CLASSES = 32, 10

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_BasicBlock(in_planes, planes, stride), _BasicBlock(planes, planes, 1)]
            in_planes = planes
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(images)))
        out = F.avg_pool2d(self.layers(out), 4)
        return F.cross_entropy(self.linear(out.flatten(1)), labels)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        images = torch.randn(batch_size, 3, self.IMAGE_SIZE, self.IMAGE_SIZE)
        return (images, torch.randint(0, self.linear.out_features, (batch_size,))), {}


class ImageNetResNet50(nn.Module):
    """Gavel's ResNet-50 job (`workloads/pytorch/image_classification/imagenet`, PyTorch's ImageNet example with
    `-a resnet50`): torchvision `resnet50(weights=None)`, 25,557,032 parameters, 224x224 crops, cross entropy
    (mean); SGD, momentum 0.9, weight decay 1e-4. Inputs: images (B, 3, 224, 224) and labels (B,)."""

    IMAGE_SIZE = 224

    def __init__(self) -> None:
        super().__init__()
        ensure_torchvision()
        import torchvision

        self.model = torchvision.models.resnet50(weights=None)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(images), labels)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        images = torch.randn(batch_size, 3, self.IMAGE_SIZE, self.IMAGE_SIZE)
        return (images, torch.randint(0, self.model.fc.out_features, (batch_size,))), {}


# --- Transformer (Multi30k) ---------------------------------------------------------------------------------------

PAD = 0  # transformer/Constants.py: PAD 0, UNK 1, BOS 2, EOS 3
# Vocabularies of `multi30k.atok.low.pt`, the file Gavel's command reads, as jadore801120's `preprocess.py` builds
# it (lower-cased, words seen more than 5 times, plus the four specials), source English, target German:
# src_vocab_size=2911, tgt_vocab_size=3149 and max_token_seq_len=52 (50 words + BOS/EOS), as a training run on that
# file prints them in its options.
MULTI30K_SRC_VOCAB, MULTI30K_TGT_VOCAB, MULTI30K_MAX_TOKEN_SEQ_LEN = 2911, 3149, 52


def sinusoid_table(n_position: int, d_hid: int, padding_idx: int | None = PAD) -> torch.Tensor:
    """`get_sinusoid_encoding_table` of Models.py: sin on even, cos on odd dimensions; the padding row zero."""
    position = torch.arange(n_position, dtype=torch.float64).unsqueeze(1)
    exponent = 2 * (torch.arange(d_hid) // 2).to(torch.float64) / d_hid
    table = position / torch.pow(10000.0, exponent)
    table[:, 0::2] = torch.sin(table[:, 0::2])
    table[:, 1::2] = torch.cos(table[:, 1::2])
    if padding_idx is not None:
        table[padding_idx] = 0.0
    return table.float()


class MultiHeadAttention(nn.Module):
    """SubLayers.py `MultiHeadAttention`: q, k, v projections to n_head x d_k, scaled dot products as bmm over
    (n_head * batch), masked_fill(-inf), softmax, dropout, fc back to d_model, dropout, residual + layer norm."""

    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k)
        self.w_ks = nn.Linear(d_model, n_head * d_k)
        self.w_vs = nn.Linear(d_model, n_head * d_v)
        self.layer_norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(n_head * d_v, d_model)
        self.dropout = dropout
        self.temperature = math.sqrt(d_k)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n_head, d_k, d_v = self.n_head, self.d_k, self.d_v
        b, len_q, len_k = q.size(0), q.size(1), k.size(1)
        residual = q
        q = self.w_qs(q).view(b, len_q, n_head, d_k).permute(2, 0, 1, 3).contiguous().view(-1, len_q, d_k)
        k = self.w_ks(k).view(b, len_k, n_head, d_k).permute(2, 0, 1, 3).contiguous().view(-1, len_k, d_k)
        v = self.w_vs(v).view(b, len_k, n_head, d_v).permute(2, 0, 1, 3).contiguous().view(-1, len_k, d_v)
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temperature
        attn = attn.masked_fill(mask.repeat(n_head, 1, 1), -math.inf)
        attn = F.dropout(F.softmax(attn, dim=2), self.dropout, self.training)
        out = torch.bmm(attn, v).view(n_head, b, len_q, d_v).permute(1, 2, 0, 3).contiguous().view(b, len_q, -1)
        out = F.dropout(self.fc(out), self.dropout, self.training)
        return self.layer_norm(out + residual)


class PositionwiseFeedForward(nn.Module):
    """SubLayers.py `PositionwiseFeedForward`: two 1x1 Conv1d (d_model -> d_inner -> d_model, ReLU), dropout,
    residual + layer norm."""

    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Conv1d(d_in, d_hid, 1)
        self.w_2 = nn.Conv1d(d_hid, d_in, 1)
        self.layer_norm = nn.LayerNorm(d_in)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.w_2(F.relu(self.w_1(x.transpose(1, 2)))).transpose(1, 2)
        return self.layer_norm(F.dropout(out, self.dropout, self.training) + x)


class _EncoderLayer(nn.Module):
    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout)

    def forward(self, x: torch.Tensor, non_pad_mask: torch.Tensor, slf_attn_mask: torch.Tensor) -> torch.Tensor:
        x = self.slf_attn(x, x, x, slf_attn_mask) * non_pad_mask
        return self.pos_ffn(x) * non_pad_mask


class _DecoderLayer(nn.Module):
    def __init__(self, d_model: int, d_inner: int, n_head: int, d_k: int, d_v: int, dropout: float) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout)

    def forward(self, x: torch.Tensor, enc_output: torch.Tensor, non_pad_mask: torch.Tensor,
                slf_attn_mask: torch.Tensor, dec_enc_attn_mask: torch.Tensor) -> torch.Tensor:
        x = self.slf_attn(x, x, x, slf_attn_mask) * non_pad_mask
        x = self.enc_attn(x, enc_output, enc_output, dec_enc_attn_mask) * non_pad_mask
        return self.pos_ffn(x) * non_pad_mask


def _key_pad_mask(seq_k: torch.Tensor, len_q: int) -> torch.Tensor:
    """`get_attn_key_pad_mask`: (B, len_q, len_k), True where the key is padding."""
    return seq_k.eq(PAD).unsqueeze(1).expand(-1, len_q, -1)


class Transformer(nn.Module):
    """Gavel's Transformer job (`workloads/pytorch/translation`, jadore801120/attention-is-all-you-need-pytorch of
    2018, run as `train.py -data multi30k.atok.low.pt -batch_size B -proj_share_weight`).

    - Encoder and decoder: 6 layers each, d_model 512, d_inner 2048 (1x1 Conv1d), 8 heads of d_k = d_v = 64,
      dropout 0.1, post-layer-norm sublayers whose outputs are multiplied by the non-padding mask.
    - Embeddings: source 2911 x 512 and target 3149 x 512 (Multi30k en -> de as `preprocess.py` builds it), plus
      frozen sinusoid position tables of 53 rows (a buffer here: Gavel's Adam skips them).
    - `-proj_share_weight`: the target projection (no bias) is the target embedding, logits scaled by
      d_model^-0.5. Gavel does not pass `-embs_share_weight`: source and target embeddings are separate.
    - Loss: Gavel does not pass `-label_smoothing`, so `cal_loss` is cross entropy summed over the non-padding
      target tokens (`ignore_index=PAD, reduction="sum"`); `label_smoothing=True` builds the smoothed variant of
      `cal_loss` instead (eps 0.1 over a one-hot scatter). The accuracy count `cal_performance` also does (an
      argmax over the logits, `.item()`) is left out.
    - Adam (betas 0.9, 0.98, eps 1e-9) with the warm-up schedule.

    47,241,216 parameters. Inputs: src_seq, src_pos, tgt_seq, tgt_pos (B, seq_len): seq_len is the padded sentence
    length with BOS/EOS, the same for source and target here (Gavel pads each to its batch's longest); the decoder
    reads tgt[:, :-1] and is scored against tgt[:, 1:]. Gavel's sentences have at most 52 tokens; a longer seq_len
    (e.g. the job spec's default 128) reuses the last position row, the same work.
    """

    position_table: torch.Tensor

    def __init__(self, n_src_vocab: int = MULTI30K_SRC_VOCAB, n_tgt_vocab: int = MULTI30K_TGT_VOCAB,
                 len_max_seq: int = MULTI30K_MAX_TOKEN_SEQ_LEN, d_model: int = 512, d_inner: int = 2048,
                 n_layers: int = 6, n_head: int = 8, d_k: int = 64, d_v: int = 64, dropout: float = 0.1,
                 label_smoothing: bool = False) -> None:
        super().__init__()
        self.n_src_vocab, self.n_tgt_vocab, self.n_position = n_src_vocab, n_tgt_vocab, len_max_seq + 1
        self.src_word_emb = nn.Embedding(n_src_vocab, d_model, padding_idx=PAD)
        self.tgt_word_emb = nn.Embedding(n_tgt_vocab, d_model, padding_idx=PAD)
        self.register_buffer("position_table", sinusoid_table(self.n_position, d_model), persistent=False)
        self.encoder_layers = nn.ModuleList(
            _EncoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout) for _ in range(n_layers))
        self.decoder_layers = nn.ModuleList(
            _DecoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout) for _ in range(n_layers))
        self.x_logit_scale = d_model ** -0.5  # the target projection is tgt_word_emb.weight (-proj_share_weight)
        self.label_smoothing = label_smoothing

    def forward(self, src_seq: torch.Tensor, src_pos: torch.Tensor, tgt_seq: torch.Tensor,
                tgt_pos: torch.Tensor) -> torch.Tensor:
        gold = tgt_seq[:, 1:]
        tgt_seq, tgt_pos = tgt_seq[:, :-1], tgt_pos[:, :-1]
        # encoder
        slf_attn_mask = _key_pad_mask(src_seq, src_seq.size(1))
        non_pad_mask = src_seq.ne(PAD).float().unsqueeze(-1)
        enc = self.src_word_emb(src_seq) + F.embedding(src_pos, self.position_table)
        for enc_layer in self.encoder_layers:
            enc = enc_layer(enc, non_pad_mask, slf_attn_mask)
        # decoder
        len_t = tgt_seq.size(1)
        non_pad_mask = tgt_seq.ne(PAD).float().unsqueeze(-1)
        subsequent = torch.triu(torch.ones(len_t, len_t, dtype=torch.uint8, device=tgt_seq.device), diagonal=1)
        slf_attn_mask = (_key_pad_mask(tgt_seq, len_t).byte() + subsequent.unsqueeze(0)).gt(0)
        dec_enc_attn_mask = _key_pad_mask(src_seq, len_t)
        dec = self.tgt_word_emb(tgt_seq) + F.embedding(tgt_pos, self.position_table)
        for dec_layer in self.decoder_layers:
            dec = dec_layer(dec, enc, non_pad_mask, slf_attn_mask, dec_enc_attn_mask)
        logits = F.linear(dec, self.tgt_word_emb.weight) * self.x_logit_scale
        pred, gold = logits.view(-1, logits.size(2)), gold.reshape(-1)
        if not self.label_smoothing:
            return F.cross_entropy(pred, gold, ignore_index=PAD, reduction="sum")
        eps = 0.1
        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (pred.size(1) - 1)
        loss = -(one_hot * F.log_softmax(pred, dim=1)).sum(dim=1)
        return (loss * gold.ne(PAD)).sum()  # Gavel's masked_select(...).sum(), as a static mask

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        _need(seq_len, 2, "gavel-transformer", "BOS + EOS: the decoder reads seq_len - 1 tokens")
        pos = torch.arange(1, seq_len + 1).clamp(max=self.n_position - 1).expand(batch_size, seq_len)
        src = torch.randint(PAD + 1, self.n_src_vocab, (batch_size, seq_len))
        tgt = torch.randint(PAD + 1, self.n_tgt_vocab, (batch_size, seq_len))
        return (src, pos.clone(), tgt, pos.clone()), {}


# --- LM (WikiText-2) ----------------------------------------------------------------------------------------------

WIKITEXT2_VOCAB = 33_278


class WordLanguageModel(nn.Module):
    """Gavel's LM job (`workloads/pytorch/language_modeling`, PyTorch's word_language_model example, run as
    `main.py --cuda --data wikitext2 --batch_size B`): `RNNModel("LSTM", 33278, 200, 200, 2, dropout=0.2)`.

    - Embedding 33,278 x 200, dropout 0.2, a 2-layer LSTM of 200 (dropout 0.2 between the layers), dropout 0.2,
      a linear decoder 200 -> 33,278 with bias. Gavel does not pass `--tied`: the decoder has its own weight.
      13,987,678 parameters.
    - The hidden state is carried from batch to batch, detached: initial (h, c) are inputs.
    - Loss: cross entropy (mean) over bptt x batch tokens; plain SGD (lr 20) after clipping the gradient norm to
      0.25 (the clipping is the optimizer's, not in the graph).

    Inputs: tokens and targets (B, seq_len) (Gavel's bptt is 35; it runs time-major: transposed inside), initial
    h and c (B, 2, 200).
    """

    def __init__(self, vocab_size: int = WIKITEXT2_VOCAB, emsize: int = 200, nhid: int = 200, nlayers: int = 2,
                 dropout: float = 0.2, tied: bool = False) -> None:
        super().__init__()
        self.vocab_size, self.nhid, self.nlayers, self.dropout = vocab_size, nhid, nlayers, dropout
        self.encoder = nn.Embedding(vocab_size, emsize)
        self.rnn = nn.LSTM(emsize, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, vocab_size)
        if tied:
            self.decoder.weight = self.encoder.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, h0: torch.Tensor,
                c0: torch.Tensor) -> torch.Tensor:
        emb = F.dropout(self.encoder(tokens.t()), self.dropout, self.training)  # (T, B, emsize)
        hidden = (h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous())
        output, _ = self.rnn(emb, hidden)
        decoded = self.decoder(F.dropout(output, self.dropout, self.training))
        return F.cross_entropy(decoded.view(-1, self.vocab_size), targets.t().reshape(-1))

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len))
        targets = torch.randint(0, self.vocab_size, (batch_size, seq_len))
        h0 = torch.zeros(batch_size, self.nlayers, self.nhid)
        return (tokens, targets, h0, torch.zeros_like(h0)), {}


# --- Recommendation (MovieLens-20M) -------------------------------------------------------------------------------

ML20M_ITEMS = 20_108  # items of the ml-20m `pro_sg` split (VAE-CF preprocessing) that Gavel's train.csv holds


class DynamicAutoencoder(nn.Module):
    """Gavel's Recommendation job (`workloads/pytorch/recommendation/train.py`, the recoder library):
    `DynamicAutoencoder(hidden_layers=[200], activation_type="tanh", noise_prob=0.5)` trained by `Recoder` with
    `loss="logistic"`, Adam (lr 1e-3, weight decay 2e-5) and mini-batch negative sampling.

    - Encoder: the input rows L2-normalised, dropout 0.5 (the input noise), a linear map whose weight is the rows
      of an item embedding (20,108 x 200) for the batch's items, plus a bias of 200, tanh. With one hidden size
      there are no further encoder or decoder layers.
    - Decoder: a linear map 200 -> the batch's items whose weight is the rows of a second item embedding and whose
      bias is the matching entries of a 20,108 bias vector; no activation (logits).
    - Loss: BCE-with-logits summed over the batch's users x items, divided by the batch size; the target is the
      input itself (train.py gives no separate target).
    8,063,508 parameters.

    The width (items in the batch): with negative sampling Gavel's batch holds the union of the items its users
    interacted with, a data-dependent width. Here it is static: every item (`n_batch_items` = 20,108, the full item
    count, an upper bound of that union). Gavel's measured steps/s fall as 1/batch from 512 to 8,192 users (samples/s
    about constant), which a width growing with the batch would not give: the union is near the full item set at
    these batch sizes, and the full count keeps the step's work linear in the batch.

    Inputs: the users' dense interaction rows (B, n_batch_items), 0/1 floats (what `to_dense()` of Gavel's sparse
    batch gives). The batch's item ids are a buffer (every item: arange), looked up as Gavel does.
    """

    item_ids: torch.Tensor

    def __init__(self, num_items: int = ML20M_ITEMS, hidden: int = 200, noise_prob: float = 0.5,
                 n_batch_items: int | None = None) -> None:
        super().__init__()
        self.num_items, self.noise_prob = num_items, noise_prob
        self.en_embedding = nn.Embedding(num_items, hidden)
        self.en_bias = nn.Parameter(torch.zeros(hidden))
        self.de_embedding = nn.Embedding(num_items, hidden)
        self.de_bias = nn.Parameter(torch.zeros(num_items))
        width = num_items if n_batch_items is None else n_batch_items
        self.register_buffer("item_ids", torch.arange(width), persistent=False)

    def forward(self, interactions: torch.Tensor) -> torch.Tensor:
        z = F.dropout(F.normalize(interactions, p=2, dim=1), self.noise_prob, self.training)
        z = torch.tanh(F.linear(z, self.en_embedding(self.item_ids).t(), self.en_bias))
        logits = F.linear(z, self.de_embedding(self.item_ids), self.de_bias.index_select(0, self.item_ids))
        loss = F.binary_cross_entropy_with_logits(logits, interactions, reduction="sum")
        return loss / interactions.size(0)

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        return (torch.randint(0, 2, (batch_size, self.item_ids.numel())).float(),), {}


# --- CycleGAN (monet2photo) ---------------------------------------------------------------------------------------


class _ResidualBlock(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(features, features, 3), nn.InstanceNorm2d(features), nn.ReLU(),
            nn.ReflectionPad2d(1), nn.Conv2d(features, features, 3), nn.InstanceNorm2d(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class GeneratorResNet(nn.Module):
    """PyTorch-GAN `GeneratorResNet` (eriklindernoren): reflection pad 3, 7x7 conv 3 -> 64, two stride-2 3x3 convs
    (128, 256), residual blocks of 256 (two 3x3 convs with reflection padding), two nearest x2 upsamplings each with
    a 3x3 conv (128, 64), reflection pad 3, 7x7 conv -> 3, tanh; instance norm (no affine) and ReLU after every conv
    but the last. 11,378,179 parameters with 9 blocks."""

    def __init__(self, channels: int = 3, n_residual_blocks: int = 9) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.ReflectionPad2d(channels), nn.Conv2d(channels, 64, 7), nn.InstanceNorm2d(64),
                                   nn.ReLU()]
        features = 64
        for _ in range(2):
            layers += [nn.Conv2d(features, features * 2, 3, stride=2, padding=1), nn.InstanceNorm2d(features * 2),
                       nn.ReLU()]
            features *= 2
        layers += [_ResidualBlock(features) for _ in range(n_residual_blocks)]
        for _ in range(2):
            layers += [nn.Upsample(scale_factor=2), nn.Conv2d(features, features // 2, 3, stride=1, padding=1),
                       nn.InstanceNorm2d(features // 2), nn.ReLU()]
            features //= 2
        layers += [nn.ReflectionPad2d(channels), nn.Conv2d(features, channels, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class PatchDiscriminator(nn.Module):
    """PyTorch-GAN CycleGAN `Discriminator`: four 4x4 stride-2 convs (64, 128, 256, 512; instance norm after all but
    the first, LeakyReLU 0.2), zero pad (1, 0, 1, 0), a 4x4 conv to 1 channel: a 16x16 patch map at 256x256.
    2,764,737 parameters."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for n_in, n_out, norm in ((channels, 64, False), (64, 128, True), (128, 256, True), (256, 512, True)):
            layers.append(nn.Conv2d(n_in, n_out, 4, stride=2, padding=1))
            if norm:
                layers.append(nn.InstanceNorm2d(n_out))
            layers.append(nn.LeakyReLU(0.2))
        layers += [nn.ZeroPad2d((1, 0, 1, 0)), nn.Conv2d(512, 1, 4, padding=1)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class CycleGAN(nn.Module):
    """Gavel's CycleGAN job (`workloads/pytorch/cyclegan/cyclegan.py`, from PyTorch-GAN, run as `cyclegan.py
    --dataset_path monet2photo --decay_epoch 0`): 256x256 images, batch 1, two `GeneratorResNet`s of 9 residual
    blocks (G_AB, G_BA) and two `PatchDiscriminator`s (D_A, D_B): 28,285,832 parameters. Adam (lr 2e-4, betas
    0.5, 0.999): one optimizer for both generators, one per discriminator.

    One Gavel step is a generator update then one update per discriminator. The graph holds all of their forwards:

    - generators: identity G_BA(A), G_AB(B) (L1); fakes G_AB(A), G_BA(B) scored by D_B, D_A (MSE to 1); cycles
      G_BA(G_AB(A)), G_AB(G_BA(B)) (L1); loss_G = GAN + 10 x cycle + 5 x identity (each term the mean of its A and B
      halves): six generator and two discriminator passes;
    - discriminators: D_A(A) (MSE to 1) and D_A(fake A, detached) (MSE to 0), the same for D_B: four passes.

    `forward` returns loss_G + loss_D_A + loss_D_B, so one backward does the work of Gavel's three: loss_G's
    backward runs through the discriminators and computes their weight gradients too (Gavel computes them, then
    `optimizer_D.zero_grad()` discards them), and the detached fakes stop the discriminator losses at the
    generators, as in Gavel. The sum's gradient of D differs from Gavel's (which drops loss_G's part); the work
    does not. Gavel's replay buffer (a fake from an earlier step half of the time) is the current fake here: the
    same shape and work.

    Inputs: real_A and real_B (B, 3, 256, 256): a sample is one (A, B) image pair.
    """

    IMAGE_SIZE = 256
    LAMBDA_CYC, LAMBDA_ID = 10.0, 5.0

    def __init__(self, n_residual_blocks: int = 9, image_size: int = IMAGE_SIZE) -> None:
        super().__init__()
        self.image_size = image_size
        self.G_AB = GeneratorResNet(3, n_residual_blocks)
        self.G_BA = GeneratorResNet(3, n_residual_blocks)
        self.D_A = PatchDiscriminator(3)
        self.D_B = PatchDiscriminator(3)

    def forward(self, real_A: torch.Tensor, real_B: torch.Tensor) -> torch.Tensor:
        loss_identity = (F.l1_loss(self.G_BA(real_A), real_A) + F.l1_loss(self.G_AB(real_B), real_B)) / 2
        fake_B = self.G_AB(real_A)
        score_fake_B = self.D_B(fake_B)
        fake_A = self.G_BA(real_B)
        score_fake_A = self.D_A(fake_A)
        loss_gan = (F.mse_loss(score_fake_B, torch.ones_like(score_fake_B))
                    + F.mse_loss(score_fake_A, torch.ones_like(score_fake_A))) / 2
        loss_cycle = (F.l1_loss(self.G_BA(fake_B), real_A) + F.l1_loss(self.G_AB(fake_A), real_B)) / 2
        loss_g = loss_gan + self.LAMBDA_CYC * loss_cycle + self.LAMBDA_ID * loss_identity
        return loss_g + self._d_loss(self.D_A, real_A, fake_A) + self._d_loss(self.D_B, real_B, fake_B)

    @staticmethod
    def _d_loss(discriminator: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        score_real, score_fake = discriminator(real), discriminator(fake.detach())
        return (F.mse_loss(score_real, torch.ones_like(score_real))
                + F.mse_loss(score_fake, torch.zeros_like(score_fake))) / 2

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        shape = (batch_size, 3, self.image_size, self.image_size)
        return (torch.rand(shape) * 2 - 1, torch.rand(shape) * 2 - 1), {}


# --- A3C (Pong) ---------------------------------------------------------------------------------------------------

PONG_ACTIONS = 6  # PongDeterministic-v4's action space


class A3Clstm(nn.Module):
    """dgriff777/rl_a3c_pytorch `A3Clstm` (Gavel's `workloads/pytorch/rl/model.py`): on a 1 x 80 x 80 frame (grey,
    cropped, resized, normalised), conv 5x5 (32, pad 2), conv 5x5 (32, pad 1), conv 4x4 (64, pad 1), conv 3x3
    (64, pad 1), each followed by a 2x2 max-pool and ReLU, to 64 x 4 x 4 = 1024; an LSTM cell 1024 -> 512; a critic
    head 512 -> 1 and an actor head 512 -> 6 actions. 3,249,639 parameters."""

    FRAME = (1, 80, 80)

    def __init__(self, num_actions: int = PONG_ACTIONS) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, stride=1, padding=2)
        self.conv2 = nn.Conv2d(32, 32, 5, stride=1, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 4, stride=1, padding=1)
        self.conv4 = nn.Conv2d(64, 64, 3, stride=1, padding=1)
        self.lstm = LSTMCell(1024, 512)
        self.critic_linear = nn.Linear(512, 1)
        self.actor_linear = nn.Linear(512, num_actions)

    def forward(self, frame: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        x = frame
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = F.relu(F.max_pool2d(conv(x), kernel_size=2, stride=2))
        hx, cx = self.lstm(x.flatten(1), state)
        return self.critic_linear(hx), self.actor_linear(hx), (hx, cx)


class A3C(nn.Module):
    """Gavel's A3C job (`workloads/pytorch/rl`, dgriff777/rl_a3c_pytorch, run as `main.py --env PongDeterministic-v4
    --workers 4 --amsgrad True`): one worker's training iteration on the shared `A3Clstm` as one step.

    - Rollout: `num_steps` (20, Gavel's default; seq_len here) forwards of the network, one frame each, the LSTM
      state carried from step to step; each step's softmax, log-softmax, entropy, a sampled action
      (`multinomial`) and its log-probability. The environment's frames are inputs (Gavel steps the Atari emulator
      on the CPU between the forwards; that time is not in the graph).
    - Bootstrap: one more forward on the frame after the rollout, its value detached (Gavel takes `.data`).
    - Loss (`train.py`): over the rollout backwards, returns R = gamma R + r, value loss 0.5 (R - V)^2, generalised
      advantage estimates (gamma 0.99, tau 1) from detached values, policy loss -log pi(a) GAE - 0.01 entropy;
      policy_loss + 0.5 value_loss, summed over the batch. Every rollout here runs its full length (Gavel's stops
      early when an episode ends, and then bootstraps from 0).
    - Shared Adam with amsgrad, on the shared model (Gavel's workers copy its weights before each rollout and their
      gradients into it after: not in the graph).

    "Batch" here: independent rollouts stacked along the leading dimension (one environment each). Gavel's job
    is batch 1 per worker, with 4 worker processes running such steps concurrently on the one GPU; the Gavel
    throughput counts worker 0's iterations. Inputs: frames (B, seq_len + 1, 1, 80, 80), the LSTM state carried
    from the previous rollout hx, cx (B, 512) and clipped rewards (B, seq_len).
    """

    GAMMA, TAU, ENTROPY_BETA = 0.99, 1.0, 0.01

    def __init__(self, num_actions: int = PONG_ACTIONS) -> None:
        super().__init__()
        self.net = A3Clstm(num_actions)

    def forward(self, frames: torch.Tensor, hx: torch.Tensor, cx: torch.Tensor,
                rewards: torch.Tensor) -> torch.Tensor:
        num_steps = rewards.size(1)
        values, log_probs, entropies = [], [], []
        state = (hx, cx)
        for t in range(num_steps):
            value, logit, state = self.net(frames[:, t], state)
            prob, log_prob = F.softmax(logit, dim=1), F.log_softmax(logit, dim=1)
            entropies.append(-(log_prob * prob).sum(1, keepdim=True))
            action = prob.detach().multinomial(1)
            log_probs.append(log_prob.gather(1, action))
            values.append(value)
        bootstrap, _, _ = self.net(frames[:, num_steps], state)
        values.append(bootstrap.detach())
        R = values[-1]
        gae = torch.zeros_like(R)
        policy_loss, value_loss = torch.zeros_like(R), torch.zeros_like(R)
        for t in reversed(range(num_steps)):
            reward = rewards[:, t:t + 1]
            R = self.GAMMA * R + reward
            advantage = R - values[t]
            value_loss = value_loss + 0.5 * advantage.pow(2)
            delta_t = reward + self.GAMMA * values[t + 1].detach() - values[t].detach()
            gae = gae * self.GAMMA * self.TAU + delta_t
            policy_loss = policy_loss - log_probs[t] * gae - self.ENTROPY_BETA * entropies[t]
        return (policy_loss + 0.5 * value_loss).sum()

    def example_inputs(self, batch_size: int, seq_len: int) -> Inputs:
        frames = torch.randn(batch_size, seq_len + 1, *A3Clstm.FRAME)
        hx = torch.zeros(batch_size, 512)
        rewards = torch.randint(-1, 2, (batch_size, seq_len)).float()
        return (frames, hx, torch.zeros_like(hx), rewards), {}

