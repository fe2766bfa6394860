"""Fused attention kernels (PyTorch's flash / memory-efficient SDPA, vLLM's flash attention) measured on GPUs, against
the price of their lowered rows: the fused kernel's GEMMs on their compute roofline (`gpu_iteration.on_chip_scale`),
and, beside it, the eager decomposition (scores through memory) a non-fused lowering prices.

    .venv/bin/python bench/fused_attention.py [--datasets DIR] [--record [RUN]]

Nothing here was fitted: the per-op model never saw an attention kernel (the importers skip them: no op class), and
the fused rule has no constant. Each measured kernel becomes a one-node graph (q, k, v of the measured shapes, the
node `causal` as measured) lowered by `graph_op_rows` and priced by the promoted per-op model as a step would be.

Data (read in place, never copied; credit in each dataset's PROVENANCE.md):
- Phantora (`phantora/tests/perfdb/l40s/compute.csv`): the `SDPA` and `SDPABackward` kernels it timed on an NVIDIA
  L40S inside Llama training steps (bf16, causal; CUPTI kernel time): two forward, two backward.
- LLMServingSim (`llmservingsim/profiler/perf/<GPU>/meta-llama/Llama-3.1-8B/bf16/tp1/attention.csv.gz`): vLLM's
  flash-attention kernel on an RTX 4090 and an RTX PRO 6000 Blackwell, the rows of a prefill alone (no history, no
  decode requests: `kv_prefill` = `n_decode` = 0), chunks of 16-2048 tokens, causal, Llama-3.1-8B's 32 query heads
  and 8 key/value heads of 128.

Prints, per source and GPU, predicted / measured (geometric mean) and the MAPE of each lowering. `--record [RUN]`
records them for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from _figures import add_record_option, record_if_asked

from perfmodel.core.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.lowering.rows import BACKWARD, FORWARD, graph_op_rows
from perfmodel.settings import get_settings

PHANTORA_FILE = Path("phantora") / "tests" / "perfdb" / "l40s" / "compute.csv"
PHANTORA_GPU = "l40s"
LLMSERVINGSIM = {"rtx-4090": "RTX4090", "rtx-pro-6000-blackwell-workstation": "RTXPRO6000"}
LLAMA_8B = {"q_heads": 32, "kv_heads": 8, "head_dim": 128}
TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def sdpa_graph(q: tuple[int, ...], k: tuple[int, ...], dtype: str, causal: bool, mode: str) -> Graph:
    """One fused SDPA node (q, k, v = k's shape with q's head dim) as a captured graph holds it."""
    tensors = tuple(TensorMeta(shape=shape, dtype=dtype) for shape in (q, k, k))
    out = TensorMeta(shape=q, dtype=dtype)
    flops = 4 * int(np.prod(q[:-1])) * k[-2] * q[-1]
    node = Node(id="sdpa", op="aten.scaled_dot_product_attention.default", kind=OpKind.attention,
                input_tensors=tensors, output_tensors=(out,), flops_fwd=flops,
                flops_bwd=2 * flops if mode == "train" else 0, causal=causal)
    return Graph(name="sdpa", source="torch.export", mode=mode, nodes=(node,),
                 totals=GraphTotals.from_nodes([node], params=0, param_bytes=0, activation_bytes=0))


def priced_us(predictor, graph: Graph, device: str, math: str, fused: bool) -> dict[str, float]:
    """Forward and backward of the graph's node on `device`, µs, lowered fused or as the eager decomposition."""
    from perfmodel.predictor.gpu_iteration import priced

    rows = graph_op_rows(graph, dtype=math, fused_attention=fused, attention_dropout=False)
    rows = rows.assign(math=math, device=device)
    out = priced(predictor.regressor, rows, predictor.catalog, np.full(len(rows), graph.mode == "train"))
    return {phase: float(out.latency_ms[(rows["phase"] == phase).to_numpy()].sum() * 1000)
            for phase in (FORWARD, BACKWARD)}


def phantora_kernels(root: Path) -> list[dict]:
    """The measured SDPA forward and backward kernels: shapes, causal, dtype, µs."""
    frame = pd.read_csv(root / PHANTORA_FILE)
    out = []
    for key, nanos in zip(frame["key"], frame["nanos"]):
        call = json.loads(key)
        op = next(iter(call))
        if op not in ("SDPA", "SDPABackward"):
            continue
        args = call[op]
        dtype, q = args["q"][0], tuple(args["q"][1])
        out.append({"phase": FORWARD if op == "SDPA" else BACKWARD, "q": q, "k": tuple(args["k"][1]),
                    "dtype": dtype, "causal": bool(args.get("causal")), "measured_us": nanos / 1000})
    return out


def llmservingsim_prefills(root: Path, folder: str) -> pd.DataFrame:
    path = (root / "llmservingsim" / "profiler" / "perf" / folder / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1"
            / "attention.csv.gz")
    frame = pd.read_csv(path)
    return frame[(frame.kv_prefill == 0) & (frame.n_decode == 0) & (frame.prefill_chunk > 0)]


def summary(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    ratio = predicted / measured
    return {"ratio": float(np.exp(np.log(ratio).mean())), "mape_pct": float(np.mean(np.abs(ratio - 1)) * 100)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir)
    add_record_option(parser)
    args = parser.parse_args(argv)
    from perfmodel.predictor.gpu_iteration import DevicePredictor

    predictor = DevicePredictor.load()
    figures: dict[str, dict] = {}

    print(f"## Phantora: PyTorch SDPA kernels in Llama training steps on an {PHANTORA_GPU} (bf16), µs")
    print("  phase     q shape               causal  measured     fused (ratio)     eager decomposition (ratio)")
    kernels = phantora_kernels(args.datasets)
    rows = []
    for k in kernels:
        graph = sdpa_graph(k["q"], k["k"], TORCH_DTYPES[k["dtype"]], k["causal"], "train")
        fused = priced_us(predictor, graph, PHANTORA_GPU, k["dtype"], True)[k["phase"]]
        eager = priced_us(predictor, graph, PHANTORA_GPU, k["dtype"], False)[k["phase"]]
        rows.append((k["measured_us"], fused, eager))
        print(f"  {k['phase']:<9} {k['q']!s:<21} {k['causal']!s:<7} {k['measured_us']:9.1f} "
              f"{fused:9.1f} ({fused / k['measured_us']:.2f}) {eager:12.1f} ({eager / k['measured_us']:.2f})")
    table = np.array(rows)
    figures["phantora_l40s"] = {"kernels": len(table), "fused": summary(table[:, 0], table[:, 1]),
                                "eager": summary(table[:, 0], table[:, 2])}

    print("\n## LLMServingSim: vLLM flash attention, a Llama-3.1-8B prefill alone (bf16, causal), µs")
    q_heads, kv_heads, head_dim = LLAMA_8B["q_heads"], LLAMA_8B["kv_heads"], LLAMA_8B["head_dim"]
    for device, folder in LLMSERVINGSIM.items():
        frame = llmservingsim_prefills(args.datasets, folder)
        rows = []
        for r in frame.itertuples():
            graph = sdpa_graph((1, q_heads, r.prefill_chunk, head_dim), (1, kv_heads, r.prefill_chunk, head_dim),
                               "bfloat16", True, "inference")
            rows.append((r.time_us, priced_us(predictor, graph, device, "bf16", True)[FORWARD],
                         priced_us(predictor, graph, device, "bf16", False)[FORWARD]))
        table = np.array(rows)
        fused, eager = summary(table[:, 0], table[:, 1]), summary(table[:, 0], table[:, 2])
        big = table[frame.prefill_chunk.to_numpy() >= 512]
        large = summary(big[:, 0], big[:, 1])
        print(f"  {device:<36} {len(table):3d} prefills of 16-2048 tokens: fused {fused['ratio']:.2f}x the measured "
              f"(MAPE {fused['mape_pct']:.1f} %), eager decomposition {eager['ratio']:.2f}x "
              f"(MAPE {eager['mape_pct']:.1f} %); at 512 tokens and more fused {large['ratio']:.2f}x "
              f"(MAPE {large['mape_pct']:.1f} %)")
        figures[device.replace("-", "_")] = {"prefills": len(table), "fused": fused, "eager": eager,
                                             "fused_512_tokens_and_more": large}
    record_if_asked(args, "fused_attention", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
