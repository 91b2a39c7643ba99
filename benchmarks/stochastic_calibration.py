"""How often the judge's statistical check of a stochastic reference (cuda_agent.judge.stochastic)
refuses a correct sampler, and how surely it refuses wrong ones, on the CPU in minutes.

Each call draws a fresh task (dropout then a softmax, dropout last, a row sum after dropout, added
uniform noise, Bernoulli outputs; several shapes), 17 reference draws and one candidate output,
and judges the candidate with `compare_draws`, the judge's own function. Honest candidates draw the
same distribution with their own generator; wrong ones leave the random part out, return its
expectation, keep the wrong fraction, skip the 1/(1-p) scaling, or draw other noise. Consecutive
calls form runs (as the judge's training-mode calls do) for the run tests (`run_ks_bound`, Z_RUN).

For the honest calls it also reports the tail of the rank test's ratio (the candidate's KS distance
over the draws' mean; each draw's own ratio to the others' mean, leave one out, pooled in) and run
means resampled from those ratios against `run_ks_bound`, and the tail of the spread test's per-call z; for every
sampler, the calls and runs the earlier check (one call's bound RATIO x the draws' worst alone, no
run rank test, the spread test at EARLIER_Z_CALL and EARLIER_Z_RUN) refused. Prints a table; --out writes it as JSON.

    python benchmarks/stochastic_calibration.py --calls 400 --wrong-calls 48
    python benchmarks/stochastic_calibration.py --calls 5000 --shapes softmax:64x128 --out calib.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from cuda_agent.judge import stochastic as S

P = 0.2
# The check before 2026-12-07, for the "before" columns: one call's rank bound RATIO x the draws'
# worst alone (no MEAN_RATIO, no run rank test), the spread test at these bounds.
EARLIER_Z_CALL = 8.0
EARLIER_Z_RUN = 5.0
SHAPES = ["softmax:16x64", "softmax:64x128", "softmax:128x256", "softmax:4x4096", "last:128x256",
          "rowsum:128x256", "noise:64x256", "bernoulli:64x64"]


def sampler(kind: str, z: torch.Tensor):
    """`draw(gen, variant)`: one output of the task `kind` on logits `z`, as `variant` computes it."""
    def dropout(gen, p=P, scale=None):
        y = z * (torch.rand(z.shape, generator=gen) >= p).float() * (1 / (1 - p) if scale is None else scale)
        return torch.softmax(y, 1) if kind == "softmax" else y.sum(1) if kind == "rowsum" else y

    def draw(gen, variant="honest"):
        if kind == "noise":
            u = {"honest": lambda: torch.rand(z.shape, generator=gen),
                 "expectation": lambda: torch.full_like(z, 0.5),
                 "half the noise": lambda: 0.25 + 0.5 * torch.rand(z.shape, generator=gen),
                 "gaussian noise": lambda: 0.5 + torch.randn(z.shape, generator=gen) / 12 ** 0.5}[variant]()
            return z + 0.1 * u
        if kind == "bernoulli":
            prob = torch.sigmoid(z)
            return {"honest": lambda: torch.bernoulli(prob, generator=gen),
                    "expectation": lambda: prob,
                    "threshold at 0.5": lambda: (prob > 0.5).float(),
                    "probability +0.05": lambda: torch.bernoulli((prob + 0.05).clamp(0, 1), generator=gen)}[variant]()
        return {"honest": lambda: dropout(gen),
                "no dropout": lambda: dropout(gen, p=0.0),
                "expectation (16 draws)": lambda: torch.stack([dropout(gen) for _ in range(16)]).mean(0),
                "uniform 1/N": lambda: torch.full_like(dropout(gen), 1 / z.shape[1]),
                "kept fraction 0.9": lambda: dropout(gen, p=0.1),
                "kept fraction 0.7": lambda: dropout(gen, p=0.3),
                "no 1/(1-p) scaling": lambda: dropout(gen, scale=1.0)}[variant]()
    return draw


def variants(kind: str) -> list[str]:
    if kind == "noise":
        return ["honest", "expectation", "half the noise", "gaussian noise"]
    if kind == "bernoulli":
        return ["honest", "expectation", "threshold at 0.5", "probability +0.05"]
    wrong = ["no dropout", "expectation (16 draws)", "kept fraction 0.9", "kept fraction 0.7", "no 1/(1-p) scaling"]
    return ["honest"] + wrong + (["uniform 1/N"] if kind == "softmax" else [])


def run_shape(shape: str, variant: str, calls: int, run_calls: int, seed: int) -> dict:
    kind, dims = shape.split(":")
    rows, cols = (int(x) for x in dims.split("x"))
    gz, gref, gown = (torch.Generator().manual_seed(seed * 7919 + k) for k in range(3))
    refused = old_refused = 0
    closest, ratios, own_ratios, zs, run_zs = 0.0, [], [], [], []
    runs = run_refused = old_run_refused = 0
    run_bad = old_bad = False
    for c in range(calls):
        z = torch.randn(rows, cols, generator=gz) * 0.6
        draw = sampler(kind, z)
        draws = [[draw(gref)] for _ in range(S.DRAWS + 1)]
        cand = draw(gown, variant)
        tie_seed = seed * 1_000_003 + c
        cmp = S.compare_draws(draws, [cand], seed=tie_seed)
        refused += not cmp.ok
        run_bad |= not cmp.ok
        if cmp.draws_ks_bound:
            closest = max(closest, cmp.draws_ks / cmp.draws_ks_bound)
        ratios.append(cmp.draws_ks_r[0])
        zs.append(cmp.draws_z[0])
        # the draws' own distances (the same ranks: the same tie seed): the earlier rule (RATIO x
        # the draws' worst alone, no run rank test) and, for honest calls, their ratios leave one out
        st = S._column_stats([d[0] for d in draws], cand, torch.Generator().manual_seed(tie_seed))
        ks = S._ks(st.counts)
        own = ks[1:]
        old_call = float(ks[0]) > max(S.RATIO * float(own.max()), S.FLOOR_SQRT_N / math.sqrt(st.n)) \
            or abs(cmp.draws_z[0]) > EARLIER_Z_CALL
        old_refused += old_call
        old_bad |= old_call
        if variant == "honest":
            own_ratios += (own / ((own.sum() - own) / (len(own) - 1))).tolist()
        if (c + 1) % run_calls == 0:   # a run: the last run_calls calls
            bound = S.run_ks_bound(run_calls)
            rz = S.run_z(zs[-run_calls:])
            run_bad |= (bound is not None and sum(ratios[-run_calls:]) / run_calls > bound) or abs(rz) > S.Z_RUN
            old_bad |= abs(rz) > EARLIER_Z_RUN
            run_zs.append(rz)
            runs += 1
            run_refused += run_bad
            old_run_refused += old_bad
            run_bad = old_bad = False
    return {"shape": shape, "variant": variant, "calls": calls, "refused": refused, "old_rule_refused": old_refused,
            "closest": closest, "mean_ratio": sum(ratios) / len(ratios), "max_ratio": max(ratios), "runs": runs,
            "z_sd": float(torch.tensor(zs).std()) if len(zs) > 1 else None, "max_abs_z": max(map(abs, zs)),
            "max_abs_run_z": max(map(abs, run_zs), default=None), "min_abs_run_z": min(map(abs, run_zs), default=None),
            "runs_refused": run_refused, "old_rule_runs_refused": old_run_refused,
            "_ratios": ratios + own_ratios if variant == "honest" else [], "_zs": zs if variant == "honest" else []}


def tails(ratios: list[float], run_sizes=(6, 8, 16), resamples=2_000_000, seed=0) -> dict:
    r = torch.tensor(ratios, dtype=torch.float64)
    out = {"pooled": r.numel(), "p_over": {t: float((r > t).double().mean()) for t in (3, 4, 4.5, 5, 5.5, 6, S.MEAN_RATIO)}}
    g = torch.Generator().manual_seed(seed)
    out["run_means_over_bound"] = {}
    for m in run_sizes:
        hits = 0
        for start in range(0, resamples, 250_000):
            idx = torch.randint(0, r.numel(), (min(250_000, resamples - start), m), generator=g)
            hits += int((r[idx].mean(1) > S.run_ks_bound(m)).sum())
        out["run_means_over_bound"][m] = {"bound": S.run_ks_bound(m), "hits": hits, "resamples": resamples}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="honest calls per shape (default 400)")
    ap.add_argument("--wrong-calls", type=int, default=48, help="calls per wrong sampler and shape (default 48)")
    ap.add_argument("--run-calls", type=int, default=16, help="training-mode calls per judged run (default 16)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="kind:ROWSxCOLS,... (kinds: softmax, last, rowsum, "
                                                               "noise, bernoulli)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=2_000_000, help="resampled runs per run size")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.wrong_calls < 1 or args.run_calls < 1:
        ap.error("--calls, --wrong-calls and --run-calls must be >= 1")
    t0 = time.monotonic()
    rows, pooled, pooled_z = [], [], []
    # |run z|: the largest for honest samplers (how near a false refusal), the smallest for wrong ones
    print(f"{'':18s} {'':24s} {'':6s} {'calls refused':>17s} {'':8s} {'':7s} {'':7s} {'runs refused':>16s}")
    print(f"{'shape':18s} {'sampler':24s} {'calls':>6s} {'now':>8s} {'before':>8s} {'closest':>8s} "
          f"{'r mean':>7s} {'r max':>7s} {'now':>8s} {'before':>7s} {'|run z|':>8s}")
    for i, shape in enumerate(s.strip() for s in args.shapes.split(",") if s.strip()):
        kind = shape.split(":")[0]
        if kind not in ("softmax", "last", "rowsum", "noise", "bernoulli"):
            ap.error(f"unknown kind {kind!r} in {shape!r}")
        for variant in variants(kind):
            n = args.calls if variant == "honest" else args.wrong_calls
            row = run_shape(shape, variant, n, args.run_calls, args.seed * 1000 + i)
            pooled += row.pop("_ratios")
            pooled_z += row.pop("_zs")
            rows.append(row)
            run_z = row["max_abs_run_z"] if variant == "honest" else row["min_abs_run_z"]
            print(f"{shape:18s} {variant:24s} {n:6d} {row['refused']:8d} {row['old_rule_refused']:8d} "
                  f"{row['closest']:8.3f} {row['mean_ratio']:7.2f} {row['max_ratio']:7.2f} "
                  f"{row['runs_refused']:3d} of {row['runs']:<3d} {row['old_rule_runs_refused']:6d} "
                  + (f"{run_z:8.1f}" if run_z is not None else f"{'':8s}"), flush=True)
    z = torch.tensor(pooled_z, dtype=torch.float64).abs()
    result = {"rows": rows, "honest_tail": tails(pooled, resamples=args.resamples, seed=args.seed),
              "honest_z": {"pooled": z.numel(), "max": float(z.max()) if z.numel() else None,
                           "p_over": {t: float((z > t).double().mean()) if z.numel() else None for t in (3, 4, 5, 6)}},
              "seconds": time.monotonic() - t0, "torch": torch.__version__,
              "constants": {"DRAWS": S.DRAWS, "RATIO": S.RATIO, "MEAN_RATIO": S.MEAN_RATIO,
                            "FLOOR_SQRT_N": S.FLOOR_SQRT_N, "KS_RUN_SPREAD": S.KS_RUN_SPREAD,
                            "KS_RUN_MIN_CALLS": S.KS_RUN_MIN_CALLS, "Z_CALL": S.Z_CALL, "Z_RUN": S.Z_RUN}}
    tail = result["honest_tail"]
    print(f"\nhonest rank-test ratios pooled (candidates and each draw against the others): {tail['pooled']}")
    print("  P(ratio > t): " + "  ".join(f"{t:g}: {p:.1e}" for t, p in tail["p_over"].items()))
    print("  resampled run means over run_ks_bound: " + "  ".join(
        f"{m} calls (bound {v['bound']:.3g}): {v['hits']} of {v['resamples']}" for m, v in tail["run_means_over_bound"].items()))
    honest = [r for r in rows if r["variant"] == "honest" and r["z_sd"] is not None]
    if honest:
        hz = result["honest_z"]
        print("honest spread z per call: standard deviation " + ", ".join(f"{r['z_sd']:.2f}" for r in honest)
              + f"; pooled ({hz['pooled']}) P(|z| > t): " + "  ".join(f"{t:g}: {p:.1e}" for t, p in hz["p_over"].items())
              + f"; largest {hz['max']:.2f} (Z_CALL {S.Z_CALL:g})")
        print(f"  largest honest |run z| {max((r['max_abs_run_z'] or 0.0) for r in honest):.2f} (Z_RUN {S.Z_RUN:g})")
    print(f"{result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
