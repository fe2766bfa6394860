"""What throughput job X reaches on placement Y: per-device compute from the single-device predictors plus the
placement model (`perfmodel.placement.iteration`) for communication, pipelining and memory.

    predictor = PlacementPredictor.load()
    predictor.predict(spec, PlacementSpec.grid("a100-sxm4-80gb", nodes=2, per_node=8, global_batch_size=512))

The compute of one micro-batch on one device (`ShardCompute`) comes from the CPU iteration model (role
`cpu-step`, the host the corpus was profiled on) or the per-op device model (role `device-ops`, any catalog GPU),
and is cached per (job, accelerator, micro-batch): a scheduler's repeated questions about one job only redo the
array arithmetic of the placement model. `predict_matrix` answers jobs × placements in one vectorised call.

Every cache is a bounded LRU (`cache_size` entries each), so a long-lived process asked about any number of
distinct jobs keeps bounded memory. Graphs at another micro-batch than a job's own come from `graphs` (a callable;
the prediction engine passes its single-flight, capture-locked graph cache) or, without it, from `graph_for_job`.

Links (`placement_links`, no predictor needed): the intra-node link by the catalog's `peer_to_peer` (NVLink,
PCIe P2P, or staged through host memory: `perfmodel.placement.comm`), or the link the placement names; the
network is the placement's `inter_node_bandwidth_gbit_s` (Gb/s per node), else the catalog's `node_network_gbit_s`,
else 100 Gb/s, split over the NIC rails it implies (`comm.network_rails`: up to one per device of the catalog's
typical node, `node_devices`).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph, MoEInfo
from perfmodel.core.lru import LRU
from perfmodel.core.units import us_to_ms
from perfmodel.graph.batch_affine import BatchAffine
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec, Precision
from perfmodel.jobs.zoo import items_of
from perfmodel.placement.comm import (
    DEFAULT_NODE_NETWORK_GBIT_S,
    LinkModel,
    host_staged_link,
    link_for_accelerator,
    network_rails,
    node_network_link,
    pcie_p2p_link,
    peer_to_peer_mode,
)
from perfmodel.placement.iteration import (
    ComputeArrays,
    IterationParams,
    PlacementArrays,
    ShardCompute,
    ddp_last_bucket_bytes,
    iteration_breakdown,
    layer_stats,
    load_params,
    steps_vary_code,
)
from perfmodel.placement.spec import PlacementSpec
from perfmodel.predictor.batch_sweep import GraphLine, RowLine, Sweep, table_key
from perfmodel.predictor.math_modes import FASTER_FLOAT32, FLOAT32_MATHS, faster_twins
from perfmodel.predictor.memory import GraphBytes, bytes_per_param, estimate_memory, usable_memory_bytes
from perfmodel.predictor.predict import Prediction
from perfmodel.predictor.whole_step import WholeStepStage

if TYPE_CHECKING:
    from perfmodel.predictor.gpu_iteration import DevicePredictor

# datasheet GPU-to-GPU bandwidth of the links a placement may name instead of the catalog's, GB/s bidirectional
INTRA_LINK_BIDIR_GB_S = {"nvlink1": 160.0, "nvlink2": 300.0, "nvlink3": 600.0, "nvlink4": 900.0, "nvlink5": 1800.0,
                         "infinity-fabric": 400.0}
BREAKDOWN_KEYS = ("forward", "backward", "optimizer", "communication", "pipeline_bubble", "overhead")
DEFAULT_CACHE_SIZE = 4096  # entries of each cache (computes, memory estimates, links, graphs)
# links per (accelerator, link, network bandwidth, devices on the smallest node): a fleet has a few networks, and a
# stream of bodies naming new ones must not grow memory; a miss costs ~10 us
LINKS_CACHE_SIZE = 1024


HOST_LINK = "host"  # the intra-node link a placement names when its GPUs have no peer-to-peer


def intra_link(hardware: HardwareSpec, override: str | None) -> LinkModel:
    """The intra-node link of `hardware` (by its `peer_to_peer`), or of the link a placement names instead (same
    efficiency rule; naming a link says the GPUs use it peer to peer, except "host": staged through host memory)."""
    if override is None:
        mode = peer_to_peer_mode(hardware)
        if mode == "none":
            return host_staged_link(hardware)
        return pcie_p2p_link(hardware) if mode == "pcie" else link_for_accelerator(hardware)
    if override == HOST_LINK:
        return host_staged_link(hardware)
    if override.startswith("pcie"):
        spec = hardware.model_copy(update={"interconnect": "pcie", "interconnect_bidir_gb_s": None,
                                           "pcie_gen": int(override.removeprefix("pcie"))})
    else:
        spec = hardware.model_copy(update={"interconnect": override,
                                           "interconnect_bidir_gb_s": INTRA_LINK_BIDIR_GB_S[override]})
    return link_for_accelerator(spec)


def node_network_gbit_s(placement: PlacementSpec, hardware: HardwareSpec) -> float:
    """A node's network, Gb/s over all its NICs: the placement's, else the catalog's, else 100."""
    for value in (placement.inter_node_bandwidth_gbit_s, hardware.node_network_gbit_s):
        if value is not None:
            return float(value)
    return DEFAULT_NODE_NETWORK_GBIT_S


def placed_interval(single_ms: tuple[float, float], iter_time_ms: float, ratio: float, spread: float,
                    scaling_band_log: tuple[float, float]) -> tuple[float, float]:
    """The band of a placement's step: one device's band scaled by the placement's step ratio, the wait for the
    slowest replica spanning from none (replicas in step) to twice the fitted one (`spread`: the wait over one
    device's step), and the placement model's own error (`scaling_band_log`: its p10 and p90 in log) added to that
    in quadrature (the two are independent errors: one device's step, and how the placement scales it)."""
    low, high = single_ms[0] * (ratio - spread), single_ms[1] * (ratio + spread)
    band_low, band_high = scaling_band_log
    if iter_time_ms <= 0 or (band_low == 0.0 and band_high == 0.0) or low <= 0:
        return low, high
    log_low = -math.hypot(min(math.log(low / iter_time_ms), 0.0), min(band_low, 0.0))
    log_high = math.hypot(max(math.log(high / iter_time_ms), 0.0), max(band_high, 0.0))
    return iter_time_ms * math.exp(log_low), iter_time_ms * math.exp(log_high)


@dataclass(frozen=True)
class _Links:
    intra: LinkModel
    inter: LinkModel
    host_staged: bool = False


_NO_LINK = LinkModel(0.0, 0.0, "none", "one device")
_NO_LINKS = _Links(_NO_LINK, _NO_LINK)


def placement_links(placement: PlacementSpec, hardware: HardwareSpec, intra: LinkModel | None = None) -> _Links:
    """The intra-node link (`intra`, if the caller has it) and what the placement's fewest-device node gets of its
    network (`comm.network_rails`: a node with fewer devices than rails uses only its devices' rails)."""
    if placement.devices == 1:
        return _NO_LINKS
    if hardware.kind != "gpu":
        raise PerfmodelError(f"placement.accelerator: multi-device placements need a GPU; {hardware.name} is a "
                             f"{hardware.kind}")
    host_staged = placement.intra_node_link == HOST_LINK or (
        placement.intra_node_link is None and peer_to_peer_mode(hardware) == "none")
    gbit_s = node_network_gbit_s(placement, hardware)
    network = node_network_link(gbit_s, placement.inter_node_latency_us,
                                rails=network_rails(gbit_s, hardware.node_devices),
                                devices=min(placement.devices_per_node))
    intra = intra if intra is not None else intra_link(hardware, placement.intra_node_link)
    return _Links(intra, network, host_staged)


class SingleDevice(Protocol):
    """What prices one device's step: the CPU step model (`predict.Predictor`) or the per-op device model
    (`gpu_iteration.DevicePredictor`, which also composes: `predict_composed`)."""

    model_version: str

    def predict(self, spec: JobSpec, accelerator: str, *, graph: Any = None) -> Prediction: ...


class PlacementPredictor:
    """Single-device predictors (CPU iteration model, per-op device model) + the placement model."""

    def __init__(self, cpu: SingleDevice | None, device: DevicePredictor | None,
                 params: IterationParams | None = None, *,
                 cache_size: int = DEFAULT_CACHE_SIZE, graphs: Callable[[JobSpec], Graph] | None = None,
                 whole_step: WholeStepStage | None = None,
                 batch_models: Callable[[JobSpec], BatchAffine | None] | None = None):
        self.cpu = cpu
        self.device = device
        self.params = params or IterationParams()
        self.cache_size = cache_size
        self._graph_source = graphs
        self._computes: LRU[tuple[str, str, int], tuple[ShardCompute, Prediction]] = LRU(cache_size)
        self._graphs: LRU[str, Graph] = LRU(cache_size)
        self._memory: LRU[tuple[Any, ...], int] = LRU(cache_size)
        self._hardware: dict[str, HardwareSpec] = {}  # bounded by the catalog
        self._links: LRU[tuple[Any, ...], _Links] = LRU(min(cache_size, LINKS_CACHE_SIZE))
        self._intra: LRU[tuple[str, str | None], LinkModel] = LRU(cache_size)
        self._catalog: dict[str, HardwareSpec] | None = None
        # composed (uncorrected) steps and their composition features, per (job, accelerator, micro-batch)
        self._compositions: LRU[tuple[str, str, int], tuple[Prediction, dict[str, float]]] = LRU(cache_size)
        self.whole_step = whole_step
        # every batch of a job from its graphs at two batches (`batch_sweep`): the checked affine model of a job's
        # graph (the engine's), its lines per job and per (job, math table), what memory reads of each graph
        self._batch_models = batch_models
        self._graph_lines: LRU[str, GraphLine] = LRU(cache_size)
        self._row_lines: LRU[tuple[str, Any], RowLine | bool] = LRU(cache_size)
        self._graph_bytes: LRU[str, GraphBytes] = LRU(cache_size)
        # composed steps corrected by the whole-step stage (`prefetch` corrects all of its steps in one call)
        self._corrected: LRU[tuple[str, str, int], Prediction] = LRU(cache_size)
        # each device compute's fields as the floats one prediction's placement model takes
        self._compute_floats: LRU[ShardCompute, ComputeArrays] = LRU(cache_size)

    @classmethod
    def load(cls, models_dir: Any = None, model_version: str | None = None, *,
             refs: Mapping[str, str | None] | None = None, cache_size: int = DEFAULT_CACHE_SIZE,
             graphs: Callable[[JobSpec], Graph] | None = None,
             batch_models: Callable[[JobSpec], BatchAffine | None] | None = None) -> PlacementPredictor:
        """The promoted models of both roles; `model_version` (NAME/VERSION) replaces the one of its role, and
        `refs` ({role: NAME/VERSION or None}) names the model of each role it gives (None: the registry's promoted
        one). Raises if an artifact does not load."""
        from perfmodel.predictor.gpu_iteration import DevicePredictor
        from perfmodel.predictor.predict import Predictor
        from perfmodel.registry.registry import ModelRegistry, role_of

        registry = ModelRegistry(models_dir)
        chosen: dict[str, str | None] = {"cpu-step": None, "device-ops": None, **(refs or {})}
        if model_version is not None:
            entry = registry.get(model_version)  # a non-None ref resolves by name, whatever the role
            chosen[role_of(entry.manifest.regressor)] = entry.ref
        cpu = (Predictor.load(chosen["cpu-step"], models_dir)
               if _has_role(registry, chosen["cpu-step"], "cpu-step") else None)
        device = (DevicePredictor.load(chosen["device-ops"], models_dir)
                  if _has_role(registry, chosen["device-ops"], "device-ops") else None)
        if cpu is None and device is None:
            raise PerfmodelError(f"no promoted model in {registry.root}: train one (`perfmodel train`) and promote it")
        whole_step = WholeStepStage.load(chosen.get("whole-step"), models_dir) if device is not None else None
        return cls(cpu, device, load_params(), cache_size=cache_size, graphs=graphs, whole_step=whole_step,
                   batch_models=batch_models)

    def cache_sizes(self) -> dict[str, int]:
        """Entries held by each cache (each at most `cache_size`)."""
        return {"computes": len(self._computes), "graphs": len(self._graphs), "memory": len(self._memory),
                "links": len(self._links), "graph_lines": len(self._graph_lines)}

    @property
    def model_versions(self) -> dict[str, str]:
        out = {}
        if self.cpu is not None:
            out["cpu-step"] = self.cpu.model_version
        if self.device is not None:
            out["device-ops"] = self.device.model_version
        if self.whole_step is not None:
            out["whole-step"] = self.whole_step.model_version
        return out

    # --- compute of one device --------------------------------------------------------------------------------------

    def _single(self, hardware: HardwareSpec) -> SingleDevice:
        # a CPU with its own measurements (`perfmodel hw bench --device cpu`) is one more device of the device model
        own = self.device is not None and hardware.name in getattr(self.device.regressor, "devices", ())
        predictor = self.device if hardware.kind == "gpu" or own else self.cpu
        if predictor is None:
            role = "device-ops" if hardware.kind == "gpu" else "cpu-step"
            raise PerfmodelError(f"no {role} model loaded: cannot predict {hardware.name}")
        return predictor

    def compute(self, spec: JobSpec, hardware: HardwareSpec, micro_batch_size: int, *,
                graph: Graph | None = None) -> tuple[ShardCompute, Prediction]:
        """One micro-batch of `spec`'s model on one `hardware` device, and its single-device prediction (cached).
        `graph`, if given, is `spec`'s graph at `spec.batch_size`; other batch sizes come from the job's lines
        (`batch_sweep`) where its graph is affine in the batch, else from its graph at that batch."""
        key = (spec.key(), hardware.name, micro_batch_size)
        cached = self._computes.get(key)
        if cached is not None:
            return cached
        own = graph if graph is not None and micro_batch_size == spec.batch_size else None
        if own is not None:
            self._graphs.setdefault(spec.graph_key(), own)
        micro_spec = spec.model_copy(update={"batch_size": micro_batch_size})
        if key not in self._compositions:
            self.prefetch([(spec, hardware, micro_batch_size, graph)])  # composed from the job's lines, if it has
        lines = None if own is not None else self._graph_line(spec)
        micro_graph: Graph | None = None
        if lines is not None:  # no graph made at this batch
            stats = lines.graph_bytes(spec.precision, micro_batch_size)
        else:
            micro_graph = own if own is not None else self._graph(micro_spec)
            stats = self._bytes_of(micro_spec, micro_graph)
        single = self._single_step(spec, micro_spec, hardware, micro_graph)
        b = single.breakdown_ms
        blocks, block_bytes = layer_stats(stats.block_outputs())
        per_param = bytes_per_param(spec.precision, spec.optimizer, spec.mode)
        moe = stats.moe
        compute = ShardCompute(
            forward_ms=b["forward"], backward_ms=b["backward"], optimizer_ms=b["optimizer"],
            overhead_ms=b.get("overhead", 0.0), params=stats.params_total,
            gradient_bytes_per_param=per_param.gradients if spec.mode.value == "train" else 0,
            layers=blocks, layer_activation_bytes=block_bytes, **moe_fields(moe, spec.precision),
            host_forward_ms=(single.host_issue_ms or {}).get("forward", 0.0),
            host_backward_ms=(single.host_issue_ms or {}).get("backward", 0.0),
            last_bucket_bytes=ddp_last_bucket_bytes(stats.params.tolist(), per_param.gradients)
            if spec.mode.value == "train" else 0,
            steps_vary=steps_vary_code(spec.steps_vary))
        self._computes.put(key, (compute, single))
        if micro_graph is not None:
            self._graphs.setdefault(micro_spec.graph_key(), micro_graph)
        return compute, single

    def _single_step(self, spec: JobSpec, micro_spec: JobSpec, hardware: HardwareSpec,
                     graph: Graph | None) -> Prediction:
        """One device's step of `micro_spec`: the single-device predictor's, corrected by the learned whole-step
        stage where one is loaded and the device model composed it (`composition` keeps what it was made of).
        `graph` (None: composed already) is the job's graph at the micro-batch."""
        predictor = self._single(hardware)
        compose = getattr(predictor, "predict_composed", None)
        key = (spec.key(), hardware.name, micro_spec.batch_size)
        corrected = self._corrected.get(key)
        if corrected is not None and self.whole_step is not None:
            return corrected
        composed = self._compositions.get(key)
        if compose is None or (composed is None and graph is None):
            graph = graph if graph is not None else self._graph(micro_spec)
            if compose is None:
                return predictor.predict(micro_spec, hardware.name, graph=graph)
        if composed is None:
            composed = self._compositions.put(key, compose(micro_spec, hardware.name, graph=graph))
        single, features = composed
        if self.whole_step is None:
            return single
        return self._floored(spec, micro_spec.batch_size, hardware,
                             self.whole_step.correct_job(single, features, spec, hardware), graph)

    def _floored(self, spec: JobSpec, micro: int, hardware: HardwareSpec, step: Prediction,
                 graph: Graph | None = None) -> Prediction:
        """A float32 job's corrected one-device `step` (at micro-batch `micro`) with each part at least its faster
        twins' (`WholeStepStage.at_least`; their steps from the cache, else composed now). `graph`: the job's graph
        at that micro-batch, if made."""
        twins = faster_twins(spec.precision, hardware)
        if not twins:
            return step
        assert self.whole_step is not None
        found = []
        for twin in twins:
            twin_spec = spec.model_copy(update={"precision": twin})
            cached = self._corrected.get((twin_spec.key(), hardware.name, micro))
            found.append(cached if cached is not None else self._single_step(
                twin_spec, twin_spec.model_copy(update={"batch_size": micro}), hardware, graph))
        return self.whole_step.at_least(step, found)

    def _bytes_of(self, micro_spec: JobSpec, graph: Graph) -> GraphBytes:
        """What memory reads of `micro_spec`'s graph (cached: many placements share a micro-batch)."""
        key = f"{micro_spec.graph_key()}:{micro_spec.precision.value}"  # its graph and its precision alone
        found = self._graph_bytes.get(key)
        return found if found is not None else self._graph_bytes.put(key, GraphBytes.of(graph, micro_spec.precision))

    def _graph_line(self, spec: JobSpec) -> GraphLine | None:
        """The job's graph at any batch from the engine's affine model of it (None: none yet, or not affine)."""
        if self._batch_models is None:
            return None
        family = spec.model_copy(update={"batch_size": 1}).graph_key()  # one per graph: every math, every optimizer
        found = self._graph_lines.get(family)
        if found is not None:
            return found
        model = self._batch_models(spec)
        made = None if model is None else GraphLine.of(model.first, model.batch_first, model.second,
                                                         model.batch_second)
        return None if made is None else self._graph_lines.put(family, made)

    def _row_line(self, spec: JobSpec, hardware: HardwareSpec) -> tuple[GraphLine, RowLine] | None:
        """The job's lines on `hardware`'s math table, checked once against its graph at a third batch."""
        graphs = self._graph_line(spec)
        if graphs is None:
            return None
        key = self._row_line_key(spec, hardware)
        found = self._row_lines.get(key)
        if found is None:
            sibling = self._float32_sibling_line(spec, hardware)
            if sibling is not None:  # the same rows in another float32 math: its line, in this one's maths
                made = sibling.in_maths(spec.precision, hardware) if isinstance(sibling, RowLine) else None
            else:
                check = graphs.batch_first + graphs.batch_second
                made = RowLine.of(spec, graphs, hardware,
                                  self._graph(spec.model_copy(update={"batch_size": check})), check)
            found = self._row_lines.put(key, made if made is not None else False)
        return (graphs, found) if isinstance(found, RowLine) else None

    @staticmethod
    def _row_line_key(spec: JobSpec, hardware: HardwareSpec) -> tuple[str, tuple[tuple[str, str, str], ...]]:
        return spec.model_copy(update={"batch_size": 1}).key(), table_key(spec.precision, hardware)

    def _float32_sibling_line(self, spec: JobSpec, hardware: HardwareSpec) -> RowLine | bool | None:
        """The row line (or False: none, not affine) of the same job in another float32 precision on `hardware`,
        if one was made (None: none was)."""
        if spec.precision not in FLOAT32_MATHS:
            return None
        for precision in FLOAT32_MATHS:
            if precision != spec.precision:
                found = self._row_lines.get(self._row_line_key(spec.model_copy(update={"precision": precision}),
                                                               hardware))
                if found is not None:
                    return found
        return None

    def prefetch(self, wanted: Sequence[tuple[JobSpec, HardwareSpec, int, Graph | None]]) -> None:
        """Compose every (spec, device, micro-batch) not cached yet whose device the per-op model prices, in one
        call of that model: every batch of a job with lines (`batch_sweep`) at once
        (`DevicePredictor.predict_composed_sweeps`), the others from their graphs
        (`DevicePredictor.predict_composed_many`); then the whole-step stage corrects them all in one call. `graph`,
        if given, is the spec's graph at its own batch."""
        if self.device is None:
            return
        if self.whole_step is not None:  # each float32 job's faster twins too: its answer is floored by theirs
            wanted = [*wanted, *((spec.model_copy(update={"precision": twin}), hardware, micro, graph)
                                 for spec, hardware, micro, graph in wanted
                                 for twin in faster_twins(spec.precision, hardware))]
        todo: dict[tuple[str, str, int], tuple[JobSpec, str, Graph]] = {}
        # one sweep per (row line, device): its lines and the (key, micro-batch spec) of each step
        sweeps: dict[tuple[int, str], tuple[GraphLine, RowLine, list[tuple[tuple[str, str, int], JobSpec]]]] = {}
        seen: set[tuple[str, str, int]] = set()
        jobs: dict[tuple[str, str, int], JobSpec] = {}  # each composed key's job
        for spec, hardware, micro, graph in wanted:
            key = (spec.key(), hardware.name, micro)
            if key in seen or key in self._computes or key in self._compositions:
                continue
            seen.add(key)
            jobs[key] = spec
            if self._single(hardware) is not self.device:
                continue
            micro_spec = spec.model_copy(update={"batch_size": micro})
            found = self._row_line(spec, hardware)
            if found is not None:
                graphs, rows = found
                sweeps.setdefault((id(rows), hardware.name), (graphs, rows, []))[2].append((key, micro_spec))
                continue
            own = graph if graph is not None and micro == spec.batch_size else None
            todo[key] = (micro_spec, hardware.name, own if own is not None else self._graph(micro_spec))
        made: dict[tuple[str, str, int], tuple[JobSpec, tuple[Prediction, dict[str, float]]]] = {}
        if sweeps:
            batch = [Sweep([s for _, s in members], device, rows, graphs)
                     for (_, device), (graphs, rows, members) in sweeps.items()]
            for (_, _, members), composed in zip(sweeps.values(), self.device.predict_composed_sweeps(batch)):
                for (key, micro_spec), step in zip(members, composed):
                    made[key] = (micro_spec, self._compositions.put(key, step))
        if len(todo) >= 2:  # one alone is composed as before
            for key, one in zip(todo, self.device.predict_composed_many(list(todo.values()))):
                made[key] = (todo[key][0], self._compositions.put(key, one))
        if self.whole_step is not None and made:
            steps = list(made.values())
            devices = [self.hardware(step.accelerator) for _, (step, _) in steps]
            corrected = self.whole_step.correct_jobs([step[0] for _, step in steps], [step[1] for _, step in steps],
                                                     [spec for spec, _ in steps], devices)
            # the faster maths first: a step is floored by its twins' steps, floored themselves
            keys = list(made)
            for i in sorted(range(len(keys)), key=lambda i: len(FASTER_FLOAT32.get(steps[i][0].precision, ()))):
                self._corrected.put(keys[i], self._floored(jobs[keys[i]], keys[i][2], devices[i], corrected[i]))

    def set_whole_step(self, stage: WholeStepStage | None) -> None:
        """Use another whole-step stage (None: none): the composed steps are kept, the corrected ones redone."""
        self.whole_step = stage
        self._computes = LRU(self.cache_size)
        self._corrected = LRU(self.cache_size)

    def composition(self, spec: JobSpec, placement: PlacementSpec) -> dict[str, float] | None:
        """The composition features of `spec`'s micro-batch on the placement's accelerator (None: not composed
        from kernels, e.g. the CPU iteration model)."""
        hardware = self.hardware(placement.accelerator)
        self.compute(spec, hardware, placement.micro_batch_size)
        composed = self._compositions.get((spec.key(), hardware.name, placement.micro_batch_size))
        return None if composed is None else composed[1]

    def _graph(self, spec: JobSpec) -> Graph:
        """`spec`'s graph: cached (by graph key: a spec of another optimizer or float32 math has the same graph),
        else from the graph source (the engine's capture), else `graph_for_job`."""
        cached = self._graphs.get(spec.graph_key())
        if cached is not None:
            return cached
        if self._graph_source is not None:
            graph = self._graph_source(spec)
        else:
            from perfmodel.graph import graph_for_job

            graph = graph_for_job(spec)
        return self._graphs.setdefault(spec.graph_key(), graph)

    # --- placements -------------------------------------------------------------------------------------------------

    def use_catalog(self, catalog: Mapping[str, HardwareSpec]) -> None:
        """Resolve accelerators in `catalog` (the engine's: shipped + custom entries, `hardware.custom.LiveCatalog`),
        in this predictor and its device model."""
        self._catalog = catalog  # type: ignore[assignment]
        if self.device is not None:
            self.device.catalog = catalog

    def hardware(self, name: str) -> HardwareSpec:
        from perfmodel.hardware.catalog import get_accelerator, load_catalog

        spec = self._hardware.get(name)
        if spec is None:
            if self._catalog is None:
                self._catalog = load_catalog()
            spec = self._hardware[name] = get_accelerator(name, self._catalog)
        return spec

    def links(self, placement: PlacementSpec, hardware: HardwareSpec) -> _Links:
        """`placement_links`, from the cache of `_network_links`: a new latency costs no new links."""
        found = self._network_links(placement, hardware)
        inter = found.inter.at_latency(placement.inter_node_latency_us) if placement.devices > 1 else found.inter
        return found if inter is found.inter else _Links(found.intra, inter, found.host_staged)

    def _network_links(self, placement: PlacementSpec, hardware: HardwareSpec) -> _Links:
        """`placement_links` at some network latency, cached per (accelerator, link override, network, fewest
        devices on a node): the network's latency is its α only (`LinkModel.at_latency`), which `placement_row`
        takes from the placement."""
        if placement.devices == 1:
            return _NO_LINKS
        key = (hardware.name, placement.intra_node_link, placement.inter_node_bandwidth_gbit_s,
               min(placement.devices_per_node))
        found = self._links.get(key)
        if found is None:
            intra_key = (hardware.name, placement.intra_node_link)
            intra = self._intra.get(intra_key)  # a device's own link: not redone for every network asked
            if intra is None and hardware.kind == "gpu":
                intra = self._intra.put(intra_key, intra_link(hardware, placement.intra_node_link))
            found = self._links.put(key, placement_links(placement, hardware, intra))
        return found

    def matrix_arrays(self, specs: Sequence[JobSpec], placements: Sequence[PlacementSpec], *,
                      graphs: Sequence[Graph | None] | None = None) -> dict[str, np.ndarray]:
        """The placement model over jobs × placements: every breakdown component as a (jobs, placements) array,
        plus `throughput_samples_per_s`. Computes not cached yet are predicted first (seconds per new job ×
        accelerator × micro-batch); with them cached this is array arithmetic (`bench/placement_batch.py`)."""
        graphs = list(graphs) if graphs is not None else [None] * len(specs)
        hardware = [self.hardware(p.accelerator) for p in placements]
        unique: dict[tuple[int, str, int], int] = {}
        needed: list[tuple[JobSpec, HardwareSpec, int, Graph | None]] = []  # each distinct compute, once
        index = np.empty((len(specs), len(placements)), dtype=np.intp)
        for j, (placement, hw) in enumerate(zip(placements, hardware)):
            micro = placement.micro_batch_size
            for i, spec in enumerate(specs):
                key = (i, hw.name, micro)
                k = unique.get(key)
                if k is None:
                    k = unique[key] = len(needed)
                    needed.append((spec, hw, micro, graphs[i]))
                index[i, j] = k
        self.prefetch(needed)
        computes = [self.compute(spec, hw, micro, graph=graph)[0] for spec, hw, micro, graph in needed]
        c = ComputeArrays.stack(computes)
        c = ComputeArrays(**{name: value[index] for name, value in vars(c).items()})  # (jobs, placements)
        p = placement_arrays(placements, [self._network_links(pl, hw) for pl, hw in zip(placements, hardware)])
        p = PlacementArrays(**{name: value[None, :] for name, value in vars(p).items()})  # broadcast over jobs
        shape = (len(specs), len(placements))
        result = {name: value.reshape(shape) for name, value in iteration_breakdown(c, p, self.params).items()}
        global_batch = np.array([pl.global_batch_size for pl in placements], dtype=float)
        result["throughput_samples_per_s"] = global_batch[None, :] * 1e3 / result["iter_time_ms"]
        result["peak_memory_bytes"] = self._memory_matrix(specs, placements)
        capacity = np.array([usable_memory_bytes(hw) for hw in hardware], dtype=np.int64)
        result["memory_capacity_bytes"] = np.broadcast_to(capacity, shape)
        result["fits"] = result["peak_memory_bytes"] <= capacity[None, :]
        return result

    def _memory_matrix(self, specs: Sequence[JobSpec], placements: Sequence[PlacementSpec]) -> np.ndarray:
        """`memory` of every job on every placement, estimated once per distinct job."""
        first: dict[str, int] = {}
        rows = [first.setdefault(spec.key(), i) for i, spec in enumerate(specs)]
        distinct = np.array([[self.memory(specs[i], pl) for pl in placements] for i in first.values()],
                            dtype=np.int64).reshape(len(first), len(placements))
        position = {i: k for k, i in enumerate(first.values())}
        return distinct[[position[i] for i in rows]]

    def predict(self, spec: JobSpec, placement: PlacementSpec, *, graph: Graph | None = None) -> Prediction:
        """One job on one placement: the same model as `matrix_arrays`, evaluated in floats."""
        return Prediction(**self.prediction_fields(spec, placement, graph=graph))

    def prediction_fields(self, spec: JobSpec, placement: PlacementSpec, *,
                          graph: Graph | None = None) -> dict[str, Any]:
        """`predict`'s `Prediction` as its keyword arguments (plain numbers, tuples, the placement), without
        building the model: a served answer goes straight to JSON (`predictor.predict.prediction_json`)."""
        hw = self.hardware(placement.accelerator)
        compute, single = self.compute(spec, hw, placement.micro_batch_size, graph=graph)
        return self._priced(spec, placement, hw, compute, single, self.memory(spec, placement))

    def cached_fields(self, spec: JobSpec, placement: PlacementSpec) -> dict[str, Any] | None:
        """`prediction_fields` when the device compute and the memory estimate of its micro-batch are cached (then it
        is arithmetic: no model, no capture, safe on an event loop), else None. Dictionary look-ups first."""
        hw = self._hardware.get(placement.accelerator)
        cached = self._computes.get((spec.key(), hw.name, placement.micro_batch_size)) if hw is not None else None
        memory = self._memory.get(_memory_key(spec, placement)) if cached is not None else None
        if hw is None or cached is None or memory is None:
            return None
        return self._priced(spec, placement, hw, *cached, memory)

    def _priced(self, spec: JobSpec, placement: PlacementSpec, hw: HardwareSpec, compute: ShardCompute,
                single: Prediction, memory: int) -> dict[str, Any]:
        """The placement model in floats on one device's compute: `prediction_fields`."""
        c = self._compute_floats.get(compute)
        if c is None:
            c = self._compute_floats.put(compute, ComputeArrays(**{f.name: float(getattr(compute, f.name))
                                                                  for f in fields(ComputeArrays)}))
        p = PlacementArrays.of_floats(placement_row(placement, self._network_links(placement, hw)))
        out: dict[str, Any] = iteration_breakdown(c, p, self.params)
        out["throughput_samples_per_s"] = placement.global_batch_size * 1e3 / out["iter_time_ms"]
        capacity = usable_memory_bytes(hw)
        out.update(peak_memory_bytes=memory, memory_capacity_bytes=capacity, fits=memory <= capacity)
        return self._fields(spec, placement, hw, single, out)

    def predict_matrix(self, specs: Sequence[JobSpec], placements: Sequence[PlacementSpec], *,
                       graphs: Sequence[Graph | None] | None = None) -> list[list[Prediction]]:
        """Every job on every placement, as `Prediction`s (one vectorised pass of the placement model)."""
        graphs = list(graphs) if graphs is not None else [None] * len(specs)
        arrays = self.matrix_arrays(specs, placements, graphs=graphs)
        rows: list[list[Prediction]] = []
        for i, spec in enumerate(specs):
            row = []
            for j, placement in enumerate(placements):
                hw = self.hardware(placement.accelerator)
                single = self.compute(spec, hw, placement.micro_batch_size, graph=graphs[i])[1]
                row.append(Prediction(**self._fields(spec, placement, hw, single,
                                                     {name: v[i, j].item() for name, v in arrays.items()})))
            rows.append(row)
        return rows

    def _fields(self, spec: JobSpec, placement: PlacementSpec, hardware: HardwareSpec, single: Prediction,
                out: dict[str, Any]) -> dict[str, Any]:
        """The `Prediction` of `out` (the placement model's floats) as keyword arguments."""
        iter_time_ms = out["iter_time_ms"]
        breakdown = {k: out[k] for k in BREAKDOWN_KEYS}
        ratio = iter_time_ms / single.iter_time_ms if single.iter_time_ms > 0 else 1.0
        wait = out.get("data_parallel_wait_ms", 0.0)
        spread = wait / single.iter_time_ms if single.iter_time_ms > 0 else 0.0
        interval = placed_interval(single.interval_ms, iter_time_ms, ratio, spread,
                                   self.params.scaling_band_log if placement.devices > 1 else (0.0, 0.0))
        unit, items_per_sample = items_of(spec)
        return dict(
            job_name=spec.name, job_id=spec.key(), accelerator=hardware.name, model_version=single.model_version,
            iter_time_ms=iter_time_ms, throughput_samples_per_s=out["throughput_samples_per_s"],
            interval_ms=interval, breakdown_ms=breakdown,
            peak_memory_bytes=out["peak_memory_bytes"], extrapolated=single.extrapolated,
            extrapolation_reasons=single.extrapolation_reasons,
            math_by_op_group=single.math_by_op_group, devices=placement.devices, nodes=placement.nodes,
            fits=out["fits"], memory_capacity_bytes=out["memory_capacity_bytes"], placement=placement,
            composed_iter_time_ms=(None if single.composed_iter_time_ms is None else
                                   single.composed_iter_time_ms * ratio),
            unit=unit, items_per_sample=items_per_sample)

    def memory(self, spec: JobSpec, placement: PlacementSpec) -> int:
        """Peak bytes on the fullest device of the placement (cached per job and parallel layout)."""
        par = placement.parallelism
        key = _memory_key(spec, placement)
        cached = self._memory.get(key)
        if cached is not None:
            return cached
        micro_spec = spec.model_copy(update={"batch_size": placement.micro_batch_size})
        lines = self._graph_line(spec) if micro_spec.graph_key() not in self._graphs else None
        graph = (lines.graph_bytes(spec.precision, placement.micro_batch_size) if lines is not None
                 else self._bytes_of(micro_spec, self._graph(micro_spec)))
        check_expert_parallel(graph.moe, spec.name, par.expert)
        extra = {"expert_parallel": par.expert} if _takes_expert_parallel() else {}
        estimate = estimate_memory(micro_spec, graph, tensor_parallel=par.tensor,
                                   pipeline_parallel=par.pipeline, data_parallel=par.data,
                                   zero_stage=par.zero_stage, activation_checkpointing=par.activation_checkpointing,
                                   micro_batches=par.micro_batches,
                                   gradient_bucket_copy=par.gradient_bucket_copy, **extra)
        self._memory.put(key, estimate.peak_bytes)
        return estimate.peak_bytes


def _memory_key(spec: JobSpec, placement: PlacementSpec) -> tuple[Any, ...]:
    par = placement.parallelism
    return (spec.key(), placement.micro_batch_size, par.tensor, par.pipeline, par.data, par.zero_stage,
            par.activation_checkpointing, par.micro_batches, par.expert, par.gradient_bucket_copy)


def placement_row(placement: PlacementSpec, links: _Links) -> tuple[float, ...]:
    """A placement's `PlacementArrays` fields, in order, as floats, with `links` at any network latency (the
    network's α is the placement's `inter_node_latency_us`: `PlacementPredictor.links`). Ranks are laid out as
    Megatron does (tensor innermost, then data with expert-parallel groups inside it, pipeline outermost) on the
    nodes in order; a group over consecutive ranks spans as many nodes as its ranks fill (uneven nodes: their average
    size)."""
    par = placement.parallelism
    t, pp, d, e = par.tensor, par.pipeline, par.data, par.expert
    layout = placement.devices_per_node
    devices = sum(layout)
    per_node = devices / len(layout)
    inter_alpha_ms = us_to_ms(placement.inter_node_latency_us) if devices > 1 else links.inter.alpha_ms
    return (float(t), float(pp), float(d), float(par.micro_batches), float(par.zero_stage),
            float(par.activation_checkpointing), _group_nodes(t * d, d, per_node), links.intra.alpha_ms,
            links.intra.beta_ms_per_byte, inter_alpha_ms, links.inter.beta_ms_per_byte, float(e),
            _group_nodes(t, t, per_node), _group_nodes(t * e, e, per_node), _group_nodes(t * d, d // e, per_node),
            float(len(layout) if pp > 1 else 1), float(max(layout)), float(links.host_staged))


def _group_nodes(span: int, members: int, per_node: float) -> float:
    """Nodes a group of `members` ranks over `span` consecutive ranks spans, on nodes of `per_node` devices."""
    return float(min(max(span / per_node, 1.0), members))


def placement_arrays(placements: Sequence[PlacementSpec], links: Sequence[_Links]) -> PlacementArrays:
    """The vectorised form of placements (and their links), one entry each."""
    rows = np.array([placement_row(p, lk) for p, lk in zip(placements, links)], dtype=float)
    return PlacementArrays(*rows.reshape(len(placements), len(fields(PlacementArrays))).T)


def activation_element_bytes(precision: Precision) -> int:
    """Bytes of one activation element: 2 when the model runs in half precision or autocast, else 4."""
    return 2 if precision.half_dtype else 4


def moe_fields(moe: Any, precision: Precision) -> dict[str, int]:
    """`ShardCompute`'s mixture-of-experts fields from a graph's `MoEInfo` (None: dense, all 0)."""
    if moe is None:
        return {}
    return {"moe_layers": int(moe.layers), "expert_params": int(moe.expert_params),
            "moe_dispatch_bytes": int(moe.tokens) * int(moe.top_k) * int(moe.hidden)
            * activation_element_bytes(precision)}


def check_expert_parallel(moe: MoEInfo | None, name: str, expert: int) -> None:
    """An expert-parallel degree > 1 needs a mixture-of-experts model (`moe`: its graph's) whose experts it
    divides."""
    if expert == 1:
        return
    if moe is None:
        raise PerfmodelError(f"placement.parallelism.expert: {name} is a dense model (no mixture-of-experts "
                             f"layers): expert parallelism {expert} needs experts to split; use 1")
    if moe.experts % expert:
        raise PerfmodelError(f"placement.parallelism.expert: {expert} does not divide the {moe.experts} experts of "
                             f"each MoE layer of {name}")


@functools.cache
def _takes_expert_parallel() -> bool:
    """Whether `estimate_memory` takes `expert_parallel` (the MoE memory model adds it)."""
    return "expert_parallel" in inspect.signature(estimate_memory).parameters


def _has_role(registry: Any, ref: str | None, role: str) -> bool:
    return ref is not None or registry.promoted_ref(role) is not None

