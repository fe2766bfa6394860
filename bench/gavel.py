"""Gavel's measured K80 and P100 throughputs against perfmodel: isolated steps/s, the P100/K80 speed-up per job, the
n-GPU scaling, host-bound jobs named, and co-located pairs held out by GPU and by job family; and one-GPU runs once
the other job families ran on that GPU (the fleet calibration from their measured throughputs, never the job's own).

    .venv/bin/python bench/gavel.py [--datasets DIR] [--write]

Every job type of Gavel's file is predicted through the prediction engine (`perfmodel.evaluation.gavel`). The
co-location model's constants (the host share of a measured step's unexplained time, the time-slicing switch
overhead, the wait per step for the other job's time slice) are fitted on one GPU's pairs and scored on the
other's, and on the pairs of job families left out of the fit; `--write` fits them on every pair and saves
`perfmodel/placement/colocation_params.json` with the model's error band (the 10th and 90th percentiles of its log
error on each job family held out of the fit), which widens a co-located answer's interval, and the band once a job
reported k of its pairs while sharing (the answer's interval then); the bench prints how often each band, fitted
without a family, holds the family. `--record [RUN]` records the printed MAPEs and rank
correlations for docs/accuracy.md (bench/_figures.py).
Data: Gavel (Narayanan et al., OSDI'20), stanford-futuredata/gavel, read in place, never copied.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from _figures import add_record_option, record_if_asked

from perfmodel.calibration.sharing import SHARING_PRIOR_OBSERVATIONS, SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN
from perfmodel.evaluation.gavel import (
    GAVEL_FILE,
    GAVEL_INTRA_LINK,
    SAME_JOB_COMBINED,
    UNMEASURED_WORKER,
    WORKERS,
    after_reports,
    answered_speedups,
    error_band,
    family,
    fit_params,
    host_bound,
    in_band,
    isolated_frame,
    kept_as_served,
    log_residuals,
    observed_on_the_gpu,
    pair_isolated,
    pair_mape,
    pairs_of,
    partner_ranking,
    predict_all,
    read_gavel,
    reported_residuals,
    scaling,
    served_coverage,
    speedups,
)
from perfmodel.placement.colocation import (
    ColocationParams,
    dump_colocation_params,
    load_colocation_params,
    params_path,
    preemption_of,
)
from perfmodel.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir)
    parser.add_argument("--write", action="store_true", help="fit the co-location constants on every pair, save")
    add_record_option(parser)
    args = parser.parse_args(argv)
    path = args.datasets / "gavel" / GAVEL_FILE
    if not path.is_file():
        print(f"no Gavel file at {path}", file=sys.stderr)
        return 2
    from perfmodel.engine import EngineConfig, PredictionEngine

    started = time.perf_counter()
    measured = read_gavel(path)
    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    predicted = predict_all(engine, measured, progress=lambda m: print("  " + m, flush=True))
    frame = isolated_frame(measured, predicted)
    hosts = host_bound(frame)
    print(f"\nhost-bound likely (measured step > 2x the predicted device time on both GPUs): {', '.join(hosts)}")
    print("\n## Isolated steps/s, MAPE % (all job types | without the host-bound ones)\n")
    frame = frame.assign(host=frame.job_type.isin(hosts))
    recorded: dict = {"isolated_mape_pct": {}, "isolated_without_host_bound_mape_pct": {}}
    for (worker, sf), group in frame.groupby(["worker", "scale_factor"]):
        rest = group[~group.host]
        recorded["isolated_mape_pct"].setdefault(worker, {})[f"x{sf}"] = group.ape.mean()
        recorded["isolated_without_host_bound_mape_pct"].setdefault(worker, {})[f"x{sf}"] = rest.ape.mean()
        print(f"  {worker:<20} x{sf}: {group.ape.mean():6.1f} | {rest.ape.mean():6.1f}   ({len(group)} job types)")
    one = frame[frame.scale_factor == 1]
    print("\nper job type, one GPU (measured -> predicted steps/s):")
    for r in one.sort_values(["worker", "job_type"]).itertuples():
        flag = "  host-bound likely" if r.host else ""
        print(f"  {r.worker:<20} {r.job_type:<34} {r.measured:9.2f} -> {r.predicted:9.2f} ({r.ape:5.1f} %){flag}")

    observed = observed_on_the_gpu(frame, engine.catalog)
    print("\n## One GPU, once the other job families ran there (their measured steps/s posted as observations;"
          " the fleet calibration, never the job's own), MAPE %: as served -> calibrated\n")
    recorded["observed"] = {}
    for worker, group in observed.groupby("worker"):
        rest = group[~group.host]
        recorded["observed"][worker] = {"mape_pct": group.ape.mean(),
                                        "calibrated_mape_pct": group.calibrated_ape.mean()}
        print(f"  {worker:<20} {group.ape.mean():6.1f} -> {group.calibrated_ape.mean():6.1f}   without the host-bound: "
              f"{rest.ape.mean():6.1f} -> {rest.calibrated_ape.mean():6.1f}   ({len(group)} job types)")
    both = observed.pivot_table(index="job_type", columns="worker", values=["measured", "calibrated"]).dropna()
    if {"k80", "p100"} <= set(both.columns.get_level_values(1)):
        measured_up = both[("measured", "p100")] / both[("measured", "k80")]
        calibrated_up = both[("calibrated", "p100")] / both[("calibrated", "k80")]
        recorded["observed"]["speedup"] = {"spearman": measured_up.rank().corr(calibrated_up.rank()),
                                           "mape_pct": float(np.mean(np.abs(calibrated_up / measured_up - 1)) * 100)}
        print(f"  P100 / K80 speed-up from the calibrated answers: Spearman "
              f"{recorded['observed']['speedup']['spearman']:.2f}, MAPE "
              f"{recorded['observed']['speedup']['mape_pct']:.1f} % ({len(both)} job types)")

    ratio = speedups(frame)
    rho = ratio.measured.rank().corr(ratio.predicted.rank())
    mape = float(np.mean(np.abs(ratio.predicted / ratio.measured - 1)) * 100)
    recorded["speedup"] = {"spearman": rho, "mape_pct": mape, "job_types": len(ratio)}
    print(f"\n## P100 / K80 speed-up per job type: Spearman {rho:.2f}, MAPE {mape:.1f} % ({len(ratio)} job types)")
    for job, r in ratio.iterrows():
        print(f"  {job:<34} measured {r.measured:5.2f}  predicted {r.predicted:5.2f}")
    v100 = answered_speedups(engine, measured, predicted, *UNMEASURED_WORKER)
    fast, p100 = engine.hardware(UNMEASURED_WORKER[1]), engine.hardware(WORKERS["p100"])
    print(f"\n## {UNMEASURED_WORKER[0].upper()} ({UNMEASURED_WORKER[1]}; no Gavel run here): the answered one-GPU "
          f"speed-up over each measured GPU, per job type (fp32 datasheet over the P100: "
          f"{fast.peak_fp32_gflops / p100.peak_fp32_gflops:.2f} FLOP/s, "
          f"{fast.memory_bandwidth_gb_s / p100.memory_bandwidth_gb_s:.2f} bandwidth)")
    for job, r in v100.iterrows():
        print(f"  {job:<34} {r[UNMEASURED_WORKER[0]]:9.2f} steps/s  over p100 {r.over_p100:5.2f}  "
              f"over k80 {r.over_k80:5.2f}")
    named = {"resnet18_b64": "ResNet-18 (batch size 64)", "cyclegan": "CycleGAN", "a3c": "A3C"}
    recorded["answered_v100"] = {"over_p100_min": float(v100.over_p100.min()),
                                 "over_p100_max": float(v100.over_p100.max()),
                                 **{f"over_p100_{key}": float(v100.loc[job, "over_p100"]) for key, job in named.items()
                                    if job in v100.index}}
    scaled = scaling(frame)
    scaled = scaled.assign(ape=(scaled.predicted / scaled.measured - 1).abs() * 100)
    print("\n## n-GPU / 1-GPU scaling ratio, MAPE %\n")
    by_scale = scaled.groupby(["worker", "scale_factor"]).ape.mean()
    print(by_scale.round(1).to_string())
    recorded["scaling_mape_pct"] = {worker: {"min": part.min(), "max": part.max()}
                                    for worker, part in by_scale.groupby(level="worker")}
    catalog_links = predict_all(engine, measured, intra_node_link=None)  # GPU peer-to-peer as the catalog has it
    as_catalogued = scaling(isolated_frame(measured, catalog_links))
    as_catalogued = as_catalogued.assign(ape=(as_catalogued.predicted / as_catalogued.measured - 1).abs() * 100)
    by_scale = as_catalogued.groupby(["worker", "scale_factor"]).ape.mean()
    print(f"\nthe same with the catalog's GPU peer-to-peer links instead of {GAVEL_INTRA_LINK!r} (servers without it):")
    print(by_scale.round(1).to_string())
    recorded["scaling_catalog_links_mape_pct"] = {worker: {"min": part.min(), "max": part.max()}
                                                  for worker, part in by_scale.groupby(level="worker")}

    pairs = pairs_of(measured, predicted)
    print(f"\n## Co-location: {len(pairs)} one-GPU pairs (from the measured isolated steps)\n")
    swapped = {worker: sorted(job for job, (_, table) in pair_isolated(measured, worker).items() if table != worker)
               for worker in ("k80", "p100")}
    for worker, jobs in swapped.items():
        if jobs:
            print(f"  {worker}: the pairs of {', '.join(jobs)} are against {worker}_unconsolidated's one-GPU isolated "
                  f"figure (two copies sharing the GPU keep a combined {SAME_JOB_COMBINED[0]}-{SAME_JOB_COMBINED[1]} "
                  f"of it, as every other job does of its own; the {worker} table's figure of it is a later "
                  f"measurement)")
    workers = ("k80", "p100")
    preemption = {worker: preemption_of(engine.hardware(WORKERS[worker]).architecture) for worker in workers}
    on = {worker: [p for p in pairs if p.worker == worker] for worker in workers}
    default = ColocationParams()
    shipped = {worker: load_colocation_params(preemption=preemption[worker]) for worker in workers}
    colocation: dict = {"pairs": len(pairs), "isolated_from_unconsolidated": swapped,
                        "as_served_mape_pct": float(np.average([kept_as_served(on[w], shipped[w]) for w in workers],
                                                               weights=[len(on[w]) for w in workers])),
                        "defaults": {"mape_pct": pair_mape(pairs, default),
                                     "partner_ranking": partner_ranking(pairs, default)}}
    print("  constants per GPU class (how it preempts compute): " + ", ".join(
        f"{w} {preemption[w]} (host share {shipped[w].host_share_of_gap:.2f}, wait {shipped[w].sync_wait_ms:.0f} ms)"
        for w in workers))
    print(f"  as served (the shipped constants, {shipped['p100'].source}; each job's share of its isolated throughput "
          f"from the predicted device and host time alone): MAPE {colocation['as_served_mape_pct']:.1f} % on the "
          f"share kept")
    print(f"  defaults (host share 0.5, no switch overhead, no wait): MAPE {colocation['defaults']['mape_pct']:.1f} "
          f"%, partner ranking {colocation['defaults']['partner_ranking']:.2f}")
    for train, test in (("k80", "p100"), ("p100", "k80")):
        fitted = fit_params(on[train], f"gavel {train}")
        band = error_band(log_residuals(on[train], fitted))
        result = {"mape_pct": pair_mape(on[test], fitted), "partner_ranking": partner_ranking(on[test], fitted),
                  "sync_wait_ms": fitted.sync_wait_ms,
                  "band_coverage": in_band(log_residuals(on[test], fitted), band)}
        colocation[f"{train}_to_{test}"] = result
        print(f"  fit on {train} (host share {fitted.host_share_of_gap:.2f}, switch {fitted.switch_overhead:.2f}, "
              f"wait {fitted.sync_wait_ms:.0f} ms), test on {test}: MAPE {result['mape_pct']:.1f} %, partner "
              f"ranking {result['partner_ranking']:.2f}; {train}'s 80 % error band [{band[0]:+.2f}, {band[1]:+.2f}] "
              f"(log) holds {result['band_coverage']:.0%} of {test}'s")
    families = sorted({family(p.a) for p in pairs} | {family(p.b) for p in pairs})
    # each family held out: constants fitted on the other families' pairs of the same GPU, as served per GPU class;
    # and, for comparison, one set of constants for both GPUs
    params_without = {(f, w): fit_params([p for p in on[w] if f not in (family(p.a), family(p.b))],
                                         f"{w} without {f}") for f in families for w in workers}
    errors, ranks, residuals, one_set = [], [], {}, []
    for held_family in families:
        inside = {w: [p for p in on[w] if held_family in (family(p.a), family(p.b))] for w in workers}
        errors.append(float(np.average([pair_mape(inside[w], params_without[(held_family, w)]) for w in workers],
                                       weights=[len(inside[w]) for w in workers])))
        ranks.append(float(np.nanmean([partner_ranking(inside[w], params_without[(held_family, w)])
                                       for w in workers])))
        residuals[held_family] = np.concatenate([log_residuals(inside[w], params_without[(held_family, w)])
                                                 for w in workers])
        both = [p for p in pairs if held_family in (family(p.a), family(p.b))]
        one_set.append(pair_mape(both, fit_params([p for p in pairs if p not in both], "")))
        print(f"  without {held_family:<15} (" + "; ".join(
            f"{w}: host {params_without[(held_family, w)].host_share_of_gap:.2f}, wait "
            f"{params_without[(held_family, w)].sync_wait_ms:.0f} ms" for w in workers)
            + f"): its pairs MAPE {errors[-1]:.1f} %, partner ranking {ranks[-1]:.2f} (one set of constants for both "
              f"GPUs: {one_set[-1]:.1f} %)")
    print(f"  leave one family out: mean MAPE {np.mean(errors):.1f} %, partner ranking {np.nanmean(ranks):.2f} (one "
          f"set of constants for both GPUs: {np.mean(one_set):.1f} %)")
    colocation["leave_one_family_out_mape_pct"] = float(np.mean(errors))
    colocation["leave_one_family_out_partner_ranking"] = float(np.nanmean(ranks))
    colocation["leave_one_family_out_one_set_mape_pct"] = float(np.mean(one_set))
    # the error band a family's answers carry comes from the other families' held-out errors: does it hold its own?
    coverage = {held_family: in_band(residuals[held_family], error_band(np.concatenate(
        [r for other, r in residuals.items() if other != held_family]))) for held_family in families}
    band = error_band(np.concatenate(list(residuals.values())))
    print(f"  80 % error band of the share kept, held out by family: [{band[0]:+.2f}, {band[1]:+.2f}] (log); "
          f"fitted without a family, it holds {np.mean(list(coverage.values())):.0%} of that family's jobs ("
          + ", ".join(f"{f} {c:.0%}" for f, c in coverage.items()) + ")")
    colocation["band_log"] = list(band)
    colocation["leave_one_family_out_band_coverage"] = float(np.mean(list(coverage.values())))

    def without(held_family: str, worker: str) -> ColocationParams:
        return params_without[(held_family, worker)]

    reports: dict = {}
    print(f"  after k reports of a job while sharing its GPU (its family held out of the constants), MAPE % of its "
          f"other pairs, by the prior's weight (served: {SHARING_PRIOR_OBSERVATIONS:g}, and "
          f"{SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN:g} where the job's own isolated reports calibrate it there):")
    for served in (False, True):
        found = after_reports(pairs, without, served=served)
        how = "as served (predicted isolated steps)" if served else "from the measured isolated steps"
        # keyed k{reports}_w{prior weight in hundredths}: k1_w10 is one report at weight 0.1
        reports["served" if served else "measured_isolated"] = {f"k{k}_w{round(prior * 100)}": value
                                                                for (k, prior), value in found.items()}
        for k in sorted({k for k, _ in found}):
            cells = ", ".join(f"{prior:g}: {value:.1f}" for (j, prior), value in sorted(found.items()) if j == k)
            print(f"    {how:<38} k={k}  {cells}")
    colocation["after_reports_mape_pct"] = reports
    reported_bands, reported_coverage = [], {}
    for k in (1, 2, 4):  # the answer's band once a job reported k pairs: as served, each family held out of the fit
        residuals_k = reported_residuals(pairs, without, k, served=True)
        band_k = error_band(np.concatenate(list(residuals_k.values())))
        held_k = {name: in_band(r, error_band(np.concatenate([v for other, v in residuals_k.items() if other != name])))
                  for name, r in residuals_k.items()}
        reported_bands.append((k, *band_k))
        reported_coverage[f"k{k}"] = {"band_log": list(band_k), "coverage": float(np.mean(list(held_k.values())))}
        print(f"    80 % error band once a job reported {k}: [{band_k[0]:+.2f}, {band_k[1]:+.2f}] (log); fitted "
              f"without a family, it holds {reported_coverage[f'k{k}']['coverage']:.0%} of that family's other pairs ("
              + ", ".join(f"{name} {c:.0%}" for name, c in held_k.items()) + ")")
    colocation["reported_band"] = reported_coverage
    for worker in workers:
        mape, covered = served_coverage(on[worker], shipped[worker])
        colocation[f"served_{worker}"] = {"mape_pct": mape, "interval_coverage": covered}
        print(f"  as served on the {worker} (predicted isolated steps with their intervals, the shipped constants and "
              f"band): co-located steps/s MAPE {mape:.1f} %, {covered:.0%} inside the answer's 80 % interval")
    if args.write:
        fitted = {preemption[w]: replace(fit_params(on[w], f"gavel {w} pairs (bench/gavel.py --write)"),
                                         kept_band_log=band, reported_band_log=tuple(reported_bands))
                  for w in workers}
        params_path().write_text(dump_colocation_params(fitted))
        print(f"\nwrote {params_path()}: " + "; ".join(
            f"{name}: host share {p.host_share_of_gap:.2f}, switch {p.switch_overhead:.2f}, wait "
            f"{p.sync_wait_ms:.0f} ms" for name, p in fitted.items())
            + f"; error band [{band[0]:+.2f}, {band[1]:+.2f}]")
    elapsed = time.perf_counter() - started
    print(f"\ndone in {elapsed:.0f} s")
    record_if_asked(args, "gavel", {**recorded, "colocation": colocation, "run_s": elapsed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
