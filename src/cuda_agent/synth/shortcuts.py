"""Shortcuts at the judge's tolerance: the synth worker's checks of a task at its composed size.

A kernel is rewarded when its output passes the judge's comparison (`judge.compare`: atol = rtol =
1e-2 elementwise and the relative-L2 bound against a float64 evaluation). A task is defective when
something simpler than the task passes that comparison: a zero or constant output, the model with
a parameter (or a triangle or half of one) dropped or replaced, an input ignored. These checks ask
exactly that, on `n_input_sets` fresh input sets (one set is not enough: a near-degenerate output
passes on some sets and not others), and they also reject tasks an honest kernel cannot pass
reliably (a 1e-6 relative input jitter, or float64 arithmetic, leaves the tolerance) and tasks
whose samples influence each other across the batch.
"""

from __future__ import annotations

import time

from .hazards import jumps_at_boundaries
from .runner import Reject, Runner, _flat, _same, _trace


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


def shortcut_runner(r: Runner, source: str, cfg: dict) -> Runner:
    """Where the shortcut checks run: on the worker's CPU when the task at its composed size takes a
    forward there within cfg["shortcut_cpu_ms"], else on `r`'s device. Those checks run the composed
    task a hundred times and more at sizes (BATCH 8-64) where a GPU forward is a few launches of tiny
    kernels. On an H100 with eight workers they took 44% of the workers' time while the GPU, shared
    by time-slicing between the processes, was busy throughout and the CPUs 40% idle: for a small
    task, work the worker's CPU threads can take over. What they decide (degenerate, droppable or
    hard-codable, ill-conditioned, batch mixing) is the task's arithmetic, not the device's; the
    export criterion then checks the exported size on the device. The same weights either way
    (drawn under one seed, then moved)."""
    limit = cfg.get("shortcut_cpu_ms") or 0.0
    if r.device == "cpu" or limit <= 0:
        return r
    try:
        cpu = Runner(source, "cpu")
        model, xs = cpu.model(), cpu.inputs(cfg["shortcut_seed"])
        cpu.run(model, xs)   # the first run pays one-time costs
        # the fastest of three: one run on a loaded host (other workers, a build beside) can take
        # ten times its time and would send a cheap task to the device
        ms = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            cpu.run(model, xs)
            ms = min(ms, (time.perf_counter() - t0) * 1e3)
            if ms <= limit:
                break
    except Reject:
        return r   # an op without a CPU kernel, say: the device decides
    return cpu if ms <= limit else r
