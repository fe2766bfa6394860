"""Zoo models that no library ships: a recurrent language model (LSTM or GRU) and a DLRM-style recommender."""

from __future__ import annotations

import itertools
from typing import ClassVar

import torch
from torch import nn

RNN_VOCAB_SIZE = 10_000
RECSYS_DENSE_FEATURES = 13
RECSYS_SPARSE_FEATURES = 26
RECSYS_ROWS_PER_TABLE = 10_000


class RecurrentLM(nn.Module):
    """Embedding -> 2-layer LSTM or GRU -> vocabulary projection (the classic word-level LM)."""

    _CELLS: ClassVar[dict[str, type[nn.LSTM] | type[nn.GRU]]] = {"lstm": nn.LSTM, "gru": nn.GRU}

    def __init__(self, cell: str = "lstm", vocab_size: int = RNN_VOCAB_SIZE, hidden_size: int = 512,
                 num_layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.rnn = self._CELLS[cell](hidden_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class MLPRecommender(nn.Module):
    """DLRM-style click model: bottom MLP on dense features, one embedding table per sparse feature,
    concatenation, top MLP to one logit."""

    def __init__(self, embed_dim: int = 64, rows_per_table: int = RECSYS_ROWS_PER_TABLE):
        super().__init__()
        self.bottom = _mlp([RECSYS_DENSE_FEATURES, 512, 256, embed_dim])
        self.tables = nn.ModuleList(nn.Embedding(rows_per_table, embed_dim) for _ in range(RECSYS_SPARSE_FEATURES))
        self.top = _mlp([embed_dim * (RECSYS_SPARSE_FEATURES + 1), 1024, 512, 256, 1])

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        parts = [self.bottom(dense)] + [table(sparse[:, i]) for i, table in enumerate(self.tables)]
        return self.top(torch.cat(parts, dim=1))
