"""Output comparison: pure functions of (expected, got, tolerances). Runs only in the judge."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Comparison:
    ok: bool
    message: str = ""
    max_abs_err: float = 0.0
    rel_l2_err: float = 0.0                 # worst ||out - ref|| / ||ref|| against the reference's own dtype
    rel_l2_err_f64: float | None = None     # worst ||out - ref64|| / ||ref64|| (float64 reference given)
    ref_noise_rel_l2: float | None = None   # worst ||ref - ref64|| / ||ref64||: the reference's own error
    rel_l2_bound: float | None = None       # the bound applied to the output closest to its bound
    later_bounds: tuple[float | None, ...] = ()  # per output: bound against the reference for unchecked calls
    noise_dominated: tuple[int, ...] = ()   # outputs whose reference is rounding noise (NOISE_DOMINATED)
    over_ceiling: tuple[int, ...] = ()      # outputs whose reference's own error exceeds the ceiling
    # with `margin=True` and a pass: the worst |out - ref| / (atol + rtol |ref|) (above 1 fails)
    elementwise_ratio: float | None = None
    # outputs over their noise-scaled bound but within `approx_ceiling`: they pass only if the
    # candidate's response to perturbed inputs then shows float32 resolution (response_error)
    approximate: tuple[int, ...] = ()
    # a stochastic reference's statistical check (stochastic.compare_draws): per output, the z-score
    # of the candidate's spread against the reference's draws and the Kolmogorov-Smirnov distance of
    # its ranks over the draws' mean distance (the run adds both up), and the worst distance with
    # that output's bound
    draws_z: tuple[float, ...] = ()
    draws_ks_r: tuple[float, ...] = ()
    draws_ks: float | None = None
    draws_ks_bound: float | None = None


# The reference's own relative L2 error against float64 at which its values are rounding noise: the
# exact output is (close to) zero, e.g. the mean of a normalised tensor. A relative error then
# measures nothing (two correct float32 evaluations differ by 100% or more), and only the
# elementwise tolerance says whether the candidate agrees. Such a reference is not "ill-conditioned
# but meaningful" (the ceiling's case): there is no meaningful value to be near.
NOISE_DOMINATED = 1.0

# The precision probe (JudgeConfig.approx_rel_l2). Inputs are perturbed by PROBE_DELTA relative (each
# element up or down): 8 units in the last place of float16 and TF32, one of bfloat16, 2^16 of
# float32. A float32 computation, approximate or not, follows the change of its output to within
# its derivative's error (~1e-3 for tanh GELU); one that rounds its operands or its outputs to 11
# significant bits or fewer loses ~4% of it or more. PROBE_FLOOR lies between the two; the bound is
# wider where the float32 reference itself follows the change less well (ref_noise_multiple times).
PROBE_DELTA = 2.0 ** -8
PROBE_FLOOR = 1e-2
# Calls after the checked ones carry the error an approximation showed there, times this. An
# approximation's error depends on where its inputs lie, and the judge rescales some calls' inputs
# (reference.fresh_inputs: x0.25-1), so a later call may see a scale no checked call saw: tanh GELU
# on randn is 1.98e-4 from float64 at scale 1 and 2.08e-4 at 0.7 (a published tanh-GELU kernel
# failed a timed call at 2.076e-4 under the former 1.05x slack, H100, KernelBench L1 26). At 1.25x a
# smooth approximation may get at most a quarter worse after the checks; rounding added then (the
# cheap way to a faster kernel) is what the perturbed pairs catch, whatever the slack.
APPROX_SLACK = 1.25


# How many times the reference's own error against float64 the cap above the ceiling allows. Where a
# few outputs carry the norm (products underflowing into denormals: KernelBench level 1, problem 50),
# the reference's error is a noisy estimate of what any float32 order gives: the published
# left-to-right product kernel measured 2.6x the reference's error on the H200, and over 40 input
# draws and five orders of the same products (reorder_noise, docs/results/2026-12-06-retired-diagnostics.md) the bound refuses 7.6%
# of the correct pairs with a cap of 1x, 2.5% with 4x, 0.5% with 6x (those over 16x too). Lower
# precision is 2^13x or more; zeros are 1.0.
CEILING_NOISE_MULTIPLE = 6.0


def rel_l2_bound(noise: float | None, *, floor: float, multiple: float, ceiling: float) -> float:
    """Bound on the candidate's relative L2 error against the float64 reference.

    `noise` is the reference's own relative L2 error against its float64 evaluation. Two correct
    implementations in the same precision differ from exact arithmetic by amounts of the same order
    (a different summation order changes the constant, not the unit roundoff), so the candidate may
    be `multiple` times as far from float64 as the reference is. Lower-precision operands (fp16,
    bf16, TF32) multiply that error by the ratio of the unit roundoffs (2^13 for TF32/fp16 against
    fp32, 2^16 for bf16), far beyond any sensible multiple. `floor` (the fixed per-dtype bound) keeps
    well-conditioned tasks exactly where a fixed bound put them; `ceiling` stops an ill-conditioned
    or noisy reference from widening the bound until garbage passes. No usable noise: the floor.

    The cap is `ceiling + CEILING_NOISE_MULTIPLE x noise`, not `ceiling`. A candidate within
    `ceiling` of the task's own reference is, by the triangle inequality, within `ceiling + noise` of
    float64, and a plain `ceiling` would fail a faithful copy of the reference itself wherever its own
    error exceeds the ceiling (products of 256 standard-normal float32 factors underflow into
    denormals a few per cent from float64). But the reference's error is one draw: on such a task
    another correct order of the same float32 arithmetic is often several times as far from float64
    (CEILING_NOISE_MULTIPLE says how far). An all-zero output (1.0 from float64) still fails unless
    the reference is mostly noise itself."""
    if noise is None or not math.isfinite(noise) or multiple <= 0:
        return floor
    return min(max(floor, multiple * noise), max(floor, ceiling) + min(multiple, CEILING_NOISE_MULTIPLE) * noise)


def response_error(before: torch.Tensor, after: torch.Tensor, ref_before: torch.Tensor,
                   ref_after: torch.Tensor) -> float:
    """How far one computation's response to a change of its inputs is from another's: the relative
    L2 distance of (after - before) from (ref_after - ref_before), in float64. Non-finite elements
    of the reference are left out (the comparison has already checked they match); 0 when neither
    changed, inf when only the first did."""
    ref_d = ref_after.double() - ref_before.double()
    d = after.to(ref_d.device).double() - before.to(ref_d.device).double()
    keep = torch.isfinite(ref_d)
    if not bool(keep.all()):
        ref_d, d = ref_d[keep], d[keep]
    ref_norm = float(torch.linalg.vector_norm(ref_d))
    miss = float(torch.linalg.vector_norm(d - ref_d))
    if ref_norm == 0.0:
        return 0.0 if miss == 0.0 else math.inf
    return miss / ref_norm


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of a floating tensor is finite. A sum is finite only if every element
    is (an Inf or NaN anywhere makes it Inf or NaN), so one reduction answers most calls; a sum that
    overflowed from finite elements is checked element by element."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _float64_twin(expected64: list | None, i: int, e: torch.Tensor) -> torch.Tensor | None:
    """The float64 evaluation of output `i`, if there is one that describes the same output."""
    if expected64 is None or i >= len(expected64) or e.dtype == torch.float64:
        return None
    r = expected64[i]
    if not isinstance(r, torch.Tensor) or r.dtype != torch.float64 or tuple(r.shape) != tuple(e.shape):
        return None
    return r


def compare_outputs(expected: list[torch.Tensor], got: list, *, atol: float, rtol: float,
                    max_rel_l2: dict[str, float], expected64: list | None = None, noise_multiple: float = 0.0,
                    rel_l2_ceiling: float = 1e-2, rel_l2_bounds: list | tuple | None = None,
                    margin: bool = False, approx_ceiling: float = 0.0) -> Comparison:
    """Structure, dtype, shape, NaN/Inf placement, elementwise tolerance and normwise error.

    Normwise error, per floating output, one of three ways:
    - `expected64` (the reference evaluated in float64 on the same inputs) holds that output: the
      candidate's error against it must stay within `rel_l2_bound` of the reference's own error
      against it (floor: `max_rel_l2` of the dtype). `later_bounds` then carries, per output, the
      bound plus that noise: by the triangle inequality a bound on the error against the reference
      itself, for calls evaluated without float64;
    - `rel_l2_bounds` holds a bound for it (found so on earlier calls): error against the reference;
    - otherwise the fixed `max_rel_l2` of its dtype, error against the reference.
    An output whose float32 reference is itself NOISE_DOMINATED has no normwise check (listed in
    `noise_dominated`); the elementwise tolerance alone decides it.

    `margin`: also measure how close the elementwise check came to failing (`elementwise_ratio`;
    one more pass over each output, so not on the judge's own calls).

    `approx_ceiling` (float64 reference given): an output over its noise-scaled bound but within this
    error against float64 passes here and is listed in `approximate`, for the caller's precision
    probe; its `later_bounds` entry then carries APPROX_SLACK times its error.
    """
    if len(expected) != len(got):
        return Comparison(False, f"expected {len(expected)} output(s), got {len(got)}")
    worst_abs, worst_rel = 0.0, 0.0
    worst64: float | None = None
    worst_noise: float | None = None
    applied: float | None = None   # bound of the output whose error came closest to its bound
    closest = -1.0
    later: list[float | None] = [None] * len(expected)
    noise_only: list[int] = []
    over: list[int] = []
    ratio_ew = 0.0 if margin else None
    approx: list[int] = []

    def result(ok: bool, message: str = "") -> Comparison:
        return Comparison(ok, message, worst_abs, worst_rel, worst64, worst_noise, applied, tuple(later),
                          tuple(noise_only), tuple(over), ratio_ew if ok else None, tuple(approx))

    for i, (e, g) in enumerate(zip(expected, got)):
        where = f"output {i}" if len(expected) > 1 else "output"
        if isinstance(e, (list, tuple, dict)):
            # nested outputs: the same keys or length, each item compared on its own terms
            seq = not isinstance(e, dict)
            if not (isinstance(g, (list, tuple)) if seq else isinstance(g, dict) and list(g) == list(e)) \
                    or len(g) != len(e):
                return result(False, f"{where}: expected a {type(e).__name__} of {len(e)}, got {type(g).__name__}")
            # (the fixed per-dtype bound inside containers: the float64 twin covers top-level tensors)
            inner = compare_outputs(list(e) if seq else list(e.values()), list(g) if seq else list(g.values()),
                                    atol=atol, rtol=rtol, max_rel_l2=max_rel_l2, margin=margin)
            worst_abs, worst_rel = max(worst_abs, inner.max_abs_err), max(worst_rel, inner.rel_l2_err)
            if margin and inner.elementwise_ratio is not None:
                ratio_ew = max(ratio_ew, inner.elementwise_ratio)
            if not inner.ok:
                return result(False, f"{where} -> {inner.message}")
            continue
        if not isinstance(e, torch.Tensor):
            if e != g:
                return result(False, f"{where}: expected {e!r}, got {g!r}")
            continue
        if not isinstance(g, torch.Tensor):
            return result(False, f"{where}: expected a tensor, got {type(g).__name__}")
        if g.dtype != e.dtype:
            return result(False, f"{where}: dtype {_dtype_name(g)}, expected {_dtype_name(e)}")
        if tuple(g.shape) != tuple(e.shape):
            return result(False, f"{where}: shape {tuple(g.shape)}, expected {tuple(e.shape)}")
        g = g.to(e.device)
        if not e.is_floating_point():
            if not torch.equal(e, g):
                n = int((e != g).sum())
                return result(False, f"{where}: {n} of {e.numel()} values differ")
            continue
        # fp32 arithmetic for fp32 and narrower outputs (exact enough for these bounds, and it keeps
        # a gigabyte output from being copied to float64 several times); float64 stays float64.
        work = torch.float64 if e.dtype == torch.float64 else torch.float32
        ew, gw = e.to(work), g.to(work)
        finite = None
        if all_finite(ew) and all_finite(gw):
            ef, gf = ew.reshape(-1), gw.reshape(-1)
        else:
            e_nan, g_nan = torch.isnan(ew), torch.isnan(gw)
            if not torch.equal(e_nan, g_nan):
                n = int((e_nan != g_nan).sum())
                return result(False, f"{where}: NaN in {n} position(s) where the reference has none (or vice versa)")
            e_inf, g_inf = torch.isinf(ew), torch.isinf(gw)
            if not torch.equal(e_inf, g_inf) or not torch.equal(ew[e_inf], gw[g_inf]):
                return result(False, f"{where}: Inf values differ from the reference")
            finite = ~(e_nan | e_inf)
            ef, gf = ew[finite], gw[finite]
        if ef.numel() == 0:
            continue
        diff = (ef - gf).abs_()
        max_abs = float(diff.max())
        tol = ef.abs().mul_(rtol).add_(atol)
        bad = diff > tol
        if not margin:
            del tol  # an output-sized buffer: freed before more are made
        ref_norm = float(torch.linalg.vector_norm(ef))
        rel = float(torch.linalg.vector_norm(diff)) / max(ref_norm, 1e-30)
        if ref_norm == 0.0:
            rel = 0.0 if float(torch.linalg.vector_norm(gf)) == 0.0 else float("inf")
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, rel)
        if bool(bad.any()):
            n = int(bad.sum())
            idx = int(torch.nonzero(bad)[0])
            return result(False, f"{where}: {n} of {ef.numel()} values outside atol={atol:g}, rtol={rtol:g} "
                                 f"(max abs error {max_abs:.3g}; first at flat index {idx}: "
                                 f"expected {float(ef[idx]):.6g}, got {float(gf[idx]):.6g})")
        if margin:
            ratio_ew = max(ratio_ew, float(diff.div_(tol).max()))  # diff is not needed after this
        dtype = _dtype_name(e)
        floor = max_rel_l2.get(dtype)
        if floor is None:
            continue
        r64 = _float64_twin(expected64, i, e)
        if r64 is not None:
            r64f = r64.to(e.device).reshape(-1) if finite is None else r64.to(e.device)[finite]
            if not all_finite(r64f):
                r64 = None  # float64 overflowed or failed where float32 did not: no basis to measure against
        if r64 is not None:
            norm64 = float(torch.linalg.vector_norm(r64f))
            d_ref = float(torch.linalg.vector_norm(ef.double() - r64f))
            d_out = float(torch.linalg.vector_norm(gf.double() - r64f))
            if norm64 == 0.0:
                noise = 0.0 if d_ref == 0.0 else float("inf")
                err64 = 0.0 if d_out == 0.0 else float("inf")
            else:
                noise, err64 = d_ref / norm64, d_out / norm64
            worst64 = max(worst64 or 0.0, err64)
            worst_noise = max(worst_noise or 0.0, noise) if math.isfinite(noise) else worst_noise
            if noise >= NOISE_DOMINATED and noise_multiple > 0:
                noise_only.append(i)
                later[i] = math.inf  # nor on the later calls: the elementwise tolerance (checked above) decides
                continue
            if noise_multiple > 0 and noise > max(floor, rel_l2_ceiling):
                over.append(i)
            bound = rel_l2_bound(noise, floor=floor, multiple=noise_multiple, ceiling=rel_l2_ceiling)
            later[i] = bound + noise if math.isfinite(noise) else floor
            ratio = err64 / bound if bound > 0 else (0.0 if err64 == 0.0 else float("inf"))
            if ratio > closest:
                closest, applied = ratio, bound
            if bound < err64 <= approx_ceiling:
                approx.append(i)
                later[i] = max(bound, APPROX_SLACK * err64) + noise
                continue
            if err64 > bound:
                return result(False, f"{where}: relative L2 error {err64:.3g} against the float64 reference exceeds "
                                     f"the bound {bound:.3g} = min(max({floor:g}, {noise_multiple:g} x {noise:.3g}), "
                                     f"{max(floor, rel_l2_ceiling):g} + "
                                     f"{min(noise_multiple, CEILING_NOISE_MULTIPLE):g} x {noise:.3g}), "
                                     f"{noise:.3g} being the {dtype} reference's own error against float64 (lower precision than the task, or "
                                     f"values too small for the elementwise tolerance to mean anything)")
            continue
        carried = rel_l2_bounds[i] if rel_l2_bounds is not None and i < len(rel_l2_bounds) else None
        limit = carried if carried is not None else floor
        ratio = rel / limit if limit > 0 else (0.0 if rel == 0.0 else float("inf"))
        if ratio > closest:
            closest, applied = ratio, limit
        if rel > limit:
            basis = ("the bound found on the checked calls (float64 reference: bound plus the reference's "
                     "own error)") if carried is not None else f"the fixed bound for {dtype}"
            return result(False, f"{where}: relative L2 error {rel:.3g} exceeds {limit:.3g}, {basis} (lower "
                                 "precision than the task, or values too small for the elementwise tolerance "
                                 "to mean anything)")
    return result(True)


def degenerate_warnings(expected_sets: list[list[torch.Tensor]], *, atol: float, rtol: float) -> list[str]:
    """Would a zero or constant output pass the elementwise tolerance? Is the output input-independent?"""
    warnings = []
    first = expected_sets[0]
    for i, e in enumerate(first):
        if not isinstance(e, torch.Tensor) or not e.is_floating_point() or e.numel() == 0:
            continue
        e64 = e.double()
        finite = e64[torch.isfinite(e64)]
        if finite.numel() == 0:
            warnings.append(f"output {i}: reference has no finite values")
            continue
        if bool((finite.abs() <= atol).all()):
            warnings.append(f"output {i}: an all-zero output passes atol={atol:g} elementwise "
                            f"(max |ref| {float(finite.abs().max()):.3g}); the normwise check decides")
        c = finite.mean()
        if bool(((finite - c).abs() <= atol + rtol * finite.abs()).all()):
            warnings.append(f"output {i}: a constant output passes the elementwise tolerance")
    if len(expected_sets) > 1:
        same = all(
            isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
            for a, b in zip(expected_sets[0], expected_sets[1]))
        if same:
            warnings.append("reference output is identical for different inputs (input-independent task)")
    return warnings


def changed_input(sent: list, back: list) -> str | None:
    """The first input that forward modified, bit for bit and at any depth of nesting (a tensor
    inside a list or dict of inputs is the candidate's to read, not to write), or None."""

    def walk(a, b, where: str) -> str | None:
        if isinstance(a, torch.Tensor):
            if isinstance(b, torch.Tensor):
                a = a.detach().to(b.device)
            if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype \
                    or not torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)):
                return where
        elif isinstance(a, (list, tuple)):
            if not isinstance(b, (list, tuple)) or len(a) != len(b):
                return where
            for k, (x, y) in enumerate(zip(a, b)):
                found = walk(x, y, f"{where}[{k}]")
                if found:
                    return found
        elif isinstance(a, dict):
            if not isinstance(b, dict) or a.keys() != b.keys():
                return where
            for k in a:
                found = walk(a[k], b[k], f"{where}[{k!r}]")
                if found:
                    return found
        return None

    if len(back) != len(sent):
        return f"{len(back)} inputs came back, not {len(sent)}"
    for k, (a, b) in enumerate(zip(sent, back)):
        found = walk(a, b, f"input {k}")
        if found:
            return found
    return None
