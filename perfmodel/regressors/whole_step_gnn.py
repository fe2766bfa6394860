"""gnn-whole-step: the learned whole-step stage as a graph neural network over the job's graph (DNNPerf-style).

The same stage as `xgb-whole-step` (`perfmodel.regressors.whole_step`): it learns log(measured step / composed step)
of real training runs, and gives the median log factor and a calibrated 80 % band (`StepCorrection`). Besides the
composition features of the row (`COMPOSITION_FEATURES`: the composed step's mix, the graph's totals, the device's
spec sheet), it reads the job's graph IR, as DNNPerf (Gao et al., 2020) does: a message-passing network over the
computation graph with node features and a global vector.

Inputs:
- per IR node (`NODE_INPUTS`, a lean, hardware-independent subset of `perfmodel.features.nodes`): the op kind,
  log FLOPs and log bytes moved forward and backward, parameters, output and first-input sizes;
- per row (the global vector): the columns named by `feature_names`, in practice the composition features
  (`perfmodel.predictor.composition.COMPOSITION_FEATURES`, given by the caller: the regressors layer sits below the
  predictor's); a missing value, e.g. a GPU without a TDP, is the training mean.
Both are standardised with the training set's mean and std (saved in the manifest) and clipped to +-5 std.

The network (message passing as in `perfmodel.regressors.gnn`: separate weights for producer -> consumer and
consumer -> producer edges, residual, LayerNorm):

    h0 = relu(linear(node inputs))
    h_{l+1} = LayerNorm(h_l + relu(SAGE_down(h_l) + SAGE_up(h_l)))                       l < layers
    z = [weighted mean(h_L), max(h_L)]                                                  one per graph
    [median, low gap, high gap] = MLP([linear(z), linear(global vector)])               one per row
    p50 = median, p10 = median - softplus(low gap), p90 = median + softplus(high gap)   (never cross)

The node inputs hold no hardware, so a graph's embedding z is computed once per graph and shared by its rows (the
same job on 27 GPUs and two math modes); the hardware and the composed step's mix enter with the row's global
vector. Loss: pinball (quantile) loss of the three outputs on `log_ratio`; AdamW on mini-batches of whole graphs
(`batch_graphs`) with all their rows, cosine schedule.

Repeated structure is computed once. A `layers`-deep message-passing network gives the same embedding to nodes
whose `layers`-hop neighbourhoods look the same (the Weisfeiler-Lehman bound), e.g. the 550 unrolled decoder steps
of Tacotron 2 (33k IR nodes) or the identical layers of a transformer. Nodes are colour-refined `layers` times
(features, then the multisets of producer and consumer colours); the network runs on one representative per colour
(its edges mapped to their colours) and pools with each colour's node count as weight. The embedding is exactly
that of the whole graph at a fraction of the nodes (`compress_graph`; a test checks the equality): Tacotron 2's
33,080 IR nodes become 177, a Transformer-XL's 898 become 101 (Mask R-CNN's 2,263 only 1,094).

The p10/p90 band is conformal-calibrated as `xgb-whole-step`'s: on out-of-fold predictions of inner family folds
(`IntervalCalibration`, so the band is that of a family never seen). It follows the scikit-learn contract
(`__init__` stores settings, `fit` returns self, `predict` has no side effect; seeded, deterministic on CPU) and
saves as safetensors + `manifest.json` (never a pickle).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.features.nodes import KINDS, has_phase, node_cost
from perfmodel.regressors._xgb import IntervalCalibration, family_folds
from perfmodel.regressors.gnn import _torch_runtime
from perfmodel.regressors.manifest import Manifest, data_hash
from perfmodel.regressors.whole_step import TARGET, StepCorrection

NAME = "gnn-whole-step"
WEIGHTS_FILE = "gnn-whole-step.safetensors"
QUANTILES = (0.1, 0.5, 0.9)

NODE_INPUTS: tuple[str, ...] = (
    *(f"kind_{k}" for k in KINDS),
    "has_backward",
    "log_flops_fwd",
    "log_bytes_fwd",
    "log_flops_bwd",
    "log_bytes_bwd",
    "log_params",
    "log_out_numel",
    "log_in0_numel",
    "log_in0_last_dim",
    "log_in0_first_dim",
    "n_inputs",
)


# --- graphs ------------------------------------------------------------------------------------------------------


def node_inputs(graph: Graph) -> np.ndarray:
    """One row per IR node (graph order), in `NODE_INPUTS` order: nothing about the hardware."""
    kind_column = {k: i for i, k in enumerate(KINDS)}
    rows = np.zeros((len(graph.nodes), len(NODE_INPUTS)), dtype=np.float64)
    offset = len(KINDS)
    for i, node in enumerate(graph.nodes):
        flops_f, read_f, written_f = node_cost(node, "forward")
        flops_b, read_b, written_b = node_cost(node, "backward")
        first = node.input_tensors[0] if node.input_tensors else None
        rows[i, kind_column[node.kind.value]] = 1.0
        rows[i, offset:] = (
            float(has_phase(node, "backward")),
            math.log1p(flops_f), math.log1p(read_f + written_f),
            math.log1p(flops_b), math.log1p(read_b + written_b),
            math.log1p(node.params),
            math.log1p(sum(t.numel for t in node.output_tensors)),
            math.log1p(first.numel if first else 0),
            math.log1p(first.shape[-1] if first and first.shape else 0),
            math.log1p(first.shape[0] if first and first.shape else 0),
            float(len(node.input_tensors)),
        )
    return rows


@dataclass(frozen=True)
class CompressedGraph:
    """A graph's nodes merged by colour (`compress_graph`): one row per colour, its node count, and the edges of
    each colour's representative (producer -> consumer as `down`, consumer -> producer as `up`), by colour."""

    x: np.ndarray  # (colours, NODE_INPUTS)
    count: np.ndarray  # (colours,) IR nodes of each colour
    down: np.ndarray  # (2, E) source colour -> target colour: the target's producers
    up: np.ndarray  # (2, E') source colour -> target colour: the target's consumers
    nodes: int  # IR nodes of the graph
    rounds: int  # colour refinements: exact for networks of up to this many layers


def compress_graph(graph: Graph, rounds: int) -> CompressedGraph:
    """Colour refinement (1-WL) `rounds` times over node inputs and both edge directions; a `rounds`-layer
    mean-aggregation network over the result equals one over the whole graph, node for node."""
    x = node_inputs(graph)
    index = {node.id: i for i, node in enumerate(graph.nodes)}
    producers: list[list[int]] = [[index[s] for s in node.inputs if s in index] for node in graph.nodes]
    consumers: list[list[int]] = [[] for _ in graph.nodes]
    for i, sources in enumerate(producers):
        for s in sources:
            consumers[s].append(i)
    palette: dict[Any, int] = {}
    colour = [palette.setdefault(row.tobytes(), len(palette)) for row in x]
    for _ in range(rounds):
        palette = {}
        colour = [palette.setdefault((c, tuple(sorted(colour[s] for s in producers[i])),
                                      tuple(sorted(colour[t] for t in consumers[i]))), len(palette))
                  for i, c in enumerate(colour)]
    colours = np.asarray(colour, dtype=np.int64)
    n = int(colours.max()) + 1 if len(colours) else 0
    representative = np.full(n, -1, dtype=np.int64)
    for i in range(len(colours) - 1, -1, -1):  # the first node of each colour
        representative[colours[i]] = i
    count = np.bincount(colours, minlength=n).astype(np.float64)

    def edges(neighbours: list[list[int]]) -> np.ndarray:
        pairs = [(colour[j], c) for c, r in enumerate(representative) for j in neighbours[r]]
        return np.asarray(pairs, dtype=np.int64).reshape(-1, 2).T.copy()

    return CompressedGraph(x=x[representative], count=count, down=edges(producers), up=edges(consumers),
                           nodes=len(graph.nodes), rounds=rounds)


# --- the network -------------------------------------------------------------------------------------------------


class WholeStepNet(nn.Module):
    """Graph embedding (message passing, weighted mean + max pooling) and a row head over [embedding, globals]."""

    def __init__(self, n_node_inputs: int, n_globals: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.node_in = nn.Linear(n_node_inputs, hidden)
        self.down = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))  # from producers
        self.up = nn.ModuleList(SAGEConv(hidden, hidden, root_weight=False) for _ in range(layers))  # consumers
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.graph_proj = nn.Linear(2 * hidden, hidden)
        self.global_proj = nn.Linear(n_globals, hidden)
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, len(QUANTILES)))

    def embed(self, x: torch.Tensor, down: torch.Tensor, up: torch.Tensor, count: torch.Tensor,
              batch: torch.Tensor, n_graphs: int) -> torch.Tensor:
        """(graphs, 2 hidden): the count-weighted mean and the max of the final node states of each graph."""
        from torch_geometric.nn import global_max_pool
        from torch_geometric.utils import scatter

        h = torch.relu(self.node_in(x))
        for conv_down, conv_up, norm in zip(self.down, self.up, self.norms):
            h = norm(h + torch.relu(conv_down(h, down) + conv_up(h, up)))
        total = scatter(count, batch, dim=0, dim_size=n_graphs, reduce="sum").unsqueeze(1)
        mean = scatter(h * count.unsqueeze(1), batch, dim=0, dim_size=n_graphs, reduce="sum") / total
        return torch.cat([mean, global_max_pool(h, batch, n_graphs)], dim=1)

    def forward(self, graphs: _GraphBatch, graph_of_row: torch.Tensor, globals_: torch.Tensor) -> torch.Tensor:
        """(rows, 3): p10, p50, p90 of the log factor, sorted by construction."""
        z = self.embed(graphs.x, graphs.down, graphs.up, graphs.count, graphs.batch, graphs.n_graphs)
        out = self.head(self.graph_proj(z)[graph_of_row] + self.global_proj(globals_))
        median = out[:, 1]
        return torch.stack([median - F.softplus(out[:, 0]), median, median + F.softplus(out[:, 2])], dim=1)


@dataclass(frozen=True)
class _GraphBatch:
    """Compressed graphs stacked for one pass, their node inputs standardised."""

    x: torch.Tensor
    down: torch.Tensor
    up: torch.Tensor
    count: torch.Tensor
    batch: torch.Tensor
    n_graphs: int

    @classmethod
    def of(cls, graphs: Sequence[CompressedGraph], mean: np.ndarray, std: np.ndarray) -> _GraphBatch:
        offsets = np.cumsum([0, *(len(g.count) for g in graphs)])
        return cls(
            x=torch.from_numpy(np.clip((np.concatenate([g.x for g in graphs]) - mean) / std, -_CLIP, _CLIP)
                               .astype(np.float32)),
            down=torch.from_numpy(np.concatenate([g.down + o for g, o in zip(graphs, offsets)], axis=1)),
            up=torch.from_numpy(np.concatenate([g.up + o for g, o in zip(graphs, offsets)], axis=1)),
            count=torch.from_numpy(np.concatenate([g.count for g in graphs]).astype(np.float32)),
            batch=torch.from_numpy(np.repeat(np.arange(len(graphs)), np.diff(offsets))),
            n_graphs=len(graphs))


def _pinball(predicted: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    q = torch.tensor(QUANTILES, dtype=predicted.dtype)
    error = y.unsqueeze(1) - predicted
    return torch.maximum(q * error, (q - 1) * error).mean()


@dataclass(frozen=True)
class _Rows:
    """What fit and predict see: each row's graph (index into `graphs`, deduplicated) and raw global vector."""

    graphs: list[CompressedGraph]
    graph_of_row: np.ndarray
    globals_: np.ndarray

    def subset(self, rows: np.ndarray) -> _Rows:
        used, graph_of_row = np.unique(self.graph_of_row[rows], return_inverse=True)
        return _Rows([self.graphs[i] for i in used], graph_of_row, self.globals_[rows])


# --- the estimator -----------------------------------------------------------------------------------------------


class WholeStepGNN:
    """log(measured / composed step) from the job's graph and the row's composition features."""

    name = NAME
    training_hash_: str | None
    n_samples_: int | None

    def __init__(self, hidden: int = 32, layers: int = 3, epochs: int = 60, batch_graphs: int = 16, lr: float = 3e-3,
                 weight_decay: float = 1e-3, dropout: float = 0.1, inner_folds: int = 5, threads: int = 1,
                 seed: int = 0, feature_names: Sequence[str] = ()) -> None:
        self.hidden = hidden
        self.layers = layers
        self.epochs = epochs
        self.batch_graphs = batch_graphs
        self.lr = lr
        self.weight_decay = weight_decay
        self.dropout = dropout
        self.inner_folds = inner_folds
        self.threads = threads
        self.seed = seed
        self.feature_names = tuple(feature_names)

    _SETTINGS = ("hidden", "layers", "epochs", "batch_graphs", "lr", "weight_decay", "dropout", "inner_folds",
                 "threads", "seed", "feature_names")

    def get_params(self) -> dict[str, Any]:
        params = {k: getattr(self, k) for k in self._SETTINGS}
        params["feature_names"] = list(self.feature_names)
        return params

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.get_params().items() if k != "feature_names"}
        return f"WholeStepGNN({', '.join(f'{k}={v!r}' for k, v in shown.items())}, {len(self.feature_names)} features)"

    # -- data --

    def _rows(self, frame: pd.DataFrame, graphs: Sequence[Graph | CompressedGraph]) -> _Rows:
        missing = [name for name in self.feature_names if name not in frame]
        if missing:
            raise PerfmodelError(f"whole-step features missing: {missing}")
        if len(graphs) != len(frame):
            raise PerfmodelError(f"give one graph per row: {len(graphs)} graphs for {len(frame)} rows")
        position: dict[int, int] = {}  # one compression per distinct graph object
        unique: list[Graph | CompressedGraph] = []
        graph_of_row = np.empty(len(graphs), dtype=np.int64)
        for i, graph in enumerate(graphs):
            if id(graph) not in position:
                position[id(graph)] = len(unique)
                unique.append(graph)
            graph_of_row[i] = position[id(graph)]
        compressed = [self.compress(g) for g in unique]
        return _Rows(compressed, graph_of_row, frame[list(self.feature_names)].to_numpy(dtype=np.float64))

    def compress(self, graph: Graph | CompressedGraph) -> CompressedGraph:
        """The graph as this network reads it (`compress_graph` with `layers` rounds). `fit` and `predict` take
        graphs compressed by this, e.g. to compress each once across the folds of a cross-validation."""
        if not isinstance(graph, CompressedGraph):
            return compress_graph(graph, self.layers)
        if graph.rounds < self.layers:
            raise PerfmodelError(f"a graph compressed with {graph.rounds} rounds for a {self.layers}-layer network")
        return graph

    # -- fit --

    def fit(self, frame: pd.DataFrame, graphs: Sequence[Graph | CompressedGraph], groups: Sequence[str] | None = None,
            keys: Sequence[str] | None = None) -> WholeStepGNN:
        """Learn from `frame` (the feature columns and `log_ratio`) and each row's job graph (a `Graph`, or
        `self.compress(graph)`; rows of one job share one graph object, compressed once). `groups`: the model
        family of each row (inner folds for the interval never split one); `keys`: each row's identity, for the
        training-data hash."""
        if not self.feature_names:
            raise PerfmodelError("give the feature names to learn from (feature_names=...)")
        if TARGET not in frame or len(frame) < 5:
            raise PerfmodelError(f"need at least 5 rows with a {TARGET!r} column to fit the whole-step stage")
        y = frame[TARGET].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise PerfmodelError(f"{TARGET} must be finite")
        groups = list(groups) if groups is not None else [str(i) for i in range(len(frame))]
        with _torch_runtime(self.threads):
            rows = self._rows(frame, graphs)
            oof = np.zeros((len(y), len(QUANTILES)))
            for test in family_folds(groups, self.inner_folds):
                train = np.setdiff1d(np.arange(len(y)), test)
                net, normalisation = self._train(rows.subset(train), y[train])
                oof[test] = self._predict(net, normalisation, rows.subset(test))
            self.net_, self.normalisation_ = self._train(rows, y)
        self.calibration_ = IntervalCalibration.fit(np.exp(y), np.exp(oof[:, 0]), np.exp(oof[:, -1]),
                                                    QUANTILES[0], QUANTILES[-1])
        self.metrics_ = {"oof_mape_vs_measured": float(np.mean(np.abs(np.exp(oof[:, 1] - y) - 1.0))),
                         "composed_mape": float(np.mean(np.abs(np.exp(-y) - 1.0))), "rows": int(len(y)),
                         "groups": len(set(groups)), "graphs": len(rows.graphs),
                         "ir_nodes": int(sum(g.nodes for g in rows.graphs)),
                         "compressed_nodes": int(sum(len(g.count) for g in rows.graphs))}
        self.training_hash_ = data_hash(keys if keys is not None else map(str, range(len(y))))
        self.n_samples_ = len(y)
        return self

    def _train(self, rows: _Rows, y: np.ndarray) -> tuple[WholeStepNet, dict[str, list[float]]]:
        normalisation = _normalisation(rows)
        with torch.random.fork_rng(devices=[]):  # seeded init and dropout, the caller's global RNG untouched
            torch.manual_seed(self.seed)
            net = WholeStepNet(len(NODE_INPUTS), len(self.feature_names), self.hidden, self.layers, self.dropout)
            with torch.no_grad():  # start at the training median with a narrow band
                last = net.head[-1]
                assert isinstance(last, nn.Linear)
                last.bias.copy_(torch.tensor([-1.0, float(np.median(y)), -1.0]))
            # mini-batches of whole graphs with all their rows: each epoch passes every graph once
            rows_of_graph = [np.flatnonzero(rows.graph_of_row == g) for g in range(len(rows.graphs))]
            batches_per_epoch = math.ceil(len(rows.graphs) / self.batch_graphs)
            optimiser = torch.optim.AdamW(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
            steps = max(1, self.epochs * batches_per_epoch)
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=steps)
            generator = torch.Generator().manual_seed(self.seed)
            net.train()
            for _ in range(self.epochs):
                for chunk in torch.randperm(len(rows.graphs), generator=generator).split(self.batch_graphs):
                    picked = np.sort(np.concatenate([rows_of_graph[g] for g in chunk.tolist()]))
                    optimiser.zero_grad()
                    loss = _pinball(net(*_tensors(rows.subset(picked), normalisation)),
                                    torch.from_numpy(y[picked].astype(np.float32)))
                    loss.backward()
                    nn.utils.clip_grad_norm_(net.parameters(), 5.0)
                    optimiser.step()
                    schedule.step()
        net.eval()
        return net, normalisation

    # -- predict --

    @staticmethod
    def _predict(net: WholeStepNet, normalisation: dict[str, list[float]], rows: _Rows) -> np.ndarray:
        if len(rows.graph_of_row) == 0:
            return np.zeros((0, len(QUANTILES)))
        with torch.no_grad():
            return net(*_tensors(rows, normalisation)).double().numpy()

    def _check_fitted(self) -> None:
        if not hasattr(self, "net_"):
            raise PerfmodelError(f"{NAME} is not fitted: call fit(frame, graphs) or load(directory) first")

    def predict(self, frame: pd.DataFrame, graphs: Sequence[Graph | CompressedGraph]) -> StepCorrection:
        """Log factors for every row of `frame` (the feature columns) and its job graph; no side effects."""
        self._check_fitted()
        with _torch_runtime(self.threads):
            q = self._predict(self.net_, self.normalisation_, self._rows(frame, graphs))
        low, high = self.calibration_.apply(np.exp(q[:, 1]), np.exp(q[:, 0]), np.exp(q[:, 2]))
        return StepCorrection(q[:, 1], np.log(low), np.log(high))

    # -- persistence --

    def feature_columns(self) -> tuple[str, ...]:
        """The manifest's columns: the node inputs, then the global vector's."""
        return (*(f"node_{name}" for name in NODE_INPUTS), *self.feature_names)

    def save(self, directory: str | Path) -> Path:
        from safetensors.torch import save_file

        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.net_.state_dict().items()},
                  str(directory / WEIGHTS_FILE))
        return Manifest(
            regressor=NAME,
            feature_names=self.feature_columns(),
            normalisation={**self.normalisation_, "target": "log(measured step ms / composed step ms), natural log",
                           "interval": self.calibration_.to_json()},
            settings=self.get_params(),
            artifacts=(WEIGHTS_FILE,),
            training_data_hash=self.training_hash_,
            training_samples=self.n_samples_,
            metrics=self.metrics_,
        ).write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> WholeStepGNN:
        from safetensors.torch import load_file

        manifest = Manifest.read_for(directory, NAME)
        try:
            model = cls(**manifest.settings)
        except TypeError as exc:
            raise PerfmodelError(f"manifest settings do not fit {cls.__name__}: {exc}") from None
        manifest.check_features(model.feature_columns())
        net = WholeStepNet(len(NODE_INPUTS), len(model.feature_names), model.hidden, model.layers, model.dropout)
        net.load_state_dict(load_file(str(Path(directory) / WEIGHTS_FILE)), strict=True)
        net.eval()
        norm = manifest.normalisation
        model.net_ = net
        model.normalisation_ = {k: [float(v) for v in norm[k]] for k in _NORMALISATION_KEYS}
        model.calibration_ = IntervalCalibration.from_json(norm["interval"])
        model.metrics_ = dict(manifest.metrics)
        model.training_hash_ = manifest.training_data_hash
        model.n_samples_ = manifest.training_samples
        return model


# --- plumbing ----------------------------------------------------------------------------------------------------

_NORMALISATION_KEYS = ("node_mean", "node_std", "global_mean", "global_std")
_CLIP = 5.0  # standardised inputs are clipped to +-5 std: a job or GPU far outside the training data (a rare op
# kind's one-hot, an extreme host/device ratio) cannot drive the network into extrapolation


def _normalisation(rows: _Rows) -> dict[str, list[float]]:
    """Mean and std of the node inputs (over the IR nodes of the training graphs, each colour weighted by its
    count) and of the global vector (over the rows, ignoring missing values); std 1 for constants."""
    x = np.concatenate([g.x for g in rows.graphs])
    weight = np.concatenate([g.count for g in rows.graphs])
    node_mean = np.average(x, axis=0, weights=weight)
    node_std = np.sqrt(np.average((x - node_mean) ** 2, axis=0, weights=weight))
    present = np.isfinite(rows.globals_)
    counted = np.maximum(present.sum(axis=0), 1)
    global_mean = np.where(present, rows.globals_, 0.0).sum(axis=0) / counted
    global_std = np.sqrt(np.where(present, (rows.globals_ - global_mean) ** 2, 0.0).sum(axis=0) / counted)

    def listed(values: np.ndarray, std: bool = False) -> list[float]:
        return [1.0 if std and v < 1e-6 else float(v) for v in values]

    return {"node_mean": listed(node_mean), "node_std": listed(node_std, std=True),
            "global_mean": listed(global_mean), "global_std": listed(global_std, std=True)}


def _tensors(rows: _Rows, normalisation: dict[str, list[float]]) -> tuple[_GraphBatch, torch.Tensor, torch.Tensor]:
    graphs = _GraphBatch.of(rows.graphs, np.asarray(normalisation["node_mean"]),
                            np.asarray(normalisation["node_std"]))
    standard = (rows.globals_ - np.asarray(normalisation["global_mean"])) / np.asarray(normalisation["global_std"])
    standard = np.clip(np.nan_to_num(standard, nan=0.0), -_CLIP, _CLIP)
    globals_ = torch.from_numpy(standard.astype(np.float32))
    return graphs, torch.from_numpy(rows.graph_of_row), globals_
