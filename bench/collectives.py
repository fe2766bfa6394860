"""Fit the α-β collective model (`perfmodel.placement.comm`) to every link type in the public NCCL measurements.

Run: .venv/bin/python bench/collectives.py [--datasets ../shared/datasets] [--write]

Data (credit: microsoft/vidur MLSys'24, MIT; VIA-Research/vTrain MICRO'24, MIT; baidu-research/DeepBench,
Apache-2.0):
- vidur `data/profiling/network/<node>/{all_reduce,send_recv}.csv.gz` (via `perfmodel.importers.vidur`): NCCL
  on fp16 buffers of 2 KB-64 MB (pairwise A100 all-reduce to 512 MB), DGX A100 (NVSwitch; 2 nodes over the
  cluster network), Azure NC96ads A100 v4 (4 A100 PCIe in NVLink-bridged pairs) and an 8 x A40 node.
- vTrain `trace/{a100,v100}/AR_GPU<p>_1M_1024M_LUT`: nccl-tests all-reduce, 1 MB-1 GB, p = 2..8 GPUs of one node
  (out-of-place time, ns).
- DeepBench `tidy/deepbench_all_reduce.csv` (via `perfmodel.importers.deepbench`): NCCL 2.0 all-reduce rows of
  2-8 PCIe GPUs (M40, TitanX, TitanX Pascal, 1080 Ti, P100 PCIe; 16/32-GPU rows span nodes of unknown make-up and
  mix algorithms, so they are left out).

One link type = one group of rows (one node kind, one collective, intra- or inter-node); all-reduce rows are fitted
with the ring formula (NCCL's choice at these sizes), send/recv rows with α + S·β. For each link: rows, α (µs),
effective bandwidth 1/β (GB/s per direction), the fit's MAPE on its own rows, and a held-out MAPE: with several
world sizes, fit on all but the largest and predict the largest; with one, fit on the smallest 75 % of message sizes
and predict the largest 25 %. Then the DGX A100 cross-node all-reduces (2 nodes x 2/4/8 GPUs) are predicted by the
hierarchical formula from the intra-node NVSwitch and inter-node fits (never fitted on those rows).

`--write` saves the table as perfmodel/placement/links.json. `--record [RUN]` records each link's fit and held-out
MAPE, and the ranges of the hierarchical check and the spec rule, for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, record_if_asked

from perfmodel.core.accuracy import mape_pct
from perfmodel.hardware.catalog import get_accelerator, load_catalog
from perfmodel.importers.deepbench import deepbench_files, import_deepbench
from perfmodel.importers.vidur import import_vidur, vidur_files
from perfmodel.placement.comm import (
    PCIE_X16_PER_DIR_GB_S,
    LinkModel,
    dump_link_table,
    fit_link,
    hierarchical_allreduce_ms,
    links_path,
    nominal_intra_per_dir_gb_s,
    predict,
)
from perfmodel.settings import get_settings

DEFAULT_DATASETS = get_settings().datasets_dir
COLUMNS = ["dataset", "group", "algorithm", "message_bytes", "world_size", "nodes", "devices_per_node",
           "latency_ms", "device", "file"]


def vidur_rows(root: Path) -> pd.DataFrame:
    files = [f for f in vidur_files(root) if "/network/" in f]
    out = []
    for r in import_vidur(root, files=files):
        out.append({"dataset": "vidur", "group": r.extra["node"],
                    "algorithm": "ring" if r.op_class == "allreduce" else "send_recv",
                    "message_bytes": r.message_bytes, "world_size": r.world_size, "nodes": r.nodes,
                    "devices_per_node": r.extra.get("devices_per_node"), "latency_ms": r.latency_ms,
                    "device": r.device, "file": r.source_file})
    return pd.DataFrame(out, columns=COLUMNS)


def vtrain_rows(root: Path) -> pd.DataFrame:
    frames = []
    devices = {"a100": "a100-sxm4-40gb", "v100": "v100-sxm2-32gb"}  # vTrain's nodes: NVSwitch A100, DGX-1 V100
    for path in sorted(root.glob("trace/*/AR_GPU*_1M_1024M_LUT")):
        gpu, p = path.parent.name, int(path.name.split("_")[1].removeprefix("GPU"))
        raw = pd.read_csv(path)
        frames.append(pd.DataFrame({
            "dataset": "vtrain", "group": gpu, "algorithm": "ring", "message_bytes": raw["size(B)"],
            "world_size": p, "nodes": 1, "devices_per_node": p, "latency_ms": raw["time(ns)"] * 1e-6,  # out-of-place
            "device": devices.get(gpu, gpu), "file": str(path.relative_to(root))}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def deepbench_rows(root: Path) -> pd.DataFrame:
    files = [f for f in deepbench_files(root) if "all_reduce" in f]
    out = []
    for r in import_deepbench(root, files=files):
        algo = str(r.extra.get("algorithm", ""))
        if not algo.startswith("NCCL") or not r.world_size or r.world_size > 8 or r.device.startswith("xeon"):
            continue
        out.append({"dataset": "deepbench", "group": r.device, "algorithm": "ring", "message_bytes": r.message_bytes,
                    "world_size": r.world_size, "nodes": 1, "devices_per_node": r.world_size,
                    "latency_ms": r.latency_ms, "device": r.device, "file": r.source_file})
    return pd.DataFrame(out, columns=COLUMNS)


@dataclass
class Group:
    name: str
    dataset: str
    select: Callable[[pd.DataFrame], pd.Series]
    scope: str  # intra | inter
    family: str  # nvlink | pcie | network | unknown
    device: str
    nominal_per_dir_gb_s: float | None = None  # per direction, for the spec rule (intra only)
    use_for_spec: bool = False
    note: str = ""
    extra: dict = field(default_factory=dict)


def groups(catalog) -> list[Group]:
    def nominal(name: str) -> float | None:
        return nominal_intra_per_dir_gb_s(get_accelerator(name, catalog))

    g = []
    v = "vidur"
    g.append(Group("nvswitch-a100-dgx", v, lambda d: (d.group == "a100_dgx") & (d.algorithm == "ring") & (d.nodes == 1),
                   "intra", "nvlink", "a100-sxm4-80gb", nominal("a100-sxm4-80gb"), True,
                   "DGX A100, NVLink3 via NVSwitch, all-reduce on 2/4/8 GPUs"))
    g.append(Group("nvswitch-a100-dgx-p2p", v,
                   lambda d: (d.group == "a100_dgx") & (d.algorithm == "send_recv") & (d.nodes == 1),
                   "intra", "nvlink", "a100-sxm4-80gb", nominal("a100-sxm4-80gb"), False, "DGX A100 send/recv"))
    g.append(Group("net-a100-dgx", v, lambda d: (d.group == "a100_dgx") & (d.algorithm == "ring") & (d.world_size == 2)
                   & (d.nodes == 2), "inter", "network", "a100-sxm4-80gb", None, False,
                   "DGX A100 cluster network, all-reduce 2 nodes x 1 GPU"))
    g.append(Group("net-a100-dgx-p2p", v, lambda d: (d.group == "a100_dgx") & (d.algorithm == "send_recv")
                   & (d.nodes == 2), "inter", "network", "a100-sxm4-80gb", None, False,
                   "DGX A100 cluster network, send/recv across 2 nodes"))
    g.append(Group("nvlink3-bridge-a100-pair", v, lambda d: (d.group == "a100_pairwise_nvlink")
                   & (d.algorithm == "ring") & (d.world_size == 2), "intra", "nvlink", "a100-pcie-80gb",
                   nominal("a100-pcie-80gb"), True,
                   "Azure NC96ads A100 v4: all-reduce within an NVLink-bridged pair"))
    g.append(Group("nvlink3-bridge-a100-pair-p2p", v, lambda d: (d.group == "a100_pairwise_nvlink")
                   & (d.algorithm == "send_recv") & (d.nodes == 1), "intra", "nvlink", "a100-pcie-80gb",
                   nominal("a100-pcie-80gb"), False, "send/recv within an NVLink-bridged pair"))
    g.append(Group("pcie4-a100-nc96", v, lambda d: (d.group == "a100_pairwise_nvlink") & (d.algorithm == "ring")
                   & (d.world_size == 4), "intra", "pcie", "a100-pcie-80gb", PCIE_X16_PER_DIR_GB_S[4], True,
                   "all-reduce over 4 GPUs = 2 bridged pairs: the ring crosses PCIe Gen4 (the bottleneck)"))
    g.append(Group("net-azure-nc96-a100-p2p", v, lambda d: (d.group == "a100_pairwise_nvlink")
                   & (d.algorithm == "send_recv") & (d.nodes == 2), "inter", "network", "a100-pcie-80gb", None, False,
                   "Azure NC96ads A100 v4 cluster network, send/recv across 2 nodes"))
    g.append(Group("a40-node-intra-p2p", v, lambda d: (d.group == "a40_pairwise_nvlink") & (d.nodes == 1),
                   "intra", "unknown", "a40", nominal("a40"), False,
                   "8 x A40 node, send/recv between 2 GPUs of one node; ~4 GB/s, far below NVLink (56 GB/s/dir) and "
                   "PCIe Gen4: the pair does not appear to use NVLink or P2P, so not used for the spec rule"))
    g.append(Group("net-a40-node-p2p", v, lambda d: (d.group == "a40_pairwise_nvlink") & (d.nodes == 2),
                   "inter", "network", "a40", None, False, "A40 nodes' network, send/recv across 2 nodes"))
    g.append(Group("nvswitch-a100-vtrain", "vtrain", lambda d: d.group == "a100", "intra", "nvlink", "a100-sxm4-40gb",
                   nominal("a100-sxm4-40gb"), True, "vTrain A100 node (NVSwitch), nccl-tests all-reduce p=2..8"))
    g.append(Group("nvlink2-v100-vtrain", "vtrain", lambda d: d.group == "v100", "intra", "nvlink", "v100-sxm2-32gb",
                   nominal("v100-sxm2-32gb"), True,
                   "vTrain V100 node (DGX-1-like hybrid cube-mesh NVLink2), nccl-tests all-reduce p=2..8; "
                   "bus bandwidth depends on p (22.5 GB/s at 2, 85 at 4, 134 at 8): one α-β pair fits it poorly"))
    for dev in ("m40", "titan-x-maxwell", "titan-x-pascal", "gtx-1080-ti", "p100-pcie-16gb"):
        spec = get_accelerator(dev, catalog)
        g.append(Group(f"pcie{spec.pcie_gen}-{dev}-deepbench", "deepbench", lambda d, dev=dev: d.group == dev,
                       "intra", "pcie", dev, nominal_intra_per_dir_gb_s(spec), True,
                       "DeepBench NCCL 2.0 all-reduce on 2-8 PCIe GPUs (node topology not published)"))
    return g


def heldout(rows: pd.DataFrame, fit_kwargs: dict) -> tuple[str, float | None]:
    """(what was held out, MAPE on it)."""
    sizes = sorted(rows.world_size.unique())
    if len(sizes) > 1:
        test = rows.world_size == sizes[-1]
        label = f"p={sizes[-1]} from p={','.join(str(int(s)) for s in sizes[:-1])}"
    else:
        cut = rows.message_bytes.quantile(0.75)
        test = rows.message_bytes > cut
        label = f"sizes>{cut / 2**20:.1f}MiB from smaller"
    train = rows[~test]
    if len(train) < 2 or test.sum() == 0:
        return label, None
    link = fit_link(train.message_bytes, train.world_size, train.latency_ms, train.algorithm.to_numpy(), **fit_kwargs)
    test_rows = rows[test]
    return label, mape_pct(predict(link, test_rows.message_bytes, test_rows.world_size, test_rows.algorithm.to_numpy()),
                       test_rows.latency_ms)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--write", action="store_true", help="save perfmodel/placement/links.json")
    add_record_option(parser)
    args = parser.parse_args(argv)
    root = args.datasets
    if not (root / "vidur").is_dir():
        print(f"no datasets under {root}", file=sys.stderr)
        return 2
    data = pd.concat([vidur_rows(root / "vidur"), vtrain_rows(root / "vtrain"), deepbench_rows(root / "deepbench")],
                     ignore_index=True)
    for col in ("message_bytes", "world_size", "nodes", "devices_per_node", "latency_ms"):
        data[col] = pd.to_numeric(data[col])
    catalog = load_catalog()

    entries, fitted = [], {}
    header = f"{'link':32s} {'rows':>5s} {'p':>9s} {'alpha_us':>9s} {'GB/s':>8s} {'eff':>5s} {'fitMAPE%':>9s} " \
             f"{'heldMAPE%':>9s}  held out"
    print(header)
    print("-" * len(header))
    for grp in groups(catalog):
        rows = data[(data.dataset == grp.dataset) & grp.select(data)]
        if rows.empty:
            print(f"{grp.name:32s} (no rows)")
            continue
        source = f"{grp.dataset}:" + ",".join(sorted(rows.file.unique()))
        algo = rows.algorithm.to_numpy()
        link = fit_link(rows.message_bytes, rows.world_size, rows.latency_ms, algo, name=grp.name, source=source)
        fit_err = mape_pct(predict(link, rows.message_bytes, rows.world_size, algo), rows.latency_ms)
        label, held = heldout(rows, {"name": grp.name, "source": source})
        fitted[grp.name] = link
        eff = link.bandwidth_per_dir_gb_s / grp.nominal_per_dir_gb_s if grp.nominal_per_dir_gb_s else None
        ps = ",".join(str(int(p)) for p in sorted(rows.world_size.unique()))
        print(f"{grp.name:32s} {len(rows):5d} {ps:>9s} {link.alpha_us:9.2f} {link.bandwidth_per_dir_gb_s:8.2f} "
              f"{'' if eff is None else f'{eff:.2f}':>5s} {fit_err:9.1f} "
              f"{'' if held is None else f'{held:.1f}':>9s}  {label}")
        entries.append({
            "name": grp.name, "alpha_ms": link.alpha_ms, "beta_ms_per_byte": link.beta_ms_per_byte,
            "bandwidth_per_dir_gb_s": link.bandwidth_per_dir_gb_s, "source": source, "dataset": grp.dataset,
            "collective": sorted(set(algo.tolist())), "scope": grp.scope, "family": grp.family,
            "device": grp.device, "nominal_per_dir_gb_s": grp.nominal_per_dir_gb_s, "use_for_spec": grp.use_for_spec,
            "world_sizes": sorted(int(p) for p in rows.world_size.unique()),
            "message_bytes_range": [int(rows.message_bytes.min()), int(rows.message_bytes.max())],
            "rows": int(len(rows)), "fit_mape_pct": round(fit_err, 2),
            "heldout": {"what": label, "mape_pct": None if held is None else round(held, 2)}, "note": grp.note})

    # hierarchical check: DGX A100 2-node all-reduces predicted from the intra- and inter-node fits
    hierarchical, spec_rule = [], []
    cross = data[(data.dataset == "vidur") & (data.group == "a100_dgx") & (data.algorithm == "ring")
                 & (data.nodes == 2) & (data.devices_per_node > 1)]
    if not cross.empty and {"nvswitch-a100-dgx", "net-a100-dgx"} <= fitted.keys():
        print("\nhierarchical all-reduce, DGX A100 x 2 nodes (intra nvswitch-a100-dgx + inter net-a100-dgx; "
              "never fitted on these rows)")
        for rails_label, rails in (("1 NIC rail per GPU", None), ("1 shared rail per node", 1)):
            for g, rows in cross.groupby("devices_per_node"):
                pred = hierarchical_allreduce_ms(fitted["nvswitch-a100-dgx"], fitted["net-a100-dgx"],
                                                 rows.message_bytes, rows.nodes, rows.devices_per_node, rails)
                ratio = np.median(pred / rows.latency_ms)
                hierarchical.append(mape_pct(pred, rows.latency_ms))
                print(f"  {rails_label:24s} 2x{int(g)}: rows {len(rows)}, MAPE {mape_pct(pred, rows.latency_ms):6.1f}%,"
                      f" median predicted/measured {ratio:.2f}")
    # the spec rule, leave-one-link-out: each usable link's bandwidth and α from the others of its family
    usable = [e for e in entries if e["use_for_spec"] and e["scope"] == "intra"]
    if len(usable) > 1:
        print("\nspec rule, leave-one-link-out (link from nominal bandwidth x the other links' median efficiency)")
        for entry in usable:
            others = [e for e in usable if e is not entry]
            same = [e for e in others if e["family"] == entry["family"]] or others
            eff = float(np.median([e["bandwidth_per_dir_gb_s"] / e["nominal_per_dir_gb_s"] for e in same]))
            alpha = float(np.median([e["alpha_ms"] for e in same]))
            spec_link = LinkModel(alpha, 1e-6 / (entry["nominal_per_dir_gb_s"] * eff), entry["name"], "spec rule")
            grp = next(g for g in groups(catalog) if g.name == entry["name"])
            rows = data[(data.dataset == grp.dataset) & grp.select(data)]
            err = mape_pct(predict(spec_link, rows.message_bytes, rows.world_size, rows.algorithm.to_numpy()),
                       rows.latency_ms)
            spec_rule.append(err)
            print(f"  {entry['name']:32s} predicted {spec_link.bandwidth_per_dir_gb_s:7.1f} GB/s vs fitted "
                  f"{entry['bandwidth_per_dir_gb_s']:7.1f}; MAPE on its rows {err:6.1f}%")
    record_if_asked(args, "collectives", {
        "links": {e["name"]: {"rows": e["rows"], "fit_mape_pct": e["fit_mape_pct"],
                              "heldout_mape_pct": e["heldout"]["mape_pct"]} for e in entries},
        "hierarchical_mape_pct": {"min": min(hierarchical), "max": max(hierarchical)} if hierarchical else None,
        "spec_rule_mape_pct": {"min": min(spec_rule), "max": max(spec_rule)} if spec_rule else None})
    print("\nsources: vidur (microsoft/vidur, MIT), vTrain (VIA-Research/vTrain, MIT), DeepBench "
          "(baidu-research/DeepBench, Apache-2.0)")
    if args.write:
        links_path().write_text(dump_link_table(entries), encoding="utf-8")
        print(f"wrote {links_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
