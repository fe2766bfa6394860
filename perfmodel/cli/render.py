"""Human-readable rendering of graphs and profiles for the CLI (rich tables). No computation lives here."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from perfmodel.core.ir import Graph
from perfmodel.core.units import human_bytes, human_count
from perfmodel.records import Profile


def render_graph_summary(console: Console, g: Graph) -> None:
    t = g.totals
    console.print(f"[bold]{g.name}[/] ({g.source}, {g.mode}): {t.nodes} ops, {human_count(t.params)} params "
                  f"({human_bytes(t.param_bytes)}), forward {human_count(t.flops_fwd)}FLOP, backward "
                  f"{human_count(t.flops_bwd)}FLOP, op outputs {human_bytes(t.activation_bytes)}"
                  + (f", saved for backward {human_bytes(t.saved_activation_bytes)} (what the memory estimate uses)"
                     if t.saved_activation_bytes is not None else ""))
    table = Table("kind", "ops", "forward FLOPs", "share", title="ops by kind")
    total = max(t.flops_fwd, 1)
    for kind, count in sorted(t.ops_by_kind.items(), key=lambda kv: -t.flops_fwd_by_kind.get(kv[0], 0)):
        flops = t.flops_fwd_by_kind.get(kind, 0)
        table.add_row(kind, str(count), human_count(flops), f"{100 * flops / total:.1f}%")
    console.print(table)


def uses_seq_len(spec: Any) -> bool:
    """Token models (HF configs, zoo text/recurrent models) have a sequence length; image models do not."""
    from perfmodel.jobs.zoo import InputKind, get_entry

    if spec.source.kind == "zoo":
        return get_entry(spec.source.name).inputs not in (InputKind.image, InputKind.recsys)
    return spec.source.kind == "hf_config"


def profile_as_json(p: Profile) -> dict[str, Any]:
    """The figures a script reads: iteration statistics, coverage, per-kind op time; not every op."""
    it = p.iteration
    data: dict[str, Any] = {
        "job_name": p.job.name,
        "job_id": p.job_id,
        "family": p.family,
        "spec": p.job.model_dump(mode="json"),
        "device": p.environment.device,
        "device_name": p.environment.device_name,
        "iteration": it.model_dump(mode="json", exclude={"samples_ms"}) if it else None,
    }
    if p.ops is not None:
        data["ops"] = {"coverage": p.ops.coverage, "matched_fraction": p.ops.matched_fraction,
                       "iter_time_ms": p.ops.iter_time_ms, "time_ms_by_kind": op_time_by_kind(p),
                       "time_ms_by_phase": op_time_by_phase(p)}
    if p.onnx is not None:
        data["onnx"] = {"provider": p.onnx.provider,
                        "iter_time_ms_disabled": p.onnx.iter_time_ms_disabled,
                        "iter_time_ms_enabled": p.onnx.iter_time_ms_enabled,
                        "nodes": len(p.onnx.nodes)}
    return data


def op_time_by_kind(p: Profile) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for op in p.ops.ops if p.ops else ():
        totals[op.kind.value] += op.self_time_ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def op_time_by_phase(p: Profile) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for op in p.ops.ops if p.ops else ():
        totals[op.phase] += op.self_time_ms
    return dict(totals)


def render_profile(console: Console, p: Profile, profile_id: int | None = None, top: int = 10) -> None:
    env, it = p.environment, p.iteration
    spec = p.job
    head = f"[bold]{spec.name}[/] {spec.mode.value} b={spec.batch_size}"
    if uses_seq_len(spec):
        head += f" seq={spec.seq_len}"
    head += f" {spec.precision.value} on {env.device_name} ({env.device}, {env.threads} threads)"
    if profile_id is not None:
        head += f"  [dim]profile #{profile_id}[/]"
    console.print(head)
    if it is not None:
        if it.outcome.value == "oom":
            console.print(f"  outcome: [red]out of memory[/] ({it.error})")
        else:
            console.print(
                f"  iteration: median {it.iter_time_ms_median:.2f} ms (p10 {it.iter_time_ms_p10:.2f}, p90 "
                f"{it.iter_time_ms_p90:.2f}, CV {100 * (it.iter_time_cv or 0):.1f}%, {it.repeats} repeats), "
                f"{it.throughput_samples_per_s:.1f} samples/s, peak memory "
                f"{human_bytes(it.peak_memory_bytes or 0)}")
    if p.ops is not None:
        console.print(f"  per-op: {len(p.ops.ops)} aten calls/step, coverage {p.ops.coverage:.2f} of "
                      f"{p.ops.iter_time_ms:.2f} ms, {100 * p.ops.matched_fraction:.0f}% of forward time "
                      f"matched to IR nodes")
        phases = op_time_by_phase(p)
        console.print("  by phase: " + ", ".join(f"{k} {v:.2f} ms" for k, v in phases.items()))
        table = Table("kind", "ms/step", "share", title="op time by kind")
        total = sum(op.self_time_ms for op in p.ops.ops) or 1.0
        for kind, ms in list(op_time_by_kind(p).items())[:top]:
            table.add_row(kind, f"{ms:.3f}", f"{100 * ms / total:.1f}%")
        console.print(table)
    if p.onnx is not None:
        o = p.onnx
        console.print(f"  ONNX Runtime ({o.provider}): {o.iter_time_ms_disabled:.2f} ms unoptimised, "
                      f"{o.iter_time_ms_enabled:.2f} ms optimised, {len(o.nodes)} node records")


def render_profile_list(console: Console, rows: list[Any]) -> None:
    table = Table("id", "job", "device", "b", "seq", "prec", "mode", "outcome", "median ms", "samples/s",
                  "coverage", "created (UTC)", title=f"{len(rows)} profiles")
    for r in rows:
        table.add_row(str(r.id), r.job_name, r.device_name, str(r.batch_size), str(r.seq_len), r.precision,
                      r.mode, r.outcome, _fmt(r.iter_time_ms_median), _fmt(r.throughput_samples_per_s),
                      _fmt(r.coverage), str(r.created_at)[:16])
    console.print(table)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def import_as_json(source: str, path: str, stats: Any, added: int, seconds: float) -> dict[str, Any]:
    """What `perfmodel import` did, for scripts: records per file and op class, per device and op class, skips."""
    return {
        "source": source,
        "path": path,
        "records": stats.total,
        "added": added,
        "seconds": round(seconds, 2),
        "files": [{"file": f, "op_class": c, "records": n} for (f, c), n in sorted(stats.records.items())],
        "by_device": [{"device": d, "op_class": c, "records": n} for (d, c), n in sorted(stats.by_device.items())],
        "unknown_devices": dict(stats.unknown_devices.most_common()),
        "skipped": dict(stats.skipped.most_common()),
    }


def render_import(console: Console, summary: dict[str, Any]) -> None:
    """The outcome of `perfmodel import`: records per file, per device and op class, what was skipped, totals."""
    per_file: dict[str, dict[str, int]] = defaultdict(dict)
    for row in summary["files"]:
        per_file[row["file"]][row["op_class"]] = row["records"]
    table = Table("file", "op classes", "records", title=f"{summary['source']}: records per file")
    for name, classes in per_file.items():
        table.add_row(name, ", ".join(f"{c} {n}" for c, n in classes.items()), str(sum(classes.values())))
    console.print(table)
    table = Table("device", "op class", "records", title="records per device and op class")
    for row in summary["by_device"]:
        table.add_row(row["device"], row["op_class"], str(row["records"]))
    console.print(table)
    if summary["unknown_devices"]:
        table = Table("device (as the data names it)", "rows skipped",
                      title="devices not in the hardware catalog (add them, then import again)")
        for name, n in summary["unknown_devices"].items():
            table.add_row(name, str(n))
        console.print(table)
    for reason, n in summary["skipped"].items():
        console.print(f"skipped {n} row(s): {reason}")
    skipped = sum(summary["unknown_devices"].values())
    console.print(f"[bold]{summary['records']}[/] records read from {len(per_file)} file(s), "
                  f"[bold]{summary['added']}[/] new in the store "
                  f"({summary['records'] - summary['added']} already there), {skipped} row(s) of unknown devices "
                  f"skipped, {summary['seconds']:.1f} s")


def render_measurement_counts(console: Console, counts: list[tuple[Any, ...]]) -> None:
    table = Table("source", "device", "op class", "dtype", "records",
                  title=f"{sum(c[-1] for c in counts)} imported op measurements")
    for *keys, n in counts:
        table.add_row(*(str(k) for k in keys), str(n))
    console.print(table)
