"""The export criterion: a task an honest kernel can pass on every input set the judge may draw.

Checked on the task exactly as it is exported and judged: its final source (the `BATCH` the
runtime window chose, so the full input shapes), its weights built as the judge builds them
(`judge.reference._construct` under an init seed), its inputs drawn by the judge's own
`judge.reference.fresh_inputs` (the task's `get_inputs`, every third set scaled by a factor in
[0.25, 1]), and its outputs compared by the judge's own `judge.compare.compare_outputs` with the
judge's tolerances (a checked call: the float64 evaluation is the basis of the normwise bound).

On each of `sets` input sets (a new weight draw every `sets_per_model` sets, as each judge
evaluation draws its own), the task is rejected when
  criterion_nonfinite   an output holds NaN or Inf;
  criterion_float64     the float64 evaluation of the task, rounded to the output's dtype, fails
                        the judge's comparison against the float32 one (a kernel that computes
                        more exactly than the reference fails);
  criterion_jitter      the outputs for the inputs perturbed elementwise by a relative `rel`
                        (x * (1 + rel * u), u uniform in [-1, 1]) fail the judge's comparison
                        against the unperturbed outputs (a kernel that rounds differently fails:
                        a floor, remainder or comparison of a computed value flips, or a pole
                        amplifies the difference).
The reference alone runs (three forwards per set, one of them in float64): no candidate, no
compiler. What it does not cover: failures rarer than one input set in `sets` (the synth
worker's shortcut checks try jumps on more sets at the composed size), and the judge's
precision probe, which concerns candidates, not tasks.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

CRITERION_FILTERS: dict[str, str] = {
    "criterion_nonfinite": "export criterion: NaN or Inf in an output on one of the judge-drawn input sets at the "
                           "exported size",
    "criterion_float64": "export criterion: the float64 evaluation fails the judge's comparison against float32 "
                         "on one of those input sets",
    "criterion_jitter": "export criterion: a 1e-6 relative perturbation of the inputs fails the judge's "
                        "comparison on one of those input sets (a jump or a pole an honest kernel's rounding hits)",
}

# seeds of the criterion's draws: apart from the shortcut checks' (5000 + k) and the worker's
# fixed input seeds (11, 22), so that the criterion sees input sets no other filter saw
DEFAULT_SEED = 70_000
INIT_SEED_OFFSET = 500_000     # the weights of model m are drawn under seed + INIT_SEED_OFFSET + m
# a screen failure counts as a jump when the output moved this many times further than linear
# scaling from the criterion's perturbation says (a smooth but steep task moves about 1x that)
JUMP_GROWTH = 10.0


@dataclass(frozen=True)
class Tolerance:
    """The judge's comparison settings (`JudgeConfig`'s atol, rtol, max_rel_l2, ref_noise_multiple,
    max_rel_l2_ceiling); `from_judge()` reads the judge's own defaults."""

    atol: float
    rtol: float
    max_rel_l2: dict
    noise_multiple: float
    rel_l2_ceiling: float

    @classmethod
    def from_judge(cls, config=None) -> "Tolerance":
        from cuda_agent.judge import JudgeConfig

        c = config or JudgeConfig(device="cpu")
        return cls(c.atol, c.rtol, dict(c.max_rel_l2), c.ref_noise_multiple, c.max_rel_l2_ceiling)

    @classmethod
    def from_filters(cls, cfg: dict) -> "Tolerance":
        """From a FilterConfig payload (whose fields mirror the judge's)."""
        return cls(cfg["atol"], cfg["rtol"], dict(cfg["max_rel_l2"]), cfg["ref_noise_multiple"],
                   cfg["max_rel_l2_ceiling"])


@dataclass
class CriterionResult:
    """What the criterion found: `filter` is None when every set passed."""

    filter: str | None = None
    message: str = ""
    sets_passed: int = 0
    float64: bool = True     # False: the task has no float64 evaluation, (c) was not checkable
    seconds: float = 0.0
    shapes: list = field(default_factory=list)   # the input shapes it ran at
    screened: str = ""       # why more sets were tried (the screen's perturbation failed), if they were

    @property
    def ok(self) -> bool:
        return self.filter is None


def _outputs(out) -> list:
    from cuda_agent.judge.reference import to_list

    return [o.detach() if isinstance(o, torch.Tensor) else o for o in to_list(out)]


def _call(model, xs: list) -> list:
    # no copies: check_task draws each variant of a set's inputs (float64, perturbed) anew, so a
    # forward that writes into its inputs changes nothing another reads
    with torch.no_grad():
        return _outputs(model(*xs))


def _perturbed(xs: list, rel: float, g: torch.Generator) -> list:
    """x * (1 + rel * u) elementwise, u uniform in [-1, 1]: as x + x * (rel * u) in the input's own
    precision (float32 and wider: rounding the sum moves it by half a unit, 6e-8, far below 1e-6)
    rather than through a float64 copy of inputs that can take gigabytes."""
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
            u = torch.rand(x.shape, generator=g, device=x.device, dtype=work).mul_(2 * rel).sub_(rel)
            xw = x.to(work)
            x = xw.addcmul(xw, u).to(x.dtype)
        out.append(x)
    return out


def _growth(out: list, near: list, far: list) -> float:
    """How many times further `far` moved from `out` than `near` did (largest elementwise change of
    any output; inf when `near` did not move at all)."""
    def moved(xs: list) -> float:
        return max((float((x.double() - o.double()).abs().max()) for x, o in zip(xs, out)
                    if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel()), default=0.0)

    d_near, d_far = moved(near), moved(far)
    return d_far / d_near if d_near > 0 else (float("inf") if d_far > 0 else 0.0)


def _compare(tol: Tolerance, expected: list, got: list, expected64: list | None):
    from cuda_agent.judge.compare import compare_outputs

    return compare_outputs(expected, got, atol=tol.atol, rtol=tol.rtol, max_rel_l2=tol.max_rel_l2,
                           expected64=expected64, noise_multiple=tol.noise_multiple,
                           rel_l2_ceiling=tol.rel_l2_ceiling)


def _float64_of(model) -> torch.nn.Module | None:
    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001 - a model that cannot be copied or cast: the judge has no float64 basis either
        return None


def _as64(xs: list) -> list:
    return [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]


def _run64(model64, xs64: list | None) -> list | None:
    if model64 is None or xs64 is None:
        return None
    try:
        return _call(model64, xs64)
    except Exception:  # noqa: BLE001 - an op without a float64 kernel: as the judge, no float64 basis
        return None


def check_task(source: str, *, device: str = "cpu", sets: int = 30, rel: float = 1e-6, seed: int = DEFAULT_SEED,
               sets_per_model: int = 5, screen_rel: float = 1e-4, screen_sets: int = 3, sets_suspect: int = 150,
               tolerance: Tolerance | None = None, name: str = "task") -> CriterionResult:
    """The criterion on `source` as exported (see the module docstring). Errors of the task itself
    (it does not import or run) raise: the filters before this one report those.

    A jump an honest kernel's rounding crosses can be rare per input set (a remainder by a random
    divisor: about one set in ten at a CPU-sized export), so `sets` sets may all miss it. The first
    `screen_sets` sets are therefore also perturbed by `screen_rel` (0: no screen), which crosses
    such a jump `screen_rel / rel` times as often; a task whose screen fails the comparison, its
    output moving more than JUMP_GROWTH times as far as linear scaling predicts (a jump or a pole,
    not a smooth but steep task), is tried on `sets_suspect` sets at `rel`."""
    from cuda_agent.judge import JudgeConfig
    from cuda_agent.judge.compare import all_finite
    from cuda_agent.judge.reference import Reference, _construct, fresh_inputs
    from cuda_agent.tasks import Task

    if sets < 1 or sets_per_model < 1 or not rel > 0 or screen_rel < 0:
        raise ValueError(f"criterion: sets ({sets}) and sets_per_model ({sets_per_model}) must be >= 1 and "
                         f"rel ({rel}) > 0")
    t0 = time.monotonic()
    tol = tolerance or Tolerance.from_judge()
    judge_cfg = JudgeConfig(device=device)
    ref = Reference(Task.from_source(source, name=name))
    res = CriterionResult()
    model = model64 = None
    g = torch.Generator(device=device)

    def draw(k: int) -> list:
        # set k drawn again for each variant rather than held beside the others: the same values
        # (the judge's seeded draw), a third of the memory at the exported size (where a
        # memory-bound task takes gigabytes), and a forward that writes into its inputs cannot
        # change what another variant reads
        return fresh_inputs(ref, seed + k, k, device)

    k = 0
    while k < sets:
        if k % sets_per_model == 0:
            model = model64 = None   # the previous weights are freed before the next draw
            _, model = _construct(ref, seed + INIT_SEED_OFFSET + k // sets_per_model, judge_cfg)
            model64 = _float64_of(model)
        xs = draw(k)
        if not res.shapes:
            res.shapes = [list(x.shape) for x in xs if isinstance(x, torch.Tensor)]
        screening = k < screen_sets and screen_rel > 0 and not res.screened
        out = _call(model, xs)
        xs = None
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor) and o.is_floating_point() and not all_finite(o):
                n = int((~torch.isfinite(o)).sum())
                return _done(res, t0, "criterion_nonfinite", f"input set {k}: output {i} has {n} NaN/Inf of "
                                                             f"{o.numel()} values")
        out64 = _run64(model64, _as64(draw(k))) if model64 is not None else None
        if out64 is None:
            res.float64 = False
        else:
            as32 = [o64.to(o.dtype) if isinstance(o64, torch.Tensor) else o64 for o64, o in zip(out64, out)]
            cmp = _compare(tol, out, as32, out64)
            as32 = None
            if not cmp.ok:
                return _done(res, t0, "criterion_float64", f"input set {k}: the float64 evaluation against float32: "
                                                            f"{cmp.message}")
        g.manual_seed(seed + k)   # the wide perturbation's draws follow the near one's, as before
        got = _call(model, _perturbed(draw(k), rel, g))
        cmp = _compare(tol, out, got, out64)
        if not cmp.ok:
            return _done(res, t0, "criterion_jitter", f"input set {k}: inputs perturbed by a relative {rel:g}: "
                                                       f"{cmp.message}" + (f" ({res.screened})" if res.screened else ""))
        if screening:
            wide = _call(model, _perturbed(draw(k), screen_rel, g))
            growth = _growth(out, got, wide)
            # a smooth task moves screen_rel / rel times as far under the wider perturbation; a jump
            # (or a pole) far more: only then are the extra sets worth their time
            if growth > JUMP_GROWTH * screen_rel / rel and not _compare(tol, out, wide, out64).ok:
                res.screened = (f"a {screen_rel:g} perturbation failed on set {k}, moving the output {growth:.3g}x "
                                f"as far as {rel:g} did, so {max(sets, sets_suspect)} sets were tried")
                sets = max(sets, sets_suspect)
        k += 1
        res.sets_passed = k
    return _done(res, t0, None, "")


def _done(res: CriterionResult, t0: float, failed: str | None, message: str) -> CriterionResult:
    res.filter, res.message, res.seconds = failed, message[:1500], time.monotonic() - t0
    return res


def check_payload(source: str, cfg: dict) -> CriterionResult:
    """`check_task` with a FilterConfig payload's settings, as the synth worker runs it after the
    runtime window. Out of memory raises (the worker retries at half the BATCH); any other error
    of the task is its `eager_error`: it fails where the judge draws and runs it (a get_inputs
    that cannot draw on the device, say), so the judge would fail it too."""
    from cuda_agent.host import is_out_of_memory

    try:
        return check_task(source, device=cfg["device"], sets=cfg["criterion_sets"], rel=cfg["criterion_rel"],
                          seed=cfg["criterion_seed"], sets_per_model=cfg["criterion_sets_per_model"],
                          screen_rel=cfg["criterion_screen_rel"], sets_suspect=cfg["criterion_sets_suspect"],
                          tolerance=Tolerance.from_filters(cfg))
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        return CriterionResult(filter="eager_error", message=f"export criterion: {type(exc).__name__}: {str(exc)[:400]}")
