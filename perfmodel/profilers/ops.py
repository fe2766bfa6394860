"""Per-op profile of a job's step: every aten call, its phase, shapes, self time and the IR node it implements.

Running (`profile_ops`) and parsing (`ops_from_events`) are separate: the runner wraps each profiled step in a
`perfmodel::step` record_function (the step's phases carry the `PHASE_LABELS` of `make_step`), converts
torch.profiler's events into plain `TraceEvent`s and hands them to the pure parser.

What is counted (the parser's rules):
- An op is an `aten::` event. Every aten call becomes an `OpRecord`, nested ones included (`aten::linear` calls
  `aten::t` and `aten::addmm`: three records), so the self times add up without double counting.
- An op's self time is its own time with its aten children excluded; the self time of non-aten events nested
  inside it (e.g. `detach` inside `aten::detach`) is folded into it. Events outside every aten call are not ops and
  are not counted: the Python between ops, the `perfmodel::*` labels, autograd-engine bookkeeping
  (`autograd::engine::evaluate_function: ...`, `AccumulateGrad`), `Optimizer.zero_grad` (a Python loop). On GPU
  the self time is the device (kernel) time the call launched; on CPU the call's CPU time.
- Phase: the `perfmodel::{forward,backward,optimizer}` range whose time span holds the call's start (backward may
  run on autograd threads, which a parent-child walk would not see); a call inside a step but outside every phase
  is `other`. Calls outside every `perfmodel::step` range are ignored.
- Per-step average: a call is identified by (phase, name, shapes, how many identical calls preceded it in its step);
  its self time is summed over the profiled steps and divided by their number.
- IR matching: top-level forward calls, in execution order, are matched greedily to the graph's nodes in order, by
  normalised op name and tensor input shapes (where both have them) of the call itself or of any call nested in
  it (so `aten::conv2d` also matches an IR `aten.convolution.default`, `aten::linear` an `aten.t`), searching a
  bounded window ahead so that one unmatched call cannot derail the rest. Nested calls inherit their top-level
  call's node. `matched_fraction` is the matched share of forward self time.
- Backward attribution: a backward call runs under the autograd engine's `evaluate_function: XBackward0` event,
  whose sequence number is that of the forward call that recorded the autograd node (same step); the backward
  call gets the IR node of that forward call's top-level call. Calls of the engine outside every node
  (AccumulateGrad) stay unattributed.
- Coverage = total self time of the calls / total wall time of the profiled steps (the `perfmodel::step` ranges,
  which include a device synchronise): a ratio of sums, so one slow step moves both alike. (`iter_time_ms` is
  the median step.) The rest is time inside no aten call. Measured on a 2-core CPU (torch 2.13, batch 8, training)
  it is 2-3 % of a step for resnet18 and bert-small: Python between ops (the self time of the `perfmodel::*`
  labels, ~1 %), `Optimizer.zero_grad`'s Python loop (0.5-1.3 %), autograd-engine bookkeeping (~0.5 %); coverage
  0.97-0.98. Other zoo models at batch 2: 0.85-0.97, lowest for many small ops (mobilenet_v3_small, 0.85), where the
  per-op Python and dispatch overhead is a real part of the step. Above 1 only if ops on different threads overlap.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph, Node
from perfmodel.core.opkinds import kind_of, normalize_op_name
from perfmodel.core.units import us_to_ms
from perfmodel.jobs.build import BuiltJob
from perfmodel.profilers.iteration import PHASE_LABELS, make_step
from perfmodel.records import OpProfile, OpRecord, Phase
from perfmodel.torch_device import quiet_profiler_logs, synchronize

STEP_LABEL = "perfmodel::step"
ATEN_PREFIX = "aten::"
AUTOGRAD_EVALUATE = "autograd::engine::evaluate_function: "
MATCH_WINDOW = 64  # IR nodes searched ahead of the last match for the next top-level call

_PHASE_OF_LABEL: dict[str, Phase] = {label: phase for phase, label in PHASE_LABELS.items()}


@dataclass(frozen=True)
class TraceEvent:
    """One profiler event, reduced to what the parser needs. Times in microseconds."""

    id: int
    name: str
    start_us: float
    end_us: float
    self_us: float = 0.0  # own time, children excluded: device time on GPU, CPU time otherwise
    parent: int | None = None  # id of the enclosing event on the same thread
    input_shapes: tuple[tuple[int, ...], ...] = ()
    # autograd sequence number: a forward op that records an autograd node and the backward engine event that
    # evaluates that node share it (-1: none)
    sequence_nr: int = -1


def trace_events(function_events: Iterable, use_device_time: bool) -> list[TraceEvent]:
    """torch.profiler `FunctionEvent`s (CPU-side ones; kernels are folded into their op's device time) ->
    `TraceEvent`s."""
    events = []
    for e in function_events:
        if e.device_type != DeviceType.CPU:
            continue
        parent = e.cpu_parent
        events.append(TraceEvent(
            id=e.id,
            name=e.name,
            start_us=e.time_range.start,
            end_us=e.time_range.end,
            self_us=e.self_device_time_total if use_device_time else e.self_cpu_time_total,
            parent=parent.id if parent is not None else None,
            input_shapes=tensor_shapes(e.input_shapes),
            sequence_nr=e.sequence_nr,
        ))
    return events


def tensor_shapes(shapes: Sequence | None) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensor inputs: non-empty int lists (the profiler records scalars and other non-tensor
    arguments, and 0-d tensors, as `[]`; tensor lists as nested lists, which are dropped too)."""
    return tuple(tuple(s) for s in shapes or () if s and all(isinstance(d, int) for d in s))


def profile_ops(job: BuiltJob, graph: Graph | None = None, warmup: int = 2, steps: int = 3, *,
                step: Callable[[], None] | None = None) -> OpProfile:
    """Run `warmup` steps, then profile `steps` steps with torch.profiler (shapes recorded) and parse them.
    `step` defaults to `make_step(job)`; a step that has already run (its optimizer state exists) needs no warm-up.
    """
    if warmup < 0 or steps < 1:
        raise PerfmodelError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    step = step or make_step(job)
    for _ in range(warmup):
        step()
    synchronize(job.device)
    on_gpu = job.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    quiet_profiler_logs()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            with record_function(STEP_LABEL):
                step()
                synchronize(job.device)
    return ops_from_events(trace_events(prof.events(), use_device_time=on_gpu), graph=graph)


@dataclass
class _Call:
    """One distinct aten call of the step, accumulated over the profiled steps."""

    key: tuple
    phase: Phase
    name: str
    shapes: tuple[tuple[int, ...], ...]
    top_key: tuple  # the key of its top-level call (itself when top-level)
    forward_key: tuple | None = None  # backward calls: the top-level forward call whose gradient this computes
    total_us: float = 0.0
    nested: set[tuple] = field(default_factory=set)  # (normalised name, shapes) of the aten calls nested inside

    @property
    def is_top(self) -> bool:
        return self.top_key == self.key


def ops_from_events(events: Sequence[TraceEvent], graph: Graph | None = None) -> OpProfile:
    """Profiler events of `perfmodel::step`-wrapped steps -> the per-op profile (pure; rules in the module doc)."""
    by_id = {e.id: e for e in events}
    steps = sorted((e for e in events if e.name == STEP_LABEL), key=lambda e: e.start_us)
    if not steps:
        raise PerfmodelError(f"no {STEP_LABEL!r} range in the profiler events: nothing to attribute ops to")
    step_starts = [s.start_us for s in steps]
    phase_ranges = sorted((e.start_us, e.end_us, _PHASE_OF_LABEL[e.name]) for e in events
                          if e.name in _PHASE_OF_LABEL)

    def parent_of(event: TraceEvent) -> TraceEvent | None:
        return None if event.parent is None else by_id.get(event.parent)

    def aten_owner(event: TraceEvent, include_self: bool) -> TraceEvent | None:
        """The nearest aten event enclosing `event` (or `event` itself)."""
        current = event if include_self else parent_of(event)
        while current is not None and not current.name.startswith(ATEN_PREFIX):
            current = parent_of(current)
        return current

    def top_aten(event: TraceEvent) -> TraceEvent:
        top, above = event, aten_owner(event, include_self=False)
        while above is not None:
            top, above = above, aten_owner(above, include_self=False)
        return top

    own_us: dict[int, float] = defaultdict(float)  # aten event id -> self time with non-aten children folded in
    for e in events:
        owner = aten_owner(e, include_self=True)
        if owner is not None:
            own_us[owner.id] += e.self_us

    def step_of(event: TraceEvent) -> int | None:
        i = bisect.bisect_right(step_starts, event.start_us) - 1
        return i if i >= 0 and event.start_us <= steps[i].end_us else None

    def phase_of(event: TraceEvent) -> Phase:
        return next((p for start, end, p in phase_ranges if start <= event.start_us <= end), "other")

    def backward_origin(event: TraceEvent) -> TraceEvent | None:
        """The autograd engine event (`evaluate_function: XBackward0`) a backward call runs under."""
        current = parent_of(event)
        while current is not None and not current.name.startswith(AUTOGRAD_EVALUATE):
            current = parent_of(current)
        return current

    calls: dict[tuple, _Call] = {}
    key_of: dict[int, tuple] = {}
    forward_by_seq: dict[tuple[int, int], tuple] = {}  # (step, sequence_nr) -> top-level forward call key
    seen: list[dict[tuple, int]] = [defaultdict(int) for _ in steps]
    aten_events = sorted((e for e in events if e.name.startswith(ATEN_PREFIX)),
                         key=lambda e: (e.start_us, -e.end_us, e.id))
    for e in aten_events:  # start order, enclosing first: a parent is keyed before its children
        index = step_of(e)
        if index is None:
            continue
        phase = phase_of(e)
        ident = (phase, e.name, e.input_shapes)
        key = (*ident, seen[index][ident])
        seen[index][ident] += 1
        key_of[e.id] = key
        top = top_aten(e)
        call = calls.setdefault(key, _Call(key, phase, e.name, e.input_shapes, top_key=key_of.get(top.id, key)))
        call.total_us += own_us[e.id]
        if phase == "forward" and e.sequence_nr >= 0:
            forward_by_seq.setdefault((index, e.sequence_nr), call.top_key)
        elif phase == "backward" and call.forward_key is None:
            origin = backward_origin(e)
            if origin is not None and origin.sequence_nr >= 0:
                call.forward_key = forward_by_seq.get((index, origin.sequence_nr))
        if top.id != e.id and top.id in key_of:
            calls[key_of[top.id]].nested.add((normalize_op_name(e.name), e.input_shapes))

    def ir_node_of(call: _Call) -> str | None:
        key = call.forward_key if call.phase == "backward" else call.top_key
        return None if key is None else ir_nodes.get(key)

    ordered = list(calls.values())
    ir_nodes = match_ir_nodes([c for c in ordered if c.is_top and c.phase == "forward"], graph)
    records = tuple(
        OpRecord(seq=seq, phase=c.phase, name=c.name, kind=kind_of(c.name), input_shapes=c.shapes,
                 self_time_ms=us_to_ms(c.total_us / len(steps)),
                 ir_node=ir_node_of(c))
        for seq, c in enumerate(ordered)
    )
    step_us = [s.end_us - s.start_us for s in steps]
    forward_ms = sum(r.self_time_ms for r in records if r.phase == "forward")
    matched_ms = sum(r.self_time_ms for r in records if r.phase == "forward" and r.ir_node is not None)
    return OpProfile(
        steps=len(steps),
        iter_time_ms=us_to_ms(statistics.median(step_us)),
        ops=records,
        coverage=sum(c.total_us for c in ordered) / sum(step_us) if sum(step_us) > 0 else 0.0,
        matched_fraction=matched_ms / forward_ms if forward_ms > 0 else 0.0,
    )


def match_ir_nodes(calls: Sequence[_Call], graph: Graph | None) -> dict[tuple, str]:
    """Top-level forward calls (execution order) -> IR node ids, greedily in order (see the module doc)."""
    if graph is None:
        return {}
    nodes = graph.nodes
    matched: dict[tuple, str] = {}
    position = 0
    for call in calls:
        candidates = {(normalize_op_name(call.name), call.shapes), *call.nested}
        for j in range(position, min(len(nodes), position + MATCH_WINDOW)):
            op = normalize_op_name(nodes[j].op)
            if any(name == op and _shapes_match(shapes, nodes[j]) for name, shapes in candidates):
                matched[call.key] = nodes[j].id
                position = j + 1
                break
    return matched


def _shapes_match(shapes: tuple[tuple[int, ...], ...], node: Node) -> bool:
    """The tensor input shapes agree where both have them: one list is a prefix of the other (an optional
    tensor argument can be None in eager mode and a tensor in the export, e.g. an all-ones attention mask)."""
    node_shapes = tuple(t.shape for t in node.input_tensors if t.shape)
    common = min(len(shapes), len(node_shapes))
    return shapes[:common] == node_shapes[:common] and (common > 0 or len(shapes) == len(node_shapes))
