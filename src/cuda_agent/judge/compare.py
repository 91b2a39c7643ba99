"""Output comparison: pure functions of (expected, got, tolerances). Runs only in the judge."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Comparison:
    ok: bool
    message: str = ""
    max_abs_err: float = 0.0
    rel_l2_err: float = 0.0


def compare_outputs(expected: list[torch.Tensor], got: list, *, atol: float, rtol: float,
                    max_rel_l2: dict[str, float]) -> Comparison:
    """Structure, dtype, shape, NaN/Inf placement, elementwise tolerance and normwise error."""
    if len(expected) != len(got):
        return Comparison(False, f"expected {len(expected)} output(s), got {len(got)}")
    worst_abs, worst_rel = 0.0, 0.0
    for i, (e, g) in enumerate(zip(expected, got)):
        where = f"output {i}" if len(expected) > 1 else "output"
        if isinstance(e, (list, tuple, dict)):
            # nested outputs: the same keys or length, each item compared on its own terms
            seq = not isinstance(e, dict)
            if not (isinstance(g, (list, tuple)) if seq else isinstance(g, dict) and list(g) == list(e)) \
                    or len(g) != len(e):
                return Comparison(False, f"{where}: expected a {type(e).__name__} of {len(e)}, got {type(g).__name__}")
            inner = compare_outputs(list(e) if seq else list(e.values()), list(g) if seq else list(g.values()),
                                    atol=atol, rtol=rtol, max_rel_l2=max_rel_l2)
            worst_abs, worst_rel = max(worst_abs, inner.max_abs_err), max(worst_rel, inner.rel_l2_err)
            if not inner.ok:
                return Comparison(False, f"{where} -> {inner.message}", worst_abs, worst_rel)
            continue
        if not isinstance(e, torch.Tensor):
            if e != g:
                return Comparison(False, f"{where}: expected {e!r}, got {g!r}")
            continue
        if not isinstance(g, torch.Tensor):
            return Comparison(False, f"{where}: expected a tensor, got {type(g).__name__}")
        if g.dtype != e.dtype:
            return Comparison(False, f"{where}: dtype {str(g.dtype).removeprefix('torch.')}, "
                                     f"expected {str(e.dtype).removeprefix('torch.')}")
        if tuple(g.shape) != tuple(e.shape):
            return Comparison(False, f"{where}: shape {tuple(g.shape)}, expected {tuple(e.shape)}")
        g = g.to(e.device)
        if not e.is_floating_point():
            if not torch.equal(e, g):
                n = int((e != g).sum())
                return Comparison(False, f"{where}: {n} of {e.numel()} values differ")
            continue
        # fp32 arithmetic for fp32 and narrower outputs (exact enough for these bounds, and it keeps
        # a gigabyte output from being copied to float64 several times); float64 stays float64.
        work = torch.float64 if e.dtype == torch.float64 else torch.float32
        ew, gw = e.to(work), g.to(work)
        if bool(torch.isfinite(ew).all()) and bool(torch.isfinite(gw).all()):
            ef, gf = ew.reshape(-1), gw.reshape(-1)
        else:
            e_nan, g_nan = torch.isnan(ew), torch.isnan(gw)
            if not torch.equal(e_nan, g_nan):
                n = int((e_nan != g_nan).sum())
                return Comparison(False, f"{where}: NaN in {n} position(s) where the reference has none (or vice versa)")
            e_inf, g_inf = torch.isinf(ew), torch.isinf(gw)
            if not torch.equal(e_inf, g_inf) or not torch.equal(ew[e_inf], gw[g_inf]):
                return Comparison(False, f"{where}: Inf values differ from the reference")
            finite = ~(e_nan | e_inf)
            ef, gf = ew[finite], gw[finite]
        if ef.numel() == 0:
            continue
        diff = (ef - gf).abs_()
        max_abs = float(diff.max())
        bad = diff > ef.abs().mul_(rtol).add_(atol)
        ref_norm = float(torch.linalg.vector_norm(ef))
        rel = float(torch.linalg.vector_norm(diff)) / max(ref_norm, 1e-30)
        if ref_norm == 0.0:
            rel = 0.0 if float(torch.linalg.vector_norm(gf)) == 0.0 else float("inf")
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, rel)
        if bool(bad.any()):
            n = int(bad.sum())
            idx = int(torch.nonzero(bad)[0])
            return Comparison(False, f"{where}: {n} of {ef.numel()} values outside atol={atol:g}, rtol={rtol:g} "
                                     f"(max abs error {max_abs:.3g}; first at flat index {idx}: "
                                     f"expected {float(ef[idx]):.6g}, got {float(gf[idx]):.6g})",
                              max_abs, rel)
        limit = max_rel_l2.get(str(e.dtype).removeprefix("torch."))
        if limit is not None and rel > limit:
            return Comparison(False, f"{where}: relative L2 error {rel:.3g} exceeds {limit:g} for "
                                     f"{str(e.dtype).removeprefix('torch.')} (lower precision than the task, "
                                     "or values too small for the elementwise tolerance to mean anything)",
                              max_abs, rel)
    return Comparison(True, "", worst_abs, worst_rel)


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
