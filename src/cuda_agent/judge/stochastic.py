"""Stochastic references: tasks whose outputs depend on random numbers (dropout in training mode,
`torch.rand*` or `bernoulli` in forward). Runs only in the judge.

A bound wide enough for two honest draws of such a reference is wider than the signal: a kernel
that leaves the random part out, or returns its expectation, passes it. So a stochastic task is
judged in two parts (calls.py):

- **exactly, with the random part switched off**, where `eval()` switches it off (nn.Dropout,
  F.dropout(training=self.training)): on every other checked call the reference and the candidate
  both run in eval mode and the usual comparison applies (float64 bound, precision probe);
- **statistically, in training mode**, on the other checked calls and on every warm-up and timed
  call: the judge draws the reference DRAWS + 1 times on the call's inputs, and the candidate's
  output must look like one more draw, by two tests whose bounds come from the reference's own
  draws (each against the others, leave one out). Ranks: per element, the candidate's randomized
  rank among the draws (the probability integral transform) is uniform on (0, 1) if it samples the
  same distribution; the Kolmogorov-Smirnov distance of those ranks from uniform may be RATIO times
  the draws' worst or MEAN_RATIO times their mean (never under FLOOR_SQRT_N / sqrt(n)) on one
  call, and over the run its ratio to the draws' mean, averaged over the calls, at most
  1 + KS_RUN_SPREAD / sqrt(calls). Spread: the candidate's mean L1 distance to the draws, as a
  z-score against the draws' own (Z_CALL per call; Z_RUN for the calls' sum over the run).
  Outputs with the random part left out (the eval-mode value in training mode), replaced by its
  expectation (a uniform softmax, a Monte Carlo mean), with the wrong kept fraction or the wrong
  scaling sit at the wrong ranks or too close to (far from) the draws.

Randomness that eval() does not switch off (torch.rand in forward, F.dropout with its default
training=True) gets the statistical check on every call and no exact one; the verdict says so.
A reference that is both stochastic and stateful (its forward changes its own state) is refused:
its extra draws would move its state away from the candidate's.

Not covered: the joint distribution beyond per-element marginals and the total spread (a
candidate that draws each element from the right marginal independently, ignoring correlations
within a row, is not told apart); a kept fraction a little off where few rows carry the output
(0.9 for 0.8 in a softmax over 4 rows of 4,096: every call and run passes, where over 64 rows or
more every run fails); errors of the deterministic part made in training mode only
that are small next to the random part (measured on the CPU, 64 rows of a dropout-softmax, 25
calls: logits 3% too large fail, 1% pass; eval mode still checks the deterministic part exactly);
and randomness too small to exceed the detection threshold (DETECT_REL_L2; e.g. dropout with
p < 1e-4 on a few elements), which is judged as deterministic. A candidate whose own dropout
ignores eval() (F.dropout without training=self.training) fails the eval-mode calls.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from .compare import Comparison

# Reference draws per statistical check (plus one: the candidate is ranked among DRAWS + 1 of them,
# each reference draw among the other DRAWS). 16 is enough for per-element ranks to separate a
# correct sampler from a wrong one by a wide margin on outputs of a few thousand elements; each
# costs one reference forward in the judge, outside the candidate's clock.
DRAWS = 16
# The candidate's distance from uniform may be this many times the largest leave-one-out distance
# of the reference's own draws. For independent elements sqrt(n) KS follows Kolmogorov's law, and
# twice the largest of 17 draws is far in its tail; wrong samplers sit at 0.2-0.5.
RATIO = 2.0
# ... or this many times their mean distance, whichever is larger. Where the elements are
# correlated (dropout before a softmax: a row's kept values rise and fall together with its
# denominator) a draw's distance has a heavier tail than Kolmogorov's, and the 17 leave-one-out
# distances, all taken among the same draws, move together: their worst can sit low while the
# candidate's honest distance sits high. RATIO x the worst alone refused 6 of 16,000 honest calls
# of four softmax shapes (6 of 996 runs of 16 calls; benchmarks/stochastic_calibration.py, dated
# in docs/results). The distance over the draws' mean exceeded 3 at 2.8e-3, 4 at 1.3e-4, 4.5 at
# 1.7e-5 and 5 never in 180,000 (softmax 16x64 and 64x128), falling ~8x per half unit, so 7x is
# about 1e-9 a call. Wrong samplers average 0.6-70x: those under 7x fail the run test below, or
# the spread test where they sit near 1 (an expectation is at the right ranks, too close).
MEAN_RATIO = 7.0
# ... and never below this over sqrt(elements): Kolmogorov's tail P(sqrt(n) KS > 2.5) ~ 1e-5, for
# outputs so small that the draws' own distances are coarse.
FLOOR_SQRT_N = 2.5
# The judge's memory for one call's draws: an output too large for DRAWS + 1 of them within this
# gets fewer (never under MIN_DRAWS); the bounds come from the draws themselves, so they stay
# valid, only less sharp.
DRAWS_BUDGET_BYTES = 4 << 30
MIN_DRAWS = 5
# The spread test: the candidate's mean absolute distance to the draws (summed over elements),
# against each draw's to the others, as a z-score (their mean and standard deviation). A correct
# sampler is one more draw (z near 0, t-like); the random part left out or
# replaced by its expectation sits closer to the draws than they sit to each other (z < 0), a wrong
# kept fraction or scaling closer or further. Refused on one call beyond Z_CALL, and over a run
# where the calls' z summed over sqrt(calls) exceeds Z_RUN (calls.py): a deficit too small to show
# on one call (the no-dropout output on a small task: z ~ -4) adds up over the warm-up and timed
# calls, which are all drawn in training mode. An honest call's z is wider than t_16 (the draws'
# own spreads, each taken among the same draws, vary less than one more draw's, and their
# standard deviation is itself a noisy estimate): standard deviation 1.15-1.19 over eight shapes,
# |z| over 4 at 2.7e-3, over 5 at 5.8e-4 and over 6 at 8.3e-5 in 12,000 calls
# (benchmarks/stochastic_calibration.py), a tail like a power law of order 7-11, so 8 refused
# about one honest call in 200,000 and 12 about one in 10 million. Over a run the sum is near
# normal: 6 is 5 standard deviations at the widest (~5e-7 a run). Wrong samplers whose ranks pass
# (an expectation, the output without dropout over four rows) sit at run |z| 8.3-12.8.
Z_CALL = 12.0
Z_RUN = 6.0
# The rank test over the run: per output, the candidate's KS distance over the draws' mean distance
# (about 1.0 +- 0.5 for a correct sampler, with the heavy right tail above), averaged over the
# training-mode calls, at most 1 + KS_RUN_SPREAD / sqrt(calls) once there are KS_RUN_MIN_CALLS of
# them. Runs of 6, 8 and 16 calls resampled from the honest ratios (216,000 over eight shapes;
# 180,000 of the two softmax shapes) never exceeded it in 2,000,000 each. A sampler wrong by too
# little for MEAN_RATIO on one call (2-7x on every call) fails here.
KS_RUN_SPREAD = 3.7
KS_RUN_MIN_CALLS = 6
# Two values within this relative distance (plus TIE_ATOL times the draws' RMS) are the same
# value: dropout's atoms (0 and x / (1 - p)) computed in another order must tie, not fall on
# either side of the reference's. Far below the spread dropout makes.
TIE_RTOL = 1e-3
TIE_ATOL = 1e-5
# Two draws under different seeds differing by more than this relative L2 (or outside the judge's
# elementwise tolerance) make a reference stochastic. Far above the run-to-run noise of
# nondeterministic reductions (atomics: ~1e-6 in float32), far below dropout's (p = 0.2: ~0.7).
DETECT_REL_L2 = 1e-2


def draw_count(out_bytes: int) -> int:
    """How many reference draws a statistical check of an output of `out_bytes` takes."""
    return max(MIN_DRAWS, min(DRAWS + 1, DRAWS_BUDGET_BYTES // max(out_bytes, 1)))


@dataclass(frozen=True)
class Randomness:
    """How a task's reference uses random numbers, learnt once per task (`detect`).

    kind: "eval" (eval() switches it off: exact check in eval mode plus the statistical one),
    "always" (eval() does not: statistical only), or None (deterministic)."""

    kind: str | None
    detail: str = ""


# Elements compared at a time: the comparison is in float64, and a whole large output's float64
# copies (two outputs, their masks and differences) would hold many times its own size on the GPU
# it shares with other judges
DIFF_CHUNK = 1 << 22


def _differs(a: list, b: list, atol: float, rtol: float, chunk: int = DIFF_CHUNK) -> str | None:
    """Where two evaluations of the same inputs differ beyond rounding, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                return f"output {i}"
            continue
        if x.shape != y.shape:
            return f"output {i}: shapes {tuple(x.shape)} and {tuple(y.shape)}"
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return f"output {i}: {int((x != y).sum())} of {x.numel()} values"
            continue
        if torch.equal(x, y):
            continue
        xf, yf = x.reshape(-1), y.reshape(-1)
        diff_sq = norm_sq = 0.0
        outside = finite = 0
        for start in range(0, xf.numel(), chunk):
            x64, y64 = xf[start:start + chunk].double(), yf[start:start + chunk].double()
            if not torch.equal(torch.isnan(x64), torch.isnan(y64)):
                return f"output {i}: NaN positions"
            keep = torch.isfinite(x64) & torch.isfinite(y64)
            x64, y64 = x64[keep], y64[keep]
            diff = (x64 - y64).abs()
            diff_sq += float(diff.square().sum())
            norm_sq += float(x64.square().sum())
            outside += int((diff > atol + rtol * x64.abs()).sum())
            finite += x64.numel()
        if finite == 0:
            continue
        rel = diff_sq ** 0.5 / max(norm_sq ** 0.5, 1e-300)
        if rel > DETECT_REL_L2 or outside:
            return f"output {i}: relative L2 {rel:.3g}, {outside} of {finite} values outside the tolerance"
    return None


def detect(construct, inputs: list, *, atol: float, rtol: float) -> Randomness:
    """Whether the reference's outputs depend on random numbers: two fresh constructions (the same
    seed, so the same weights and state) run on the same inputs under different seeds, in the
    reference's own mode; if they differ, the same again in eval mode tells whether eval() switches
    the random part off. `construct()` returns a fresh reference model on the judge's device."""
    def run(training: bool, draw_seed: int) -> list:
        model = construct()
        if not training:
            model.eval()
        torch.manual_seed(draw_seed)
        with torch.no_grad():
            out = model(*inputs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in out]

    seeds = [secrets.randbits(62) for _ in range(2)]
    seeds[1] += seeds[0] == seeds[1]
    where = _differs(run(True, seeds[0]), run(True, seeds[1]), atol, rtol)
    if where is None:
        return Randomness(None)
    if _differs(run(False, seeds[0]), run(False, seeds[1]), atol, rtol) is None:
        return Randomness("eval", f"two seeds differ ({where}); eval() switches the random part off")
    return Randomness("always", f"two seeds differ ({where}), in eval mode too")


def ranks(pool: torch.Tensor, cand: torch.Tensor, gen: torch.Generator, scale: float | None = None) -> torch.Tensor:
    """Randomized ranks scaled to (0, 1), per element: row 0 the candidate's `cand` among all the
    draws in `pool` (draws x elements), row 1 + j draw j's among the other draws. Each row is
    uniform if it is one more draw of the same distribution. Values within the tie tolerance of
    each other count as equal; ties are broken at random (`gen`, on the CPU). `scale`: the output's
    typical magnitude, for the absolute part of the tolerance (default: the draws' RMS)."""
    k, n = pool.shape
    if scale is None:
        scale = float(pool.double().pow(2).mean().sqrt()) if pool.numel() else 0.0
    x = torch.cat([cand[None], pool])                                # samples x elements
    tol = x.abs() * TIE_RTOL + TIE_ATOL * scale
    lo, hi = x - tol, x + tol
    below = torch.zeros_like(x)
    tied = torch.full_like(x, -1.0)
    tied[0] = 0.0                                                    # a draw ties with itself
    for m in range(k):  # one draw against every sample at a time: (k + 1) x elements per step
        below += pool[m] < lo
        tied += (pool[m] >= lo) & (pool[m] <= hi)
    others = torch.full((k + 1,), float(k), dtype=pool.dtype, device=pool.device)
    others[0] = k + 1  # the candidate is ranked among k draws, each draw among k - 1 others
    v = torch.rand(x.shape, generator=gen, dtype=pool.dtype).to(pool.device)
    return (below + v * (tied + 1.0)) / others[:, None]


# Bins of the empirical distribution the KS distance is read from: its error is at most one bin's
# share of the values (about 1/KS_BINS for uniform ranks), far below the distances that matter.
KS_BINS = 4096


def _histogram(u: torch.Tensor) -> torch.Tensor:
    """Counts of each row of `u` (values in [0, 1]) in KS_BINS equal bins, on the CPU."""
    rows = u.shape[0]
    bins = (u * KS_BINS).long().clamp_(0, KS_BINS - 1)
    bins += torch.arange(rows, device=u.device)[:, None] * KS_BINS
    return torch.bincount(bins.reshape(-1), minlength=rows * KS_BINS).reshape(rows, KS_BINS).cpu()


def _ks(counts: torch.Tensor) -> torch.Tensor:
    """Kolmogorov-Smirnov distance from uniform of each row's histogram (`_histogram`), read at
    the bin edges and just below them (the bin's own values not yet counted)."""
    n = int(counts[0].sum())
    if n == 0:
        return torch.zeros(counts.shape[0], dtype=torch.float64)
    cdf = counts.cumsum(1).double() / n
    edges = torch.arange(1, KS_BINS + 1, dtype=torch.float64) / KS_BINS
    return torch.maximum((cdf - edges).abs(), (cdf - counts / n - (edges - 1.0 / KS_BINS)).abs()).amax(1)


def ks_uniform(u: torch.Tensor) -> torch.Tensor:
    """Kolmogorov-Smirnov distance from the uniform distribution of each row of `u` (values in
    [0, 1]), read at KS_BINS bin edges (a histogram, not a sort: linear in the elements)."""
    u = u.reshape(1, -1) if u.dim() < 2 else u.reshape(u.shape[0], -1)
    return _ks(_histogram(u))


@dataclass
class _Stats:
    """One output's statistics against the draws (`_column_stats`)."""

    n: int = 0                         # finite elements compared
    odd: int = 0                       # non-finite in the candidate where every draw is finite
    counts: torch.Tensor | None = None  # rank histograms: the candidate's, then each draw's
    pair: torch.Tensor | None = None   # L1 distances between the draws (draws x draws)
    cand: torch.Tensor | None = None   # L1 distances from the candidate to each draw


# Elements per step of `_column_stats`: its temporaries are (draws + 1) x this many values.
CHUNK = 1 << 20


def _column_stats(column: list[torch.Tensor], g: torch.Tensor, gen: torch.Generator) -> _Stats:
    """Ranks and L1 distances of one output, over chunks of its elements (so that the judge's
    memory holds the draws once, not copies of them), on the draws' device."""
    # float32 unless the output is float64: the ranks compare values, float32 resolves the tie
    # tolerance; the distances (sums over the output) are added in float64
    work = torch.float64 if g.dtype == torch.float64 else torch.float32
    flat = [c.detach().reshape(-1) for c in column]
    cand_all = g.detach().to(flat[0].device).reshape(-1)
    first = flat[0].double()
    scale = float(first[torch.isfinite(first)].pow(2).mean().sqrt()) if first.numel() else 0.0
    del first
    st = _Stats()
    k = len(flat)
    for s in range(0, cand_all.numel(), CHUNK):
        pool = torch.stack([f[s:s + CHUNK].to(work) for f in flat])
        cand = cand_all[s:s + CHUNK].to(work)
        finite = torch.isfinite(pool).all(0)
        st.odd += int((~torch.isfinite(cand) & finite).sum())
        keep = finite & torch.isfinite(cand)
        if not bool(keep.all()):
            pool, cand = pool[:, keep], cand[keep]
        if cand.numel() == 0:
            continue
        st.n += cand.numel()
        counts = _histogram(ranks(pool, cand, gen, scale))
        pool64, cand64 = pool.double(), cand.double()
        pair = torch.cdist(pool64[None], pool64[None], p=1.0)[0].cpu()
        to_cand = torch.cdist(cand64[None, None], pool64[None], p=1.0)[0, 0].cpu()
        st.counts = counts if st.counts is None else st.counts + counts
        st.pair = pair if st.pair is None else st.pair + pair
        st.cand = to_cand if st.cand is None else st.cand + to_cand
    assert st.counts is None or st.counts.shape[0] == k + 1
    return st


def _structure(draw: list, got: list) -> str | None:
    """What makes `got` a different structure from the reference's draws, or None."""
    if len(draw) != len(got):
        return f"expected {len(draw)} output(s), got {len(got)}"
    for i, (e, g) in enumerate(zip(draw, got)):
        where = f"output {i}" if len(draw) > 1 else "output"
        if not isinstance(e, torch.Tensor):
            if isinstance(g, torch.Tensor) or type(e) is not type(g):
                return f"{where}: expected a {type(e).__name__}, got {type(g).__name__}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"{where}: expected a tensor, got {type(g).__name__}"
        if g.dtype != e.dtype:
            return f"{where}: dtype {str(g.dtype).removeprefix('torch.')}, expected {str(e.dtype).removeprefix('torch.')}"
        if tuple(g.shape) != tuple(e.shape):
            return f"{where}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    return None


def compare_draws(draws: list[list], got: list, *, seed: int | None = None) -> Comparison:
    """The candidate's output `got` judged as one more draw of a stochastic reference, against
    `draws` (DRAWS + 1 evaluations of the reference on the same inputs under fresh random numbers).

    Per tensor output, two tests against the reference's own draws (each draw against the others):
    the candidate's per-element ranks among the draws must be as close to uniform (KS distance) as
    a draw's, within RATIO, MEAN_RATIO and FLOOR_SQRT_N; and its mean L1 distance to the draws must
    be within Z_CALL standard deviations of a draw's (`draws_z` carries that z and `draws_ks_r` the
    KS distance over the draws' mean, per output, for the run's tests). Non-finite values must sit
    where some draw has them; non-tensor outputs must equal every draw's. `draws_ks` of the result
    holds the worst KS distance against its bound (`draws_ks_bound`)."""
    if len(draws) < 3:
        raise ValueError(f"compare_draws needs at least 3 reference draws, got {len(draws)}")
    problem = _structure(draws[0], got)
    if problem:
        return Comparison(False, problem)
    gen = torch.Generator(device="cpu").manual_seed(seed if seed is not None else secrets.randbits(62))
    worst, worst_bound, closest = 0.0, None, -1.0
    zs = [0.0] * len(got)
    rs = [0.0] * len(got)

    def result(ok: bool, message: str = "") -> Comparison:
        return Comparison(ok, message, draws_z=tuple(zs), draws_ks_r=tuple(rs),
                          draws_ks=worst if worst_bound else None, draws_ks_bound=worst_bound)

    for i, g in enumerate(got):
        where = f"output {i}" if len(got) > 1 else "output"
        column = [d[i] for d in draws]
        if not isinstance(g, torch.Tensor):
            if any(c != g for c in column):
                return result(False, f"{where}: expected {column[0]!r}, got {g!r}")
            continue
        st = _column_stats(column, g, gen)
        if st.odd:
            return result(False, f"{where}: {st.odd} non-finite value(s) where every reference draw is finite")
        n, k = st.n, len(column)
        if n == 0:
            continue
        ks = _ks(st.counts)
        dist, own_ks, own_mean = float(ks[0]), float(ks[1:].max()), float(ks[1:].mean())
        bound = max(RATIO * own_ks, MEAN_RATIO * own_mean, FLOOR_SQRT_N / math.sqrt(n))
        rs[i] = dist / own_mean if own_mean > 0 else 0.0
        if dist / bound > closest:
            closest, worst, worst_bound = dist / bound, dist, bound
        # the mean L1 distance of each draw to the others, and of the candidate to all the draws
        own_spread = st.pair.sum(1) / (k - 1)
        spread = float(st.cand.mean())
        mean, std = float(own_spread.mean()), float(own_spread.std())
        if std > 0:
            zs[i] = (spread - mean) / std
        elif spread != mean:  # the draws agree on every element: not stochastic here, any change is wrong
            zs[i] = math.copysign(math.inf, spread - mean)
        if dist > bound:
            return result(False, f"{where}: not distributed like the stochastic reference: the ranks of its "
                                 f"{n} values among {k} reference draws are {dist:.3g} from uniform "
                                 f"(Kolmogorov-Smirnov), over the bound {bound:.3g} = max({RATIO:g} x "
                                 f"{own_ks:.3g}, the reference draws' own worst, {MEAN_RATIO:g} x {own_mean:.3g}, "
                                 f"their mean, {FLOOR_SQRT_N:g}/sqrt({n})): "
                                 f"the random part left out, replaced by its expectation, or drawn from "
                                 f"another distribution")
        if abs(zs[i]) > Z_CALL:
            return result(False, f"{where}: not distributed like the stochastic reference: its mean L1 distance to "
                                 f"{k} reference draws is {spread:.4g}, theirs to each other {mean:.4g} +- {std:.2g} "
                                 f"(z = {zs[i]:.3g}, bound {Z_CALL:g}): "
                                 + ("too close to the draws: the random part left out or replaced by its expectation"
                                    if zs[i] < 0 else "too far from the draws: a wrong distribution"))
    return result(True)


def run_z(zs: list[float]) -> float:
    """The run's z-score of one output's spread test: the calls' z-scores summed over sqrt(calls)."""
    return sum(zs) / math.sqrt(len(zs)) if zs else 0.0


def run_ks_bound(calls: int) -> float | None:
    """The bound of the run's rank test on the mean of `calls` calls' KS distance over the draws'
    mean, or None while there are too few calls for it (KS_RUN_MIN_CALLS)."""
    return 1.0 + KS_RUN_SPREAD / math.sqrt(calls) if calls >= KS_RUN_MIN_CALLS else None
