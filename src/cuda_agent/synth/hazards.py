"""What a seed operator does near the values a chain may feed it: jumps, poles, overflow.

A task an honest kernel can fail by rounding is one whose output jumps (or nearly so) where a
computed value crosses a point: `ceil` of a value within a rounding of an integer, `remainder` at a
multiple of its divisor, `reciprocal` near zero. The judge draws inputs from the task's own
distribution and scales every third set by a factor in [0.25, 1], so no input distribution keeps
float data away from such points; the composer instead feeds each op values it is safe on.

`seed_hazard` finds, by running the seed (not from a list of names; only ops that count values
into bins, `COUNTING`, are left out by name), which operand guard makes it safe: on a sweep of
values covering [-4, 4] (a dense grid, and, among the values the guard can produce, each integer,
half-integer and zero, the seed's own scalar arguments such as a threshold or a lambda, and points
1e-4 from zero; a second operand equals the first on a quarter of its elements, so that ratios
cross integers, and holds the special points against ordinary values of the first),
perturbed additively by `PROBE_REL * (1 + |x|)` each way, the seed must give finite outputs no
larger than `BOUND`, a change within the judge's elementwise tolerance (10x the criterion's
perturbation, so a jump or a steep pole between the sweep's points still shows), a float64
evaluation within that tolerance, and must not be the identity on the guarded values. Guards are
tried in order (`GUARDS`): none, `abs() + 1` (away from zero), `sigmoid() + 0.5` (in (0.5, 1.5)),
`tanh() * 0.9` (in (-0.9, 0.9)); a seed no guard makes safe is not composed.

What is not covered: the sweep is one draw of values in [-4, 4]; a chain can feed a seed values
beyond it (a Linear's outputs grow with its width), where an op that overflows only far out is
caught by the export criterion, not here. Shapes are the probe's, not the task's.

`DISCONTINUOUS` and `jumps_at_boundaries` name the ATen ops that jump (read from a task's trace
and source): the synth worker's shortcut checks give such tasks more jitter sets.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from dataclasses import dataclass

import torch

from .seeds import SeedOp, base_namespace

# Ops whose output jumps where a computed value crosses a boundary (an integer, zero, a threshold).
# A kernel's rounding flips an element at such a boundary now and then: rarely enough per input set
# that `jitter_sets` sets can all miss it, so such a task is jittered on `jitter_sets_suspect` sets.
# Read from the trace (canonical names) for the ops that only jump; the ones that also serve
# continuous functions inside torch's own decompositions (sign in lp_pool's sign(x) * |x|, where and
# the comparisons in leaky_relu, xlogy, softshrink) count only where the source names them, as does
# division's rounding_mode (lost in the trace: `div` either way); `mode` only from the trace (in a
# source it is mostly Upsample's keyword).
DISCONTINUOUS = frozenset({
    "floor", "ceil", "round", "trunc", "fix", "frac", "floor_divide", "remainder", "fmod", "heaviside", "signbit",
    "argmax", "argmin", "bucketize", "searchsorted", "histc", "bincount", "mode", "isclose",
    # 0 or pi by the sign of a real value; the indices of sorting and selection; counts
    "angle", "argsort", "sort", "topk", "kthvalue", "median", "nanmedian", "count_nonzero", "nonzero"})
_DISCONTINUOUS_SOURCE = re.compile(
    r"\b(" + "|".join(sorted(DISCONTINUOUS - {"mode"})) + r"|sign|sgn|where|masked_fill|rounding_mode|[Hh]ardshrink|"
    r"[Tt]hreshold|gt|lt|ge|le|eq|ne|greater|less|greater_equal|less_equal|logical_\w+)\b")


def jumps_at_boundaries(ops: list[str] | None, source: str) -> bool:
    """Whether the task may run an op that jumps at a boundary (see DISCONTINUOUS)."""
    return bool(_DISCONTINUOUS_SOURCE.search(source)) or (ops is not None and not DISCONTINUOUS.isdisjoint(ops))


# operand guards, in the order they are tried: a template applied to each tensor operand
GUARDS: dict[str, str] = {
    "none": "{}",
    "abs1": "{}.abs() + 1.0",
    "sigmoid": "torch.sigmoid({}) + 0.5",
    "tanh": "torch.tanh({}) * 0.9",
}
# ops that count values into bins: a count changes wherever a value crosses a bin edge, and the
# edges move with the data (histc's range is its min and max), so the sweep's fixed points miss them
COUNTING = frozenset({"histc", "histogram", "bincount", "bucketize", "searchsorted", "count_nonzero"})
PROBE_REL = 1e-5        # the sweep's perturbation: 10x the export criterion's 1e-6
BOUND = 1e4             # largest output magnitude on the sweep ("outputs bounded")
ATOL = RTOL = 1e-2      # the judge's elementwise tolerance (JudgeConfig.atol, rtol)
SWEEP_NUMEL = 8192      # at least this many values per operand
SWEEP_SHAPES: dict[int, tuple[int, ...]] = {2: (4, 64), 3: (4, 16, 32), 4: (2, 16, 12, 12), 5: (2, 8, 6, 6, 6)}


@dataclass(frozen=True)
class SeedHazard:
    """How a seed is composed: with `guard` on every tensor operand, or (guard None) not at all.
    `reason`: what the seed did without a guard ("" when nothing); `tried`: why each guard failed."""

    guard: str | None
    reason: str = ""
    tried: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.guard is not None


def _sweep(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    n = math.prod(shape)
    g = torch.Generator().manual_seed(1000 + salt)
    return torch.linspace(-4.0, 4.0, n)[torch.randperm(n, generator=g)].reshape(shape)


def _special_points(values: list) -> list[float]:
    pts = [k / 2 for k in range(-8, 9)] + [1e-4, -1e-4, 1e-3, -1e-3]
    for v in values:
        for x in (v if isinstance(v, tuple) else (v,)):
            if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= 4:
                pts += [float(x), -float(x)]
    return pts


def _operands(seed: SeedOp, shape: tuple[int, ...]) -> list[torch.Tensor]:
    first = _sweep(shape, 0)
    ops = [first]
    for k in range(1, seed.arity):
        other = _sweep(shape, k).reshape(-1)
        quarter = other.numel() // 4
        other[:quarter] = first.reshape(-1)[:quarter]   # x == y there: a ratio at an integer
        ops.append(other.reshape(shape))
    return ops


# the values each guard can produce: the sweep's special points inside it are placed after the guard
RANGES: dict[str, tuple[float, float]] = {"none": (-math.inf, math.inf), "abs1": (1.0, math.inf),
                                          "sigmoid": (0.5, 1.5), "tanh": (-0.9, 0.9)}


def _with_specials(guard: str, xs: list[torch.Tensor], special: list[float]) -> list[torch.Tensor]:
    """The guarded operands with the special points inside the guard's range written over some of
    their elements: the first operand's first m, every other operand's next m, so that each special
    point of a second operand (a zero copysign takes the sign of) meets an ordinary value of the
    first. The sweep is shuffled, so those are random positions."""
    lo, hi = RANGES[guard]
    pts = torch.tensor([p for p in special if lo < p < hi or (guard == "abs1" and p == 1.0)], dtype=torch.float32)
    out = []
    for k, x in enumerate(xs):
        flat = _guarded(guard, x).reshape(-1).clone()
        at = 0 if k == 0 else len(pts)
        m = max(0, min(len(pts), flat.numel() - at))
        flat[at:at + m] = pts[:m]
        out.append(flat.reshape(x.shape))
    return out


def _call(fn, xs: list[torch.Tensor], index: int | None) -> torch.Tensor:
    with torch.no_grad():
        out = fn(*xs)
    if index is not None:
        out = out[index]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"returns {type(out).__name__}")
    return out


def _guarded(guard: str, x: torch.Tensor) -> torch.Tensor:
    return {"none": lambda t: t, "abs1": lambda t: t.abs() + 1.0, "sigmoid": lambda t: torch.sigmoid(t) + 0.5,
            "tanh": lambda t: torch.tanh(t) * 0.9}[guard](x)


def _problem(seed: SeedOp, fn, xs: list[torch.Tensor], guard: str) -> str:
    """What is wrong with `fn` on the guarded sweep `xs` ("" when nothing)."""
    out = _call(fn, xs, seed.output_index)
    if not out.is_floating_point():
        return f"{out.dtype} output"
    if not bool(torch.isfinite(out).all()):
        return "non-finite outputs"
    peak = float(out.abs().max()) if out.numel() else 0.0
    if peak > BOUND:
        return f"outputs up to {peak:.3g} (bound {BOUND:g})"
    if guard != "none" and out.shape == xs[0].shape and torch.equal(out, xs[0]):
        return "the identity on the guarded values"
    if out.numel() > 1 and float(out.max() - out.min()) <= 1e-6 * (1.0 + peak):
        return "constant on the guarded values"
    tol = ATOL + RTOL * out.abs()
    for sign in (1.0, -1.0):
        # the first operand moves one way, the others the other: equal operands part
        moved = [x + (sign if k == 0 else -sign) * PROBE_REL * (1 + x.abs()) for k, x in enumerate(xs)]
        d = (_call(fn, moved, seed.output_index) - out).abs()
        if not bool((d <= tol).all()):
            return f"a {PROBE_REL:g} change of its inputs moves it by up to {float(d.max()):.3g} (a jump or a pole)"
    try:
        fn64 = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
        out64 = _call(fn64, [x.double() for x in xs], seed.output_index)
    except Exception:  # noqa: BLE001 - no float64 kernel: the export criterion decides without one too
        return ""
    if out64.shape == out.shape and not bool(((out64 - out.double()).abs() <= tol.double()).all()):
        return "float64 disagrees beyond the judge's tolerance"
    return ""


def seed_hazard(seed: SeedOp, rank: int, namespace: dict | None = None) -> SeedHazard:
    """The first guard under which `seed`, at input rank `rank`, passes the sweep (see above)."""
    if seed.name.rsplit(".", 1)[-1].lower() in COUNTING:
        return SeedHazard(guard=None, reason="counts values into bins: jumps wherever one crosses a bin edge")
    base = SWEEP_SHAPES[rank]
    batch = max(base[0], -(-SWEEP_NUMEL // math.prod(base[1:])))
    shape = (batch, *base[1:])
    ns = namespace if namespace is not None else base_namespace(seed.helper_source)
    values = seed.resolve(shape, None)
    raw = _operands(seed, shape)
    special = _special_points(values)
    tried: list[str] = []
    # a seed the catalog found undefined on real inputs (log, sqrt) starts from abs() + 1, as before
    order = [g for g in GUARDS if not (seed.domain == "positive" and g == "none")]
    for guard in order:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                fn = seed.build(values, ns)
                why = _problem(seed, fn, _with_specials(guard, raw, special), guard)
        except Exception as exc:  # noqa: BLE001 - the op refuses the guarded values: try the next guard
            why = f"{type(exc).__name__}"
        if not why:
            return SeedHazard(guard=guard, reason=tried[0] if tried else "", tried=tuple(tried))
        tried.append(f"{guard}: {why}")
    return SeedHazard(guard=None, reason=tried[0] if tried else "", tried=tuple(tried))
