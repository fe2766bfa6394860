"""A graph neural network over the IR graph: it predicts each node's forward and backward time, sums them, and adds
a learned per-graph optimizer and overhead time.

Inputs, one row per IR node (`NODE_INPUTS`): the node's forward feature row from `perfmodel.features.nodes`, its
backward row (zeros where the node does no backward work) and a `has_backward` flag. One vector per graph
(`GRAPH_INPUTS`): the hardware's features, the graph's totals and the job's optimizer and precision. Not the batch
size: the node shapes carry it, and a batch size outside the training range made the overhead head extrapolate
wildly. Both are standardised with the mean and std of the training set (saved in the manifest).

The network (a linear path next to the MLP in the node head lets log time grow with the work beyond the sizes seen
in training; the MLP path alone saturated and under-predicted the biggest models, e.g. VGG at batch 8):

    node inputs --linear--+--(+ linear(graph vector), broadcast)--> h0
    h_{l+1} = LayerNorm(h_l + relu(SAGE_down(h_l, producer->consumer) + SAGE_up(h_l, consumer->producer)))
    node head:  MLP(h_L) + linear(node inputs) -> log forward ms, log backward ms   (per node; exp, so >= 0)
    graph head: [mean(h_L), max(h_L), graph vector] -> log overhead ms, log optimizer factor
    optimizer ms = factor * param_bytes / bandwidth   (training graphs only)
    iteration = sum(forward) + sum(backward) + optimizer + overhead

Edges go both ways with separate weights, so a node sees what feeds it and what consumes it (fusion, cache reuse).
Node times are exp(log time) rather than softplus(...): node times span six decades, which a log output covers and a
softplus output does not; both are non-negative.

Loss: Huber on log(predicted iteration) - log(measured) (primary), plus `node_loss_weight` x the same on each node
whose time was measured (a node a per-op profile gave no time counts as ~0 ms), plus `unattributed_loss_weight` x
the same on optimizer + overhead against the measured unattributed time (where that is positive). The p10/p90
bounds are multiplicative factors: quantiles of log residuals on families held out from an inner fit
(`calibration_fraction` of the training families).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from perfmodel.core import cost
from perfmodel.core.errors import PerfmodelError
from perfmodel.features.nodes import NODE_FEATURES, hardware_features, node_feature_matrix
from perfmodel.features.sample import Sample
from perfmodel.jobs.spec import OptimizerName
from perfmodel.regressors.base import IterationPrediction
from perfmodel.regressors.manifest import Manifest, data_hash

NAME = "gnn"
PRECISION_FAMILIES = ("fp32", "fp16", "bf16", "amp")  # `Precision.family`: the math modes map onto these
WEIGHTS_FILE = "gnn.safetensors"

NODE_INPUTS: tuple[str, ...] = (
    *(f"fwd_{name}" for name in NODE_FEATURES),
    *(f"bwd_{name}" for name in NODE_FEATURES),
    "has_backward",
)
GRAPH_INPUTS: tuple[str, ...] = (
    "graph_log_hw_peak_gflops",
    "graph_log_hw_peak_fp16_gflops",  # the fp32 peak where the hardware has no separate half-precision peak
    "graph_log_hw_bandwidth_gb_s",
    "graph_hw_compute_units",
    "graph_hw_threads",
    "graph_hw_is_gpu",
    "graph_log_nodes",
    "graph_log_params",
    "graph_log_param_bytes",
    "graph_log_activation_bytes",
    "graph_log_flops_fwd",
    "graph_log_flops_bwd",
    "graph_is_train",
    *(f"graph_optimizer_{o.value}" for o in OptimizerName),
    *(f"graph_precision_{p}" for p in PRECISION_FAMILIES),
)
FEATURE_NAMES: tuple[str, ...] = NODE_INPUTS + GRAPH_INPUTS  # the manifest's columns: node inputs, then graph inputs

_MIN_MS = 1e-4  # floor for measured times before taking logs
_LOG_MS_RANGE = (-25.0, 15.0)  # clamp on predicted log-ms (exp stays finite)


# --- features ----------------------------------------------------------------------------------------------------


def _log(x: float) -> float:
    return math.log1p(max(float(x), 0.0))


def graph_vector(sample: Sample) -> np.ndarray:
    """The graph-level inputs of a sample, in `GRAPH_INPUTS` order."""
    totals, spec = sample.graph.totals, sample.spec
    values = {f"graph_{k}": v for k, v in hardware_features(sample.hardware).items()}
    hw = sample.hardware
    values.update(
        graph_log_hw_peak_fp16_gflops=math.log(hw.peak_fp16_gflops or hw.peak_fp32_gflops),
        graph_log_nodes=_log(totals.nodes),
        graph_log_params=_log(totals.params),
        graph_log_param_bytes=_log(totals.param_bytes),
        graph_log_activation_bytes=_log(totals.activation_bytes),
        graph_log_flops_fwd=_log(totals.flops_fwd),
        graph_log_flops_bwd=_log(totals.flops_bwd),
        graph_is_train=1.0 if sample.graph.mode == "train" else 0.0,
    )
    for o in OptimizerName:
        values[f"graph_optimizer_{o.value}"] = 1.0 if spec.optimizer == o else 0.0
    for p in PRECISION_FAMILIES:
        values[f"graph_precision_{p}"] = 1.0 if spec.precision.family == p else 0.0
    return np.asarray([values[name] for name in GRAPH_INPUTS], dtype=np.float32)


def node_inputs(sample: Sample) -> np.ndarray:
    """One row per IR node (graph order), in `NODE_INPUTS` order: forward row, backward row (or zeros), flag."""
    graph, width = sample.graph, len(NODE_FEATURES)
    index = {node.id: i for i, node in enumerate(graph.nodes)}
    rows = np.zeros((len(graph.nodes), len(NODE_INPUTS)), dtype=np.float32)
    matrix, keys = node_feature_matrix(graph, sample.hardware)
    for row, (node_id, phase) in zip(matrix, keys):
        i = index[node_id]
        if phase == "forward":
            rows[i, :width] = row
        else:
            rows[i, width:2 * width] = row
            rows[i, -1] = 1.0
    return rows


def edge_index(sample: Sample) -> np.ndarray:
    """(2, E) producer -> consumer node positions, from `node.inputs` (inputs that are not nodes are skipped)."""
    index = {node.id: i for i, node in enumerate(sample.graph.nodes)}
    pairs = [(index[src], i) for i, node in enumerate(sample.graph.nodes) for src in node.inputs if src in index]
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2).T.copy()


def optimizer_base_ms(sample: Sample) -> float:
    """Time to stream the parameters once at peak bandwidth (ms): the optimizer head scales this."""
    return float(cost.memory_ms(sample.graph.totals.param_bytes, sample.hardware.memory_bandwidth_gb_s))


def sample_key(sample: Sample) -> str:
    return f"{sample.spec.key()}@{sample.hardware.name}#{sample.profile_id}"


# --- the network -------------------------------------------------------------------------------------------------


class GNNNet(nn.Module):
    """The module itself: built from (n_node_inputs, n_graph_inputs, hidden, layers) only, so `load` can rebuild it."""

    def __init__(self, n_node_inputs: int, n_graph_inputs: int, hidden: int, layers: int) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.node_in = nn.Linear(n_node_inputs, hidden)
        self.graph_in = nn.Linear(n_graph_inputs, hidden)
        self.down = nn.ModuleList(SAGEConv(hidden, hidden) for _ in range(layers))  # producer -> consumer
        self.up = nn.ModuleList(SAGEConv(hidden, hidden, root_weight=False) for _ in range(layers))  # reverse
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.node_head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.node_skip = nn.Linear(n_node_inputs, 2, bias=False)  # log-linear path: extrapolates to bigger nodes
        self.graph_head = nn.Sequential(nn.Linear(2 * hidden + n_graph_inputs, hidden), nn.ReLU(),
                                        nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor, edges: torch.Tensor, batch: torch.Tensor, g: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, node inputs), edges (2, E), batch (N,), g (B, graph inputs) ->
        node log-ms (N, 2: forward, backward), graph logs (B, 2: overhead log-ms, optimizer log-factor)."""
        from torch_geometric.nn import global_max_pool, global_mean_pool

        h = torch.relu(self.node_in(x) + self.graph_in(g)[batch])
        reverse = edges.flip(0)
        for down, up, norm in zip(self.down, self.up, self.norms):
            h = norm(h + torch.relu(down(h, edges) + up(h, reverse)))
        node_log_ms = (self.node_head(h) + self.node_skip(x)).clamp(*_LOG_MS_RANGE)
        size = g.shape[0]
        pooled = torch.cat([global_mean_pool(h, batch, size), global_max_pool(h, batch, size), g], dim=1)
        graph_logs = self.graph_head(pooled).clamp(*_LOG_MS_RANGE)
        return node_log_ms, graph_logs


def _split_times(net: GNNNet, batch: Any) -> dict[str, torch.Tensor]:
    """Run the net on a PyG batch; node times (ms, masked to where a phase exists) and per-graph components."""
    from torch_geometric.utils import scatter

    node_log_ms, graph_logs = net(batch.x, batch.edge_index, batch.batch, batch.g)
    n_graphs = batch.g.shape[0]
    fwd_ms = node_log_ms[:, 0].exp()
    bwd_ms = node_log_ms[:, 1].exp() * batch.has_bwd
    overhead_ms = graph_logs[:, 0].exp()
    optimizer_ms = (graph_logs[:, 1] + batch.log_opt_base).exp() * batch.is_train
    forward = scatter(fwd_ms, batch.batch, dim=0, dim_size=n_graphs, reduce="sum")
    backward = scatter(bwd_ms, batch.batch, dim=0, dim_size=n_graphs, reduce="sum")
    return {"node_log_ms": node_log_ms, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "forward": forward,
            "backward": backward, "optimizer": optimizer_ms, "overhead": overhead_ms,
            "iteration": forward + backward + optimizer_ms + overhead_ms}


@contextlib.contextmanager
def _torch_runtime(threads: int) -> Iterator[None]:
    """At most `threads` CPU threads and deterministic algorithms, restored afterwards."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(max(1, min(threads, old_threads)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


# --- the estimator -----------------------------------------------------------------------------------------------


class GNNRegressor:
    """Iteration time = Σ per-node forward + Σ per-node backward + optimizer + overhead, all from one GNN."""

    name = NAME
    training_data_hash_: str | None  # None when loaded from a manifest that has none
    training_samples_: int | None

    def __init__(self, hidden: int = 64, layers: int = 3, epochs: int = 150, lr: float = 3e-3,
                 weight_decay: float = 1e-5, batch_graphs: int = 8, node_loss_weight: float = 0.2,
                 unattributed_loss_weight: float = 0.1, calibration_fraction: float = 0.25, threads: int = 1,
                 seed: int = 0) -> None:
        self.hidden = hidden
        self.layers = layers
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_graphs = batch_graphs
        self.node_loss_weight = node_loss_weight
        self.unattributed_loss_weight = unattributed_loss_weight
        self.calibration_fraction = calibration_fraction
        self.threads = threads
        self.seed = seed

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("hidden", "layers", "epochs", "lr", "weight_decay", "batch_graphs",
                                              "node_loss_weight", "unattributed_loss_weight",
                                              "calibration_fraction", "threads", "seed")}

    def __repr__(self) -> str:
        return f"GNNRegressor({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    # -- fit --

    def fit(self, samples: Sequence[Sample]) -> GNNRegressor:
        samples = list(samples)
        if not samples:
            raise PerfmodelError("gnn: no samples to fit")
        if any(s.iter_time_ms is None or s.iter_time_ms <= 0 for s in samples):
            raise PerfmodelError("gnn: every training sample needs a measured iter_time_ms > 0")
        with _torch_runtime(self.threads):
            raw = [_RawGraph.of(s) for s in samples]
            lo, hi, calibration = self._calibrate(samples, raw)
            self.net_, self.normalisation_ = self._train(raw)
            self.interval_ = (lo, hi)
            fitted = self._predict_raw(raw)
        measured = np.asarray([s.iter_time_ms for s in samples])
        self.metrics_ = {"train": _metrics(fitted["iteration"], measured), "calibration": calibration}
        self.training_data_hash_ = data_hash(sample_key(s) for s in samples)
        self.training_samples_ = len(samples)
        return self

    def _calibrate(self, samples: list[Sample], raw: list[_RawGraph]
                   ) -> tuple[float, float, dict[str, Any]]:
        """Multiplicative p10/p90 factors from an inner fit that holds out some training families."""
        families = sorted({s.family for s in samples})
        n_held = int(round(len(families) * self.calibration_fraction))
        if n_held < 1 or n_held >= len(families):
            return 1.0, 1.0, {"held_out_families": [], "note": "too few families to calibrate; zero-width"}
        order = np.random.default_rng(self.seed).permutation(len(families))
        held = {families[i] for i in order[:n_held]}
        inner = [r for r, s in zip(raw, samples) if s.family not in held]
        outer = [r for r, s in zip(raw, samples) if s.family in held]
        net, normalisation = self._train(inner)
        predicted = self._predict_raw(outer, net, normalisation)["iteration"]
        measured = np.asarray([r.iter_time_ms for r in outer])
        residuals = np.log(measured) - np.log(predicted)
        lo = float(min(1.0, math.exp(np.quantile(residuals, 0.1))))
        hi = float(max(1.0, math.exp(np.quantile(residuals, 0.9))))
        return lo, hi, {"held_out_families": sorted(held), "samples": len(outer), "p10_factor": lo,
                        "p90_factor": hi, **_metrics(predicted, measured)}

    def _train(self, raw: list[_RawGraph]) -> tuple[GNNNet, dict[str, Any]]:
        from torch_geometric.loader import DataLoader

        normalisation = _normalisation(raw)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's global RNG
            torch.manual_seed(self.seed)
            net = GNNNet(len(NODE_INPUTS), len(GRAPH_INPUTS), self.hidden, self.layers)
        _init_biases(net, raw)
        data = [r.to_data(normalisation) for r in raw]
        generator = torch.Generator().manual_seed(self.seed)
        loader = DataLoader(data, batch_size=self.batch_graphs, shuffle=True, generator=generator)
        optimiser = torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=max(1, self.epochs * len(loader)))
        net.train()
        for _ in range(self.epochs):
            for batch in loader:
                optimiser.zero_grad()
                loss = self._loss(_split_times(net, batch), batch)
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), 5.0)
                optimiser.step()
                schedule.step()
        net.eval()
        return net, normalisation

    def _loss(self, out: dict[str, torch.Tensor], batch: Any) -> torch.Tensor:
        huber = lambda a, b: F.smooth_l1_loss(a, b, beta=0.1)
        loss = huber(out["iteration"].log(), batch.log_iteration)
        measured = torch.cat([batch.fwd_measured, batch.bwd_measured])
        if self.node_loss_weight and bool(measured.any()):
            predicted = torch.cat([out["node_log_ms"][:, 0], out["node_log_ms"][:, 1]])
            targets = torch.cat([batch.log_fwd, batch.log_bwd])
            loss = loss + self.node_loss_weight * huber(predicted[measured], targets[measured])
        has_unattributed = batch.unattributed_measured
        if self.unattributed_loss_weight and bool(has_unattributed.any()):
            rest = (out["optimizer"] + out["overhead"]).log()
            loss = loss + self.unattributed_loss_weight * huber(rest[has_unattributed],
                                                                batch.log_unattributed[has_unattributed])
        return loss

    # -- predict --

    def predict(self, samples: Sequence[Sample]) -> IterationPrediction:
        self._check_fitted()
        with _torch_runtime(self.threads):
            out = self._predict_raw([_RawGraph.of(s) for s in samples])
        lo, hi = self.interval_
        return IterationPrediction(iter_time_ms=out["iteration"], p10_ms=out["iteration"] * lo,
                                   p90_ms=out["iteration"] * hi, forward_ms=out["forward"],
                                   backward_ms=out["backward"], optimizer_ms=out["optimizer"],
                                   overhead_ms=out["overhead"])

    def predict_nodes(self, samples: Sequence[Sample]) -> list[dict[tuple[str, str], float]]:
        """Per sample: predicted ms per (IR node id, phase), for the phases the node has."""
        self._check_fitted()
        result = []
        with _torch_runtime(self.threads), torch.no_grad():
            for sample in samples:
                raw = _RawGraph.of(sample)
                out = _split_times(self.net_, _collate([raw.to_data(self.normalisation_)]))
                times = {}
                for i, node in enumerate(sample.graph.nodes):
                    times[(node.id, "forward")] = float(out["fwd_ms"][i])
                    if raw.has_bwd[i]:
                        times[(node.id, "backward")] = float(out["bwd_ms"][i])
                result.append(times)
        return result

    def _predict_raw(self, raw: list[_RawGraph], net: GNNNet | None = None,
                     normalisation: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        net = net if net is not None else self.net_
        normalisation = normalisation if normalisation is not None else self.normalisation_
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("forward", "backward", "optimizer", "overhead")}
        with torch.no_grad():
            for start in range(0, len(raw), self.batch_graphs):
                chunk = raw[start:start + self.batch_graphs]
                out = _split_times(net, _collate([r.to_data(normalisation) for r in chunk]))
                for key in parts:
                    parts[key].append(out[key].double().numpy())
        result = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
        result["iteration"] = result["forward"] + result["backward"] + result["optimizer"] + result["overhead"]
        return result

    def _check_fitted(self) -> None:
        if not hasattr(self, "net_"):
            raise PerfmodelError("gnn: fit or load the regressor before predicting")

    # -- persistence --

    def save(self, directory: str | Path) -> Path:
        from safetensors.torch import save_file

        self._check_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.net_.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE))
        lo, hi = self.interval_
        normalisation = {**self.normalisation_, "target": "log ms", "interval": {"p10_factor": lo, "p90_factor": hi}}
        settings = {**self.get_params(), "architecture": {"n_node_inputs": len(NODE_INPUTS),
                                                          "n_graph_inputs": len(GRAPH_INPUTS),
                                                          "hidden": self.hidden, "layers": self.layers}}
        return Manifest(regressor=NAME, feature_names=FEATURE_NAMES, normalisation=normalisation, settings=settings,
                        artifacts=(WEIGHTS_FILE,), training_data_hash=self.training_data_hash_,
                        training_samples=self.training_samples_, metrics=self.metrics_).write(directory)

    @classmethod
    def load(cls, directory: str | Path) -> GNNRegressor:
        from safetensors.torch import load_file

        manifest = Manifest.read_for(directory, NAME)
        manifest.check_features(FEATURE_NAMES)
        settings = {k: v for k, v in manifest.settings.items() if k != "architecture"}
        model = cls(**settings)
        arch = manifest.settings["architecture"]
        net = GNNNet(arch["n_node_inputs"], arch["n_graph_inputs"], arch["hidden"], arch["layers"])
        net.load_state_dict(load_file(str(Path(directory) / WEIGHTS_FILE)), strict=True)
        net.eval()
        norm = manifest.normalisation
        model.net_ = net
        model.normalisation_ = {k: norm[k] for k in ("node_mean", "node_std", "graph_mean", "graph_std")}
        model.interval_ = (float(norm["interval"]["p10_factor"]), float(norm["interval"]["p90_factor"]))
        model.metrics_ = dict(manifest.metrics)
        model.training_data_hash_ = manifest.training_data_hash
        model.training_samples_ = manifest.training_samples
        return model


# --- data plumbing -----------------------------------------------------------------------------------------------


class _RawGraph:
    """A sample's unnormalised tensors (computed once per fit/predict)."""

    def __init__(self, x: np.ndarray, g: np.ndarray, edges: np.ndarray, has_bwd: np.ndarray,
                 log_opt_base: float, is_train: float, iter_time_ms: float | None,
                 fwd_ms: np.ndarray, bwd_ms: np.ndarray, unattributed_ms: float | None) -> None:
        self.x, self.g, self.edges, self.has_bwd = x, g, edges, has_bwd
        self.log_opt_base, self.is_train = log_opt_base, is_train
        self.iter_time_ms, self.fwd_ms, self.bwd_ms, self.unattributed_ms = iter_time_ms, fwd_ms, bwd_ms, \
            unattributed_ms

    def measured_ms(self) -> float:
        """The measured iteration time, which every training sample has."""
        if self.iter_time_ms is None:
            raise PerfmodelError("gnn: a training sample without a measured iteration time")
        return self.iter_time_ms

    @classmethod
    def of(cls, sample: Sample) -> _RawGraph:
        x = node_inputs(sample)
        ids = [node.id for node in sample.graph.nodes]
        times = sample.node_times_ms
        # a per-op profile attributes every timed call: a node it gave no time took ~0 (its glue is unattributed)
        missing = 0.0 if times else np.nan
        fwd = np.asarray([times.get((i, "forward"), missing) for i in ids], dtype=np.float64)
        bwd = np.asarray([times.get((i, "backward"), missing) for i in ids], dtype=np.float64)
        has_bwd = x[:, -1].astype(bool)
        bwd[~has_bwd] = np.nan
        return cls(x=x, g=graph_vector(sample), edges=edge_index(sample), has_bwd=has_bwd,
                   log_opt_base=math.log(max(optimizer_base_ms(sample), 1e-9)),
                   is_train=1.0 if sample.graph.mode == "train" else 0.0, iter_time_ms=sample.iter_time_ms,
                   fwd_ms=fwd, bwd_ms=bwd, unattributed_ms=sample.unattributed_ms)

    def to_data(self, normalisation: dict[str, Any]) -> Any:
        from torch_geometric.data import Data

        def std(values: np.ndarray, prefix: str) -> torch.Tensor:
            mean = np.asarray(normalisation[f"{prefix}_mean"], dtype=np.float32)
            scale = np.asarray(normalisation[f"{prefix}_std"], dtype=np.float32)
            return torch.from_numpy(((values - mean) / scale).astype(np.float32))

        def log_target(ms: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            measured = ~np.isnan(ms)
            logs = np.log(np.maximum(np.nan_to_num(ms, nan=1.0), _MIN_MS))
            return torch.from_numpy(logs.astype(np.float32)), torch.from_numpy(measured)

        log_fwd, fwd_measured = log_target(self.fwd_ms)
        log_bwd, bwd_measured = log_target(self.bwd_ms)
        iteration = self.iter_time_ms if self.iter_time_ms else 1.0
        unattributed = self.unattributed_ms if self.unattributed_ms and self.unattributed_ms > 0 else None
        return Data(
            x=std(self.x, "node"), edge_index=torch.from_numpy(self.edges), num_nodes=self.x.shape[0],
            g=std(self.g, "graph").unsqueeze(0), has_bwd=torch.from_numpy(self.has_bwd.astype(np.float32)),
            log_opt_base=torch.tensor([self.log_opt_base]), is_train=torch.tensor([self.is_train]),
            log_iteration=torch.tensor([math.log(max(iteration, _MIN_MS))]),
            log_fwd=log_fwd, fwd_measured=fwd_measured, log_bwd=log_bwd, bwd_measured=bwd_measured,
            log_unattributed=torch.tensor([math.log(max(unattributed or 1.0, _MIN_MS))]),
            unattributed_measured=torch.tensor([unattributed is not None]),
        )


def _collate(data: list[Any]) -> Any:
    from torch_geometric.data import Batch

    return Batch.from_data_list(data)


def _normalisation(raw: list[_RawGraph]) -> dict[str, Any]:
    """Per-column mean/std of node inputs (over all nodes) and graph inputs (over graphs); std 1 for constants."""
    def stats(matrix: np.ndarray) -> tuple[list[float], list[float]]:
        mean = matrix.mean(axis=0, dtype=np.float64)
        std = matrix.std(axis=0, dtype=np.float64)
        std[std < 1e-6] = 1.0
        return [float(v) for v in mean], [float(v) for v in std]

    node_mean, node_std = stats(np.concatenate([r.x for r in raw]))
    graph_mean, graph_std = stats(np.stack([r.g for r in raw]))
    return {"node_mean": node_mean, "node_std": node_std, "graph_mean": graph_mean, "graph_std": graph_std}


def _init_biases(net: GNNNet, raw: list[_RawGraph]) -> None:
    """Start the heads near the data: node heads at the median measured node time (or an even share of the
    iteration), the overhead head at the median unattributed time (or 5 % of the iteration)."""
    node_times = np.concatenate([np.concatenate([r.fwd_ms, r.bwd_ms]) for r in raw])
    node_times = node_times[node_times > 0]  # NaN (unmeasured) and 0 (no calls) compare False
    if node_times.size:
        node_log = float(np.median(np.log(np.maximum(node_times, _MIN_MS))))
    else:
        node_log = float(np.median([math.log(r.measured_ms() / (len(r.x) + r.has_bwd.sum())) for r in raw]))
    rest = [r.unattributed_ms for r in raw if r.unattributed_ms and r.unattributed_ms > 0]
    rest_log = float(np.median(np.log(rest))) if rest else float(np.median([math.log(0.05 * r.measured_ms())
                                                                             for r in raw]))
    with torch.no_grad():
        last_node, last_graph = net.node_head[-1], net.graph_head[-1]
        assert isinstance(last_node, nn.Linear) and isinstance(last_graph, nn.Linear)
        last_node.bias.fill_(node_log)
        last_graph.bias[0] = rest_log
        last_graph.bias[1] = math.log(4.0)  # optimizer ~ a few passes over the parameters


def _metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    ape = np.abs(predicted - measured) / measured
    return {"mape": float(ape.mean()), "median_ape": float(np.median(ape)), "n": int(len(measured))}
