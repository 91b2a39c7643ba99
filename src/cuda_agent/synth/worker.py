"""Execution checks of one candidate task, run inside an isolated worker process.

The parent (`filters.WorkerPool`) starts this module in a sandboxed process (own session,
scrubbed environment, rlimits; see `cuda_agent.judge.sandbox`) and sends one JSON request per
line on a pipe: `{"source": ..., "config": {...}}`. Each reply is one JSON line holding a
`CheckResult`. Any exception while checking becomes a rejection with its reason; a crash or a
hang of the whole process is seen by the parent (EOF or timeout), which kills the process group,
records the rejection and starts a fresh worker.

Checks, in order (the first failure is the verdict):
  load, eager            the module imports, constructs and runs; outputs are float tensors
  random_op              no op tagged `nondeterministic_seeded` runs and the RNG state is untouched
  nondeterministic       two runs on identical inputs give identical outputs
  train_eval_mismatch    train() and eval() give the same output
  output_too_large       outputs beyond the judge's max_output_mb
  nonfinite, constant_output, input_independent, degenerate (the judge's own warnings)
  unused_parameter, unused_input   gradient, then perturbation, for what got no gradient
  shortcuts              on `n_input_sets` fresh input sets, at the judge's own comparison (see
                         shortcut_checks): degenerate, droppable_input, hardcodable_parameter,
                         droppable_parameter, ill_conditioned, batch_mixing
  runtime_window         eager median in [min_ms, max_ms], BATCH rescaled toward it first
                         (a size that runs out of GPU memory is backed off toward the last good one)
  (the value checks are repeated on the rescaled task)
  criterion_*            the export criterion (criterion.py) on the rescaled task, as the judge
                         draws and compares it
  out_of_memory          any check above ran out of the worker's GPU memory share (the checks after
                         the window first retry at half the BATCH while its time stays in the window)
  compile_error, compile_mismatch   torch.compile output matches eager (judge tolerances)

Seeds: weights are built under INIT_SEED, inputs under INPUT_SEEDS; fixed so that a rerun of the
pipeline checks exactly the same tensors.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback
import types
import warnings
from typing import Any

from cuda_agent.host import is_out_of_memory, true_fp32

# the ops that jump at a boundary (kept in hazards.py beside the composer's probe; named here too,
# where the shortcut checks and earlier callers read them)
from .criterion import check_payload
from .hazards import DISCONTINUOUS, jumps_at_boundaries  # noqa: F401

INIT_SEED = 1234
INPUT_SEEDS = (11, 22)


class Reject(Exception):
    def __init__(self, filter_name: str, message: str):
        super().__init__(message)
        self.filter = filter_name
        self.message = message


def _load(source: str):
    module = types.ModuleType("synth_candidate")
    module.__file__ = "<candidate>"
    try:
        exec(compile(source, "<candidate>", "exec", dont_inherit=True), module.__dict__)
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, name):
                raise AttributeError(f"missing {name}")
    except Exception as exc:
        raise Reject("load_error", f"{type(exc).__name__}: {exc}") from None
    return module


def _flat(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


class Runner:
    """A loaded candidate on one device: builds models and inputs under fixed seeds."""

    def __init__(self, source: str, device: str):
        import torch

        self.torch = torch
        self.device = device
        self.module = _load(source)

    def model(self):
        torch = self.torch
        torch.manual_seed(INIT_SEED)
        try:
            m = self.module.Model(*self.module.get_init_inputs())
            return m.to(self.device)
        except Exception as exc:
            raise Reject("eager_error", f"constructing Model: {type(exc).__name__}: {exc}") from None

    def inputs(self, seed: int) -> list:
        torch = self.torch
        xs = None
        if self.device != "cpu":
            # Made on the device itself: at the sizes the runtime window asks for (inputs of a GB
            # and more), drawing them on the worker's two CPU threads and copying them over took
            # seconds per input set, more than the checks that use them. The same seed gives the
            # same inputs on every call (the device's own generator); a get_inputs that cannot
            # run there (a CPU generator, say) draws them on the CPU as the judge does.
            torch.manual_seed(seed)
            try:
                with torch.device(self.device):
                    xs = list(self.module.get_inputs())
            except Exception as exc:  # noqa: BLE001 - retried on the CPU below, where a real error is reported
                if is_out_of_memory(exc):
                    raise   # as large on the CPU: the callers' out-of-memory handling decides
        if xs is None:
            torch.manual_seed(seed)
            try:
                xs = list(self.module.get_inputs())
            except Exception as exc:
                raise Reject("eager_error", f"get_inputs: {type(exc).__name__}: {exc}") from None
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in xs]

    def run(self, model, xs, what: str = "forward") -> list:
        torch = self.torch
        try:
            with torch.no_grad():
                outs = _flat(model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs]))
            if self.device == "cuda":
                # GPU kernels fail asynchronously (a device-side assert on an index out of range,
                # say): wait here so the failure is this forward's, not a later check's.
                torch.cuda.synchronize()
        except Reject:
            raise
        except Exception as exc:
            raise Reject("eager_error", f"{what}: {type(exc).__name__}: {str(exc)[:400]}") from None
        if not outs or not all(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs):
            kinds = [type(o).__name__ if not isinstance(o, torch.Tensor) else str(o.dtype) for o in outs]
            raise Reject("eager_error", f"{what}: outputs must be floating tensors, got {kinds}")
        return outs


def _same(a: list, b: list, rel: float = 0.0) -> bool:
    """Equal (rel=0) or equal within `rel` of the largest magnitude, NaN where NaN."""
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        if rel == 0.0:
            if not torch.equal(torch.nan_to_num(x, 1e30), torch.nan_to_num(y, 1e30)):
                return False
            continue
        x64, y64 = x.double(), y.double()
        scale = float(x64.abs().max()) if x64.numel() else 0.0
        if float((x64 - y64).abs().max()) > rel * max(scale, 1e-30):
            return False
    return True


def random_ops(model, xs) -> list[str]:
    """Names of the ATen ops tagged `nondeterministic_seeded` that one call of `model` runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seeded = torch.Tag.nondeterministic_seeded

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.random: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if seeded in getattr(func, "tags", ()):
                self.random.add(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    rec = Recorder()
    with torch.no_grad(), rec:
        model(*xs)
    return sorted(rec.random)


def _rng_states(torch, device: str) -> list:
    states = [torch.get_rng_state()]
    if device == "cuda":
        states.append(torch.cuda.get_rng_state())
    return states


def _where_it_fits(fn, *tensor_lists):
    """`fn(*tensor_lists)` where the tensors are (on the GPU, float64 copies of GB-sized outputs
    take a fraction of a second there and seconds on the worker's CPU threads), again on CPU
    copies when the device runs out of memory for it."""
    try:
        return fn(*tensor_lists)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
    import torch

    torch.cuda.empty_cache()
    return fn(*([t.cpu() if isinstance(t, torch.Tensor) else t for t in ts] for ts in tensor_lists))


def value_checks(r: Runner, cfg: dict, full: bool) -> dict:
    """Randomness, determinism, train/eval, degeneracy and (when `full`) use of every input."""
    torch = r.torch
    model = r.model()
    xs = r.inputs(INPUT_SEEDS[0])
    before = _rng_states(torch, r.device)
    out = r.run(model, xs)
    after = _rng_states(torch, r.device)
    random = random_ops(model, xs)
    if random:
        raise Reject("random_op", f"forward runs random ops: {', '.join(random)}")
    if any(not torch.equal(a, b) for a, b in zip(before, after)):
        raise Reject("random_op", "forward consumes the random number generator")
    again = r.run(model, xs, "second run")
    if not _same(out, again, cfg["det_rel"]):
        raise Reject("nondeterministic", "two runs on identical inputs give different outputs")
    out_mb = sum(o.numel() * o.element_size() for o in out) / 2**20
    if out_mb > cfg["max_output_mb"]:
        raise Reject("output_too_large", f"outputs take {out_mb:.0f} MiB > {cfg['max_output_mb']} MiB (the judge's limit)")
    model.eval()
    ev = r.run(model, xs, "eval-mode run")
    model.train()
    if not _same(out, ev, cfg["det_rel"]):
        raise Reject("train_eval_mismatch", "output in eval() mode differs from train() mode")
    for i, o in enumerate(out):
        if not bool(torch.isfinite(o).all()):
            n = int((~torch.isfinite(o)).sum())
            raise Reject("nonfinite", f"output {i}: {n} of {o.numel()} values are NaN or Inf")
        if o.numel() > 1 and float(o.max() - o.min()) <= 1e-6 * (1.0 + float(o.abs().max())):
            raise Reject("constant_output", f"output {i} is constant ({float(o.reshape(-1)[0]):.4g})")
    other = r.run(model, r.inputs(INPUT_SEEDS[1]), "run on other inputs")
    if _same(out, other, max(1e-7, cfg["det_rel"])):
        raise Reject("input_independent", "outputs do not change when the inputs change")
    from cuda_agent.judge.compare import degenerate_warnings

    warns = _where_it_fits(lambda *sets: degenerate_warnings(list(sets), atol=cfg["atol"], rtol=cfg["rtol"]),
                           out, other)
    if warns:
        raise Reject("degenerate", "; ".join(warns))
    info: dict = {"output_shapes": [list(o.shape) for o in out],
                  "input_shapes": [list(x.shape) for x in xs if isinstance(x, torch.Tensor)],
                  "n_params": sum(p.numel() for p in model.parameters())}
    if full:
        _usage(r, model, xs, out, max(1e-7, cfg["det_rel"]))
    return info


def _usage(r: Runner, model, xs: list, out: list, tol: float) -> None:
    """Every parameter and every tensor input must influence the output (beyond run-to-run noise `tol`)."""
    torch = r.torch
    g = torch.Generator(device=r.device).manual_seed(7)
    weights = [torch.randn(o.shape, generator=g, device=o.device, dtype=o.dtype) for o in out]
    inputs = [x.clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
              for x in xs]
    model.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad():
            outs = _flat(model(*inputs))
            loss = sum((o * w).sum() for o, w in zip(outs, weights) if o.requires_grad)
            if isinstance(loss, torch.Tensor):
                loss.backward()
    except Exception:  # ops without a backward: the perturbation test alone decides
        model.zero_grad(set_to_none=True)
    params = dict(model.named_parameters())
    suspects = [n for n, p in params.items() if p.grad is None or not bool(p.grad.abs().gt(0).any())]
    in_suspects = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                   and (not x.requires_grad or x.grad is None or not bool(x.grad.abs().gt(0).any()))]
    model.zero_grad(set_to_none=True)
    for name in suspects:
        p = params[name]
        saved = p.detach().clone()
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * (saved.std() + 1) + 1)
        changed = not _same(out, r.run(model, xs, f"run with {name} perturbed"), tol)
        with torch.no_grad():
            p.copy_(saved)
        if not changed:
            raise Reject("unused_parameter", f"parameter {name} does not influence the output")
    for i in in_suspects:
        x = xs[i]
        if x.is_floating_point():
            y = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype) * (x.std() + 1) + 1
        else:
            lo, hi = int(x.min()), int(x.max())
            y = torch.randint(lo, hi + 2, x.shape, generator=g, device=x.device, dtype=x.dtype)
        ys = list(xs)
        ys[i] = y
        if _same(out, r.run(model, ys, f"run with input {i} perturbed"), tol):
            raise Reject("unused_input", f"input {i} does not influence the output")


# -- shortcuts at the judge's tolerance ---------------------------------------------------------------
#
# A kernel is rewarded when its output passes the judge's comparison (`judge.compare`: atol = rtol =
# 1e-2 elementwise and the relative-L2 bound against a float64 evaluation). A task is defective when
# something simpler than the task passes that comparison: a zero or constant output, the model with
# a parameter (or a triangle or half of one) dropped or replaced, an input ignored. These checks ask
# exactly that, on `n_input_sets` fresh input sets (one set is not enough: a near-degenerate output
# passes on some sets and not others), and they also reject tasks an honest kernel cannot pass
# reliably (a 1e-6 relative input jitter, or float64 arithmetic, leaves the tolerance) and tasks
# whose samples influence each other across the batch.

def _judge_compare(r: Runner, cfg: dict, expected: list, expected64: list | None, got: list, margin: bool = False):
    """The judge's checked-call comparison of `got` against `expected` (a `Comparison`; with
    `margin`, also how close it came to failing elementwise)."""
    from cuda_agent.judge.compare import compare_outputs

    # on the task's device: no copies of every output to the host for each of the many variants
    return compare_outputs(expected, got, atol=cfg["atol"], rtol=cfg["rtol"], max_rel_l2=cfg["max_rel_l2"],
                           expected64=expected64, noise_multiple=cfg["ref_noise_multiple"],
                           rel_l2_ceiling=cfg["max_rel_l2_ceiling"], margin=margin)


def _judge_passes(r: Runner, cfg: dict, expected: list, expected64: list | None, got: list) -> bool:
    """Would `got` pass the judge's checked-call comparison against `expected`?"""
    return _judge_compare(r, cfg, expected, expected64, got).ok


HOPELESS_SETS = 3        # a variant this far off on this many sets is not tried on the rest
HOPELESS_REL_L2 = 0.1


def _passing_set(r: Runner, cfg: dict, outs: list, outs64: list, variant) -> int | None:
    """The first input set on which `variant(k)` (the outputs of a shortcut on set k) passes the
    judge's comparison, or None. A variant with an output >= 10% (relative L2) off on each of the
    first 3 sets is not tried on the others: the judge's relative-L2 ceiling is 1%, and outputs on
    sets drawn from one distribution do not come 10x closer on another (this keeps the many
    variants that are far off at 3 forwards instead of `n_input_sets`)."""
    far = 0
    for k in range(len(outs)):
        got = variant(k)
        if _judge_passes(r, cfg, outs[k], outs64[k], got):
            return k
        if k < HOPELESS_SETS:
            far += max(_rel_l2(g, e) for g, e in zip(got, outs[k])) >= HOPELESS_REL_L2
            if far == HOPELESS_SETS:
                return None
    return None


def _rel_l2(a, b) -> float:
    d = float((a.double() - b.double()).norm())
    n = float(b.double().norm())
    return 0.0 if d == 0.0 else d / max(n, 1e-300)


def _float64_twin(r: Runner, model):
    """A float64 copy of the model, or None where its ops have no float64 kernel."""
    import copy

    try:
        return copy.deepcopy(model).double()
    except Exception:  # noqa: BLE001 - a module that cannot be copied: the float64 checks are skipped
        return None


def _run64(r: Runner, model64, xs: list) -> list | None:
    torch = r.torch
    if model64 is None:
        return None
    try:
        with torch.no_grad():
            outs = _flat(model64(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                   for x in xs]))
        if not all(isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in outs):
            return None
        return outs
    except Exception:  # noqa: BLE001 - no float64 kernel for some op: the float64 checks are skipped
        return None


def _parameter_variants(torch, p, g):
    """(label, replacement) pairs for one parameter: dropped, replaced, and structured parts dropped."""
    out = [("dropped (zeros)", torch.zeros_like(p))]
    scale = float(p.detach().abs().mean()) + 1e-3
    out.append(("replaced by random values", torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * scale))
    if p.dim() >= 2 and p.shape[-1] > 1 and p.shape[-2] > 1:
        out.append(("upper triangle dropped", torch.tril(p.detach())))
        out.append(("lower triangle dropped", torch.triu(p.detach())))
    if p.dim() >= 1 and p.shape[0] > 1:
        half = p.detach().clone()
        half[: p.shape[0] // 2] = 0
        out.append(("first half along dim 0 dropped", half))
    return out


def _closeness(cmp) -> float:
    """How close a passing comparison (made with `margin=True`) came to failing: the larger of its
    largest elementwise |got - expected| / (atol + rtol |expected|) and its relative L2 error over
    the bound (each fails above 1)."""
    worst = cmp.elementwise_ratio or 0.0
    err = cmp.rel_l2_err_f64 if cmp.rel_l2_err_f64 is not None else cmp.rel_l2_err
    if cmp.rel_l2_bound:
        worst = max(worst, err / cmp.rel_l2_bound)
    return worst


def shortcut_checks(r: Runner, cfg: dict, source: str, ops: list[str] | None = None) -> None:
    """Reject the task when a shortcut passes the judge's comparison on any of the input sets, when
    it is too ill-conditioned for the tolerance, or when its batch samples mix (see above). `ops`:
    the task's traced operators (traced here when not given)."""
    from cuda_agent.synth.compose import get_batch

    torch = r.torch
    model = r.model()
    n = cfg["n_input_sets"]

    def inputs(k: int) -> list:
        # drawn again where needed rather than held: ten sets of a large task's inputs would take
        # the worker's memory share (outputs, float32 and float64, are held)
        return r.inputs(cfg["shortcut_seed"] + k)

    outs = [r.run(model, inputs(k), f"input set {k}") for k in range(n)]
    model64 = _float64_twin(r, model)
    outs64 = [_run64(r, model64, inputs(k)) for k in range(n)]
    atol, rtol = cfg["atol"], cfg["rtol"]

    for k, (out, out64) in enumerate(zip(outs, outs64)):
        for i, o in enumerate(out):
            if not bool(torch.isfinite(o).all()):
                raise Reject("nonfinite", f"input set {k}, output {i}: NaN or Inf")
        zeros = [torch.zeros_like(t) for t in out]
        consts = [torch.full_like(t, float(t.double().mean())) for t in out]
        for label, fake in (("an all-zero output", zeros), ("a constant output", consts)):
            if _judge_passes(r, cfg, out, out64, fake):
                raise Reject("degenerate", f"{label} passes the judge's comparison on input set {k}")
        for i, o in enumerate(out):
            e = o.double()
            share = float(((e - e.mean()).abs() <= atol + rtol * e.abs()).double().mean())
            if share >= cfg["near_constant_share"]:
                raise Reject("degenerate", f"output {i}: a constant matches {share:.1%} of its elements on input set "
                                           f"{k} (>= {cfg['near_constant_share']:.0%}): nearly constant")
            if bool((e.abs() <= atol).all()):
                raise Reject("degenerate", f"output {i}: every value within atol={atol:g} of zero on input set {k} "
                                           f"(max |ref| {float(e.abs().max()):.3g}): only the normwise bound decides")
        if out64 is not None:
            from cuda_agent.judge.compare import compare_outputs

            # float32 against float64 arithmetic, elementwise: an honest float32 kernel is no closer
            cmp = compare_outputs(list(out64), [o.double() for o in out], atol=atol, rtol=rtol, max_rel_l2={})
            noise = max(_rel_l2(o, o64) for o, o64 in zip(out, out64))
            if not cmp.ok or noise > cfg["max_rel_l2_ceiling"] / cfg["noise_headroom"]:
                why = cmp.message if not cmp.ok else (f"the float32 output is {noise:.3g} (relative L2) from float64, "
                                                      f"too close to the judge's ceiling {cfg['max_rel_l2_ceiling']:g}")
                raise Reject("ill_conditioned", f"float64 evaluation on input set {k}: {why}")

    # a 1e-6 relative jitter of the inputs (a few float32 roundings) must stay within the tolerance
    g = torch.Generator(device=r.device).manual_seed(cfg["shortcut_seed"])
    # (on jitter_sets sets: a flip at a discontinuity, ceil or frac of a computed value, is rare
    # per set; sets past n_input_sets are compared without a float64 evaluation, at the fixed bound).
    # Rare failures come from two kinds of task, and each gets jitter_sets_suspect sets: ops that
    # jump at a boundary (seen in the trace), and heavy tails (an ill-conditioned matrix in one set of
    # a hundred), whose near misses show on the first sets long before a failure does.
    sets = max(n, cfg["jitter_sets"])
    suspect = jumps_at_boundaries(_trace(source) if ops is None else ops, source)
    why_more = ""    # set once the extra sets are tried: the rejection then says why
    worst, k = 0.0, 0
    while k < sets:
        xs = inputs(k)
        out, out64 = (outs[k], outs64[k]) if k < n else (r.run(model, xs, f"input set {k}"), None)
        jittered = [x * (1 + cfg["jitter_rel"] * torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype))
                    if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        got = r.run(model, jittered, "jittered run")
        cmp = _judge_compare(r, cfg, out, out64, got, margin=True)
        if not cmp.ok:
            raise Reject("ill_conditioned", f"a {cfg['jitter_rel']:g} relative jitter of the inputs leaves the judge's "
                                            f"tolerance on input set {k}" + (f" (of {sets} tried: {why_more})"
                                                                             if why_more else ""))
        worst = max(worst, _closeness(cmp))
        k += 1
        if k == sets and sets < cfg["jitter_sets_suspect"] and (suspect or worst >= cfg["jitter_near_miss"]):
            why_more = "an op that jumps at a boundary" if suspect else \
                f"a near miss, {worst:.2g} of the tolerance, on the first {sets}"
            sets = cfg["jitter_sets_suspect"]

    # every input must matter at the judge's tolerance: replaced by another set's values, it fails
    for i, x in enumerate(inputs(0)):
        if not isinstance(x, torch.Tensor):
            continue
        def replaced(k: int, i: int = i) -> list:
            ys = inputs(k)
            ys[i] = inputs((k + 1) % n)[i]
            return r.run(model, ys, f"run with input {i} replaced")

        k = _passing_set(r, cfg, outs, outs64, replaced)
        if k is not None:
            raise Reject("droppable_input", f"input {i} replaced by other values: the output still passes the "
                                            f"judge's comparison on input set {k}")

    # parameters: none constant at initialisation (a kernel could hard-code it), none droppable
    params = dict(model.named_parameters())
    for name, p in params.items():
        if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
            raise Reject("hardcodable_parameter", f"parameter {name} is {float(p.detach().reshape(-1)[0]):g} everywhere at "
                                                  "initialisation: a kernel could hard-code it")
    for name, p in params.items():
        saved = p.detach().clone()
        try:
            for label, value in _parameter_variants(torch, p, g):
                with torch.no_grad():
                    p.copy_(value)
                k = _passing_set(r, cfg, outs, outs64,
                                 lambda k, name=name, label=label: r.run(model, inputs(k), f"run with {name} {label}"))
                if k is not None:
                    raise Reject("droppable_parameter", f"parameter {name} {label}: the output still passes the "
                                                        f"judge's comparison on input set {k}")
        finally:
            with torch.no_grad():
                p.copy_(saved)

    # samples of the batch must not influence each other, unless the task says so (MIXES_BATCH = True)
    batch = get_batch(source)
    if batch is None or batch < 2 or getattr(r.module, "MIXES_BATCH", False):
        return
    xs, out = inputs(0), outs[0]
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if not tensors or any(x.dim() == 0 or x.shape[0] != batch for x in tensors):
        return   # inputs without a leading batch dimension: nothing to vary per sample
    if any(o.dim() == 0 or o.shape[0] != batch for o in out):
        raise Reject("batch_mixing", f"an output has no leading batch dimension of BATCH={batch} "
                                     f"(shapes {[list(o.shape) for o in out]}): samples are combined")
    varied = []
    for x in xs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.clone()
            x[0] = torch.randn(x[0].shape, generator=g, device=x.device, dtype=x.dtype) * (float(x.std()) + 1)
        varied.append(x)
    again = r.run(model, varied, "run with sample 0 changed")
    if not _same([o[1:] for o in out], [o[1:] for o in again], max(1e-6, cfg["det_rel"])):
        raise Reject("batch_mixing", "changing sample 0 of the batch changes the outputs of the other samples")


def median_ms(r: Runner, fn, xs: list, cfg: dict, failure: str, budget_s: float | None = None) -> float:
    """Median time of `fn(*xs)` over cfg's warm-up and timed runs (stopping early once `budget_s`
    is spent); a run that raises rejects the task under `failure` (out of memory, a kernel that
    fails only when run again, a recompilation that breaks)."""
    from cuda_agent.judge.timing import CallTimer

    timer = CallTimer(r.device)
    times: list[float] = []
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    try:
        with r.torch.no_grad():
            for i in range(cfg["n_warmup"] + cfg["n_timed"]):
                timer.start()
                fn(*xs)
                ms = timer.stop()
                if i >= cfg["n_warmup"]:
                    times.append(ms)
                if deadline is not None and time.monotonic() > deadline and times:
                    break
    except Exception as exc:
        raise Reject(failure, f"timed run: {type(exc).__name__}: {str(exc)[:400]}") from None
    return statistics.median(times)


def eager_ms(r: Runner, cfg: dict) -> float:
    return median_ms(r, r.model(), r.inputs(INPUT_SEEDS[0]), cfg, "eager_error", cfg["timing_budget_s"])


def _per_sample_mb(r: Runner, batch: int) -> float:
    """The larger of input and output memory per sample (both grow with BATCH)."""
    torch = r.torch
    xs = r.inputs(INPUT_SEEDS[0])
    in_mb = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor)) / 2**20
    out_mb = sum(o.numel() * o.element_size() for o in r.run(r.model(), xs)) / 2**20
    return max(in_mb / max(1, batch), out_mb / max(1, batch), 1e-9)


def runtime_window(source: str, cfg: dict) -> tuple[str, Runner, float, list[int]]:
    """Time the task and rescale BATCH toward the window; returns the final source and its time."""
    from cuda_agent.synth.compose import get_batch, set_batch

    lo, hi = cfg["min_ms"], cfg["max_ms"]
    target = cfg.get("target_ms") or math.sqrt(lo * hi)
    r = Runner(source, cfg["device"])
    ms = eager_ms(r, cfg)
    batches = [b] if (b := get_batch(source)) is not None else []
    for _ in range(cfg["max_rescales"]):
        if lo <= ms <= hi or not batches:
            break
        batch = batches[-1]
        per_sample_mb = _per_sample_mb(r, batch)
        limit = max(1, int(min(cfg["max_input_mb"], cfg["max_output_mb"]) / per_sample_mb))
        new = max(1, min(limit, round(batch * target / max(ms, 1e-6))))
        if new == batch:
            break
        while True:
            try:
                cand = Runner(set_batch(source, new), cfg["device"])
                ms_new = eager_ms(cand, cfg)
                break
            except Exception as exc:
                if isinstance(exc, Reject) and not is_out_of_memory(exc):
                    raise
                back = (new + batch) // 2
                if not is_out_of_memory(exc) or back in (new, batch):
                    how = exc.message if isinstance(exc, Reject) else f"{type(exc).__name__}: {exc}"
                    raise Reject("runtime_window", f"rescaled to BATCH={new}: {how}") from None
            # Out of memory at the new size: halfway back toward the last size that ran (the
            # estimate counts inputs and outputs only, not what the forward holds meanwhile).
            # Freed here, past the except block: the exception's frames held the failed run's tensors.
            cand = None
            _free(r.torch, cfg["device"])
            new = back
        source, r, ms = set_batch(source, new), cand, ms_new
        batches.append(new)
    if not lo <= ms <= hi:
        how = f" after rescaling BATCH {' -> '.join(map(str, batches))}" if len(batches) > 1 else ""
        raise Reject("runtime_window", f"eager {ms:.4g} ms outside [{lo:g}, {hi:g}] ms{how}")
    return source, r, ms, batches


def smaller_batch(source: str, r: Runner, cfg: dict, batches: list[int]) -> tuple[str, Runner, float]:
    """Half the last BATCH, timed again; rejects the task as out_of_memory once that leaves the window."""
    from cuda_agent.synth.compose import set_batch

    _free(r.torch, cfg["device"])
    new = batches[-1] // 2
    if new < 1:
        raise Reject("out_of_memory", f"the checks run out of memory at BATCH={batches[-1]}")
    source = set_batch(source, new)
    r = Runner(source, cfg["device"])
    ms = eager_ms(r, cfg)
    if not cfg["min_ms"] <= ms <= cfg["max_ms"]:
        raise Reject("out_of_memory", f"the checks run out of memory at BATCH={batches[-1]}; BATCH={new} takes "
                                      f"{ms:.4g} ms, outside [{cfg['min_ms']:g}, {cfg['max_ms']:g}] ms")
    batches.append(new)
    return source, r, ms


def compile_check(r: Runner, cfg: dict) -> float:
    from cuda_agent.judge.compare import compare_outputs

    torch = r.torch
    torch._dynamo.reset()
    model = r.model()
    xs = r.inputs(INPUT_SEEDS[0])
    expected = r.run(model, xs)
    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            got = _flat(compiled(*xs))
        if r.device == "cuda":
            torch.cuda.synchronize()  # its kernels' failures are the compile's, not a later check's
    except Exception as exc:
        raise Reject("compile_error", f"{type(exc).__name__}: {str(exc)[:400]}") from None
    cmp = _where_it_fits(lambda e, g: compare_outputs(e, g, atol=cfg["atol"], rtol=cfg["rtol"],
                                                      max_rel_l2=cfg["max_rel_l2"]), list(expected), list(got))
    if not cmp.ok:
        raise Reject("compile_mismatch", cmp.message)
    return median_ms(r, compiled, xs, cfg, "compile_error")


def check(source: str, cfg: dict) -> dict:
    """All execution checks of one task. Returns a CheckResult as a dict."""
    t0 = time.monotonic()
    result: dict = {"accepted": False, "rejection": None, "passed": [], "source": source, "stage_s": {}}
    clock = {"at": t0, "running": "load"}

    def stage(done: str, running: str = "") -> None:
        # where a task's check time goes (the throughput benchmark sums it per stage); a rejected
        # task's time since the last stage ended is the running stage's
        now = time.monotonic()
        result["stage_s"][done] = round(result["stage_s"].get(done, 0.0) + now - clock["at"], 4)
        clock.update(at=now, running=running)

    try:
        r = Runner(source, cfg["device"])
        r.run(r.model(), r.inputs(INPUT_SEEDS[0]))
        result["passed"].append("eager")
        stage("load", "trace")
        result["trace"] = _trace(source)
        stage("trace", "values")
        value_checks(r, cfg, full=True)
        result["passed"] += ["random", "train_eval", "degenerate", "usage"]
        stage("values", "shortcuts" if cfg["shortcuts"] else "window")
        if cfg["shortcuts"]:
            shortcut_checks(r, cfg, source, result["trace"] or [])
            result["passed"].append("shortcuts")
            stage("shortcuts", "window")
        final, r, ms, batches = runtime_window(source, cfg)
        result["passed"].append("runtime_window")
        stage("window", "final_values")
        while True:
            try:
                info = value_checks(r, cfg, full=False)
                stage("final_values", "criterion" if cfg["criterion"] else ("compile" if cfg["compile"] else ""))
                crit = check_payload(final, cfg) if cfg["criterion"] else None
                if crit is not None and not crit.ok:
                    raise Reject(crit.filter, crit.message)
                if crit is not None:
                    result["passed"].append("criterion")
                    stage("criterion", "compile" if cfg["compile"] else "")
                compile_ms = compile_check(r, cfg) if cfg["compile"] else None
                if cfg["compile"]:
                    stage("compile")
                break
            except Exception as exc:
                # These checks hold several outputs at once (torch.compile its own buffers too): a
                # size whose timing ran can run out of memory here. Half the BATCH is tried while
                # its time stays in the window.
                if not is_out_of_memory(exc) or not batches:
                    raise
            final, r, ms = smaller_batch(final, r, cfg, batches)
            stage("window", "final_values")  # the failed try and the retimed half BATCH: the window's cost
        result.update(info, source=final, eager_ms=ms, batches=batches)
        if compile_ms is not None:
            result["compile_ms"] = compile_ms
            result["passed"].append("compile")
        result["accepted"] = True
    except Reject as rej:
        result["rejection"] = {"filter": "out_of_memory" if is_out_of_memory(rej) else rej.filter, "message": rej.message[:2000]}
    except Exception as exc:  # a checker bug must still yield a record, not kill the worker
        result["rejection"] = {"filter": "out_of_memory" if is_out_of_memory(exc) else "worker_error",
                               "message": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"}
    if clock["running"]:
        stage(clock["running"])
    if result["rejection"] is not None:
        import torch

        _free(torch, cfg["device"])
    result["check_s"] = time.monotonic() - t0
    # a CUDA error (illegal address, launch failure) poisons the context for every later task:
    # ask the parent for a fresh process after this reply
    msg = (result["rejection"] or {}).get("message", "")
    result["restart"] = cfg["device"] == "cuda" and ("CUDA error" in msg or "AcceleratorError" in msg)
    return result


def _trace(source: str) -> list[str] | None:
    """The operators the task runs on meta tensors, for decontamination (None: not traceable)."""
    from cuda_agent.synth.trace import TraceError, traced_ops

    try:
        return traced_ops(source)
    except TraceError:
        return None


def _free(torch, device: str) -> None:
    """Give cached GPU memory back after a rejection, so the next task starts from an empty share."""
    import gc

    gc.collect()
    if device == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a faulted context: the parent restarts this worker
            pass


def gpu_memory_cap(total_bytes: int, limit_mb: int, share: int) -> float:
    """The fraction of the GPU one worker may allocate: its limit, or an equal part of 90% of the
    GPU when `share` workers at that limit would not fit (out-of-memory rejections would then
    depend on what the other workers happen to hold)."""
    return min(limit_mb * 2**20 / total_bytes, 0.9 / max(1, share))


def main(argv: list[str]) -> int:
    req_fd, rep_fd = int(argv[0]), int(argv[1])
    warnings.simplefilter("ignore")
    import torch

    threads = int(os.environ.get("CUDA_AGENT_SYNTH_THREADS", "1"))
    torch.set_num_threads(max(1, threads))
    if torch.cuda.is_available():
        true_fp32(torch)   # the judge's references are true fp32
        limit_mb = int(os.environ.get("CUDA_AGENT_SYNTH_GPU_MB", "16384"))
        share = int(os.environ.get("CUDA_AGENT_SYNTH_GPU_SHARE", "1"))
        torch.cuda.set_per_process_memory_fraction(
            gpu_memory_cap(torch.cuda.mem_get_info()[1], limit_mb, share))
    rep = os.fdopen(rep_fd, "w", buffering=1)
    rep.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    with os.fdopen(req_fd, "r") as req:
        for line in req:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("op") == "exit":
                break
            out = check(msg["source"], msg["config"])
            rep.write(json.dumps(out) + "\n")
            if out["restart"]:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
