"""Training data: profiles in a store -> `Sample`s (graph + hardware + measured times), and family-grouped folds.

    store = ProfileStore(read_only_store_url("/work/corpus.db"))
    samples = samples_from_store(store, progress=print)
    for train_idx, test_idx in family_folds(samples, k=5): ...

A sample's measurements come from its profile:
- `iter_time_ms` / `iter_time_cv`: the median and coefficient of variation of the timed steps;
- `node_times_ms[(node id, phase)]`: for the forward and backward phases, the sum of the self times of the aten
  calls attributed to that IR node (per-op profile; backward calls carry their forward call's node), per step;
- `unattributed_ms`: iteration median minus the sum of node times: the optimizer step, unattributed calls,
  Python glue. It may be negative: the op times come from other (profiled, slower) steps than the median.

A profile's graph is the one stored with it (`ProfileStore.graph`, schema v5: the graph its ops were matched
against, shipped in exports); for runs without one, it is captured on the meta device (0.2-5 s each) and cached as
IR JSON by job key (`cached_graph`; `perfmodel profiles add-graphs` stores them instead).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from perfmodel.core.atomic import write_text_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.features.sample import NodePhase, Sample
from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import GraphSource, HFConfigSource, JobSpec, ModuleSource, OnnxSource, ZooSource
from perfmodel.records import Environment, Outcome, Profile
from perfmodel.settings import get_settings

if TYPE_CHECKING:
    from perfmodel.store import ProfileStore

Progress = Callable[[str], None]
HardwareFor = Callable[[Environment], HardwareSpec]
Fold = tuple[np.ndarray, np.ndarray]  # (train indices, test indices), ascending

NODE_PHASES: tuple[NodePhase, ...] = ("forward", "backward")
# a profiled (per-op) step this many times slower or faster than the timed median is reported: its node times are
# suspect (other load on the machine while it ran)
OP_STEP_DEVIATION = 1.5


def read_only_store_url(path: str | Path) -> str:
    """A SQLAlchemy URL opening a SQLite store file read-only (for code that only reads, e.g. a live corpus)."""
    return f"sqlite:///file:{Path(path).resolve()}?mode=ro&uri=true"


def default_graph_cache_dir() -> Path:
    return get_settings().home / "cache" / "graphs"


def cached_graph(spec: JobSpec, cache_dir: Path | None = None) -> Graph:
    """The job's graph from `cache_dir/<spec.key()>.json`, captured (and cached) if it is not there or unreadable."""
    from perfmodel.graph.from_torch import capture_graph

    cache_dir = cache_dir or default_graph_cache_dir()
    path = cache_dir / f"{spec.key()}.json"
    if path.is_file():
        try:
            return Graph.from_json(path.read_text(encoding="utf-8"))
        except (PerfmodelError, ValueError):  # an older IR schema or a torn file: capture it again
            pass
    graph = capture_graph(spec)
    write_text_atomically(path, graph.to_json())
    return graph


def default_hardware_for(catalog: Mapping[str, HardwareSpec] | None = None) -> HardwareFor:
    """CPU environments -> the catalog's `cpu` entry; GPU environments -> the entry named by torch's device name."""
    catalog = load_catalog() if catalog is None else catalog

    def hardware_for(environment: Environment) -> HardwareSpec:
        if environment.device_type == "cpu":
            return get_accelerator("cpu", catalog)
        return get_accelerator(environment.device_name, catalog)

    return hardware_for


def node_times_ms(profile: Profile, graph: Graph) -> tuple[dict[tuple[str, NodePhase], float], float]:
    """Per (IR node, phase) self time per step, in graph order, and the attributed time whose node the graph lacks
    (0 when the graph is the one the profile was matched against)."""
    if profile.ops is None:
        raise PerfmodelError(f"profile of {profile.job.name} has no per-op profile")
    order = {node.id: i for i, node in enumerate(graph.nodes)}
    times: defaultdict[tuple[str, NodePhase], float] = defaultdict(float)
    unknown_ms = 0.0
    for record in profile.ops.ops:
        if record.phase not in NODE_PHASES or record.ir_node is None:
            continue
        if record.ir_node in order:
            times[(record.ir_node, record.phase)] += record.self_time_ms
        else:
            unknown_ms += record.self_time_ms
    ranked = sorted(times.items(), key=lambda kv: (NODE_PHASES.index(kv[0][1]), order[kv[0][0]]))
    return dict(ranked), unknown_ms


def sample_from_profile(profile: Profile, graph: Graph, hardware: HardwareSpec,
                        profile_id: int | None = None) -> Sample:
    """A measured sample from an ok profile with a per-op profile and the job's graph (pure)."""
    iteration = profile.iteration
    if iteration is None or iteration.outcome != Outcome.ok or iteration.iter_time_ms_median is None:
        raise PerfmodelError(f"profile of {profile.job.name} has no successful iteration timing")
    times, _ = node_times_ms(profile, graph)
    return Sample(
        spec=profile.job,
        graph=graph,
        hardware=hardware,
        family=profile.family,
        iter_time_ms=iteration.iter_time_ms_median,
        iter_time_cv=iteration.iter_time_cv,
        node_times_ms=MappingProxyType(times),
        unattributed_ms=iteration.iter_time_ms_median - sum(times.values()),
        profile_id=profile_id,
    )


def samples_from_store(store: ProfileStore, *, hardware_for: HardwareFor | None = None,
                       graph_cache_dir: Path | None = None, progress: Progress | None = None,
                       families: Collection[str] | None = None) -> list[Sample]:
    """One sample per stored profile with outcome ok and a per-op profile, in profile id order (only those of
    `families` when given). The graph is the store's graph of the job, else `cached_graph` (captured into
    `graph_cache_dir`); profiles whose graph cannot be captured are skipped (reported through `progress`).
    Only reads the store."""
    say = progress or (lambda message: None)
    hardware_for = hardware_for or default_hardware_for()
    summaries = sorted((s for s in store.list() if s.outcome == Outcome.ok and s.coverage is not None
                        and (families is None or s.family in families)), key=lambda s: s.id)
    samples = []
    for i, summary in enumerate(summaries, start=1):
        profile = store.get(summary.id)
        if profile.ops is None or isinstance(profile.job.source, OnnxSource):
            continue
        say(f"[{i}/{len(summaries)}] profile {summary.id}: {profile.job.name} batch {profile.job.batch_size}")
        try:
            graph = store.graph(profile.job_id)
        except PerfmodelError as exc:  # e.g. stored under an older IR schema
            say(f"profile {summary.id}: {exc}; capturing it instead")
            graph = None
        if graph is None:
            try:
                graph = cached_graph(profile.job, graph_cache_dir)
            except PerfmodelError as exc:
                say(f"skipped profile {summary.id}: {exc}")
                continue
        _, unknown_ms = node_times_ms(profile, graph)
        if unknown_ms > 0:
            say(f"profile {summary.id}: {unknown_ms:.3f} ms of op time names IR nodes the graph lacks "
                "(the graph changed since profiling); counted as unattributed")
        median_ms = profile.iteration.iter_time_ms_median if profile.iteration else None
        if median_ms and not 1 / OP_STEP_DEVIATION <= profile.ops.iter_time_ms / median_ms <= OP_STEP_DEVIATION:
            say(f"profile {summary.id} ({profile.job.name}): its per-op step took {profile.ops.iter_time_ms:.1f} "
                f"ms against a timed median of {median_ms:.1f} ms; its node times are suspect (re-profile it)")
        samples.append(sample_from_profile(profile, graph, hardware_for(profile.environment), summary.id))
    return samples


def family_of(spec: JobSpec) -> str:
    """The family `build_job` gives a job (zoo family, hf:<model_type>, module:<path>, onnx), without building it."""
    source = spec.source
    if isinstance(source, ZooSource):
        from perfmodel.jobs.zoo import get_entry

        return get_entry(source.name).family
    if isinstance(source, HFConfigSource):
        return f"hf:{source.config.get('model_type')}"
    if isinstance(source, ModuleSource):
        return f"module:{source.path}"
    if isinstance(source, GraphSource):
        return f"ir:{source.graph.get('name')}"
    return "onnx"


def sample_for_prediction(spec: JobSpec, hardware: HardwareSpec, *, graph: Graph | None = None) -> Sample:
    """An unmeasured sample (graph and hardware only) to predict. The graph is captured unless given."""
    if graph is None:
        from perfmodel.graph import graph_for_job

        graph = graph_for_job(spec)
    return Sample(spec=spec, graph=graph, hardware=hardware, family=family_of(spec))


def family_folds(samples: Sequence[Sample], k: int, *, seed: int = 0) -> list[Fold]:
    """k folds grouped by family: a family's samples are all in one test fold, never in train and test at once.

    Deterministic for a given `seed`. Families are placed largest first, each into the fold with the fewest samples
    so far (ties between equal-sized families broken by a seeded shuffle), so folds are roughly balanced by sample
    count. With fewer families than `k`, there is one fold per family."""
    sizes = Counter(sample.family for sample in samples)
    if len(sizes) < 2:
        raise PerfmodelError(f"need samples of at least 2 families for a grouped split, got {len(sizes)}")
    if k < 2:
        raise PerfmodelError(f"need k >= 2 folds, got {k}")
    k = min(k, len(sizes))
    order = sorted(sizes)
    random.Random(seed).shuffle(order)
    order.sort(key=lambda family: -sizes[family])  # stable: equal sizes keep the shuffled order
    fold_of: dict[str, int] = {}
    loads = [0] * k
    for family in order:
        fold = min(range(k), key=lambda j: (loads[j], j))
        fold_of[family] = fold
        loads[fold] += sizes[family]
    assignment = np.array([fold_of[sample.family] for sample in samples])
    indices = np.arange(len(samples))
    return [(indices[assignment != fold], indices[assignment == fold]) for fold in range(k)]
