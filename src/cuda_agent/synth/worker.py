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
                         shortcuts.py): degenerate, droppable_input, hardcodable_parameter,
                         droppable_parameter, ill_conditioned, batch_mixing
  runtime_window         eager median in [min_ms, max_ms], BATCH rescaled toward it first
                         (a size that runs out of GPU memory is backed off toward the last good one;
                         on the GPU, BATCH stays where the later checks fit the worker's memory share)
  (the value checks are repeated on the rescaled task)
  criterion_*            the export criterion (criterion.py) on the rescaled task, as the judge
                         draws and compares it
  out_of_memory          any check above ran out of the worker's GPU memory share (the checks after
                         the window first retry at half the BATCH while its time stays in the window),
                         or the window reaches min_ms only at a BATCH whose later checks would not fit
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
import warnings

from cuda_agent.host import is_out_of_memory, true_fp32

from .criterion import check_payload
# the ops that jump at a boundary (kept in hazards.py beside the composer's probe; named here too,
# where earlier callers read them)
from .hazards import DISCONTINUOUS, jumps_at_boundaries  # noqa: F401
# the loaded task and its runs (in their own module: this one runs as __main__ in the worker
# process, where its own classes would not be the ones shortcuts.py raises)
from .runner import INIT_SEED, INPUT_SEEDS, Reject, Runner, _flat, _same, _trace  # noqa: F401
from .shortcuts import shortcut_checks, shortcut_runner

# The GPU memory this worker may allocate, in bytes (main sets it from the worker's share of the
# GPU); None where no cap is known (checks run in-process, the CPU): the window then sizes BATCH by
# time and the input/output limits alone.
GPU_CAP_BYTES: float | None = None


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
    # Each comparison's second output is let go at once: at the exported size (a memory-bound task
    # near the window's 1 ms takes gigabytes) these checks would otherwise hold five outputs and two
    # input sets together, and a task whose timed runs fit its worker's GPU share ran out of it here.
    if not _same(out, r.run(model, xs, "second run"), cfg["det_rel"]):
        raise Reject("nondeterministic", "two runs on identical inputs give different outputs")
    out_mb = sum(o.numel() * o.element_size() for o in out) / 2**20
    if out_mb > cfg["max_output_mb"]:
        raise Reject("output_too_large", f"outputs take {out_mb:.0f} MiB > {cfg['max_output_mb']} MiB (the judge's limit)")
    model.eval()
    same = _same(out, r.run(model, xs, "eval-mode run"), cfg["det_rel"])
    model.train()
    if not same:
        raise Reject("train_eval_mismatch", "output in eval() mode differs from train() mode")
    for i, o in enumerate(out):
        if not bool(torch.isfinite(o).all()):
            n = int((~torch.isfinite(o)).sum())
            raise Reject("nonfinite", f"output {i}: {n} of {o.numel()} values are NaN or Inf")
        if o.numel() > 1 and float(o.max() - o.min()) <= 1e-6 * (1.0 + float(o.abs().max())):
            raise Reject("constant_output", f"output {i} is constant ({float(o.reshape(-1)[0]):.4g})")
    info: dict = {"output_shapes": [list(o.shape) for o in out],
                  "input_shapes": [list(x.shape) for x in xs if isinstance(x, torch.Tensor)],
                  "n_params": sum(p.numel() for p in model.parameters())}
    if not full:
        xs = None   # only the usage check below needs them again
    other = r.run(model, r.inputs(INPUT_SEEDS[1]), "run on other inputs")
    if _same(out, other, max(1e-7, cfg["det_rel"])):
        raise Reject("input_independent", "outputs do not change when the inputs change")
    from cuda_agent.judge.compare import degenerate_warnings

    warns = _where_it_fits(lambda *sets: degenerate_warnings(list(sets), atol=cfg["atol"], rtol=cfg["rtol"]),
                           out, other)
    if warns:
        raise Reject("degenerate", "; ".join(warns))
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


def eager_ms(r: Runner, cfg: dict, memory: dict | None = None) -> float:
    """The task's eager median time; on the GPU, with `memory`, also what the timed runs held at
    their peak beyond the weights (`memory["held"]`: inputs, the clones the runs make, the
    forward's intermediates and outputs, all of which grow with BATCH) and the weights' bytes."""
    torch = r.torch
    measure = memory is not None and r.device == "cuda"
    if measure:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = r.model()
    ms = median_ms(r, model, r.inputs(INPUT_SEEDS[0]), cfg, "eager_error", cfg["timing_budget_s"])
    if measure:
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        memory.update(weights=weights, held=max(0, torch.cuda.max_memory_allocated() - base - weights))
    return ms


def memory_batch(memory: dict, batch: int, cap: float | None, multiple: float) -> int | None:
    """The largest BATCH whose checks after the window fit in `cap` bytes, from what the timed runs
    at `batch` held (`eager_ms`'s `memory`), or None where nothing bounds it. Those checks hold
    about `multiple` times what a timed run holds (the criterion keeps a float32 output while a
    float64 forward runs and then compares the two in float64), and the weights three times
    (float32, the float64 twin, a second draw of them). Scaling what the runs held by BATCH counts
    any fixed part (a library's workspace) as growing with it: an underestimate of the BATCH that
    fits, which a timing at the smaller size measures again."""
    if cap is None or multiple <= 0 or not memory.get("held"):
        return None
    room = cap - 3 * memory["weights"]
    return max(0, int(room * batch / (multiple * memory["held"])))


def _per_sample_mb(r: Runner, batch: int) -> float:
    """The larger of input and output memory per sample (both grow with BATCH)."""
    torch = r.torch
    xs = r.inputs(INPUT_SEEDS[0])
    in_mb = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor)) / 2**20
    out_mb = sum(o.numel() * o.element_size() for o in r.run(r.model(), xs)) / 2**20
    return max(in_mb / max(1, batch), out_mb / max(1, batch), 1e-9)


def runtime_window(source: str, cfg: dict) -> tuple[str, Runner, float, list[int], dict]:
    """Time the task and rescale BATCH toward the window; returns the final source, its runner,
    time and BATCH sizes, and what its timed runs held (`eager_ms`'s `memory`).

    On the GPU the BATCH is also held to what the worker's memory share fits for the checks after
    the window (`memory_batch`): a task whose time only reaches the window at a size whose checks
    cannot fit is rejected as out_of_memory here, after one timing, rather than after the final
    value checks have run out of memory at that size and again at half of it."""
    from cuda_agent.synth.compose import get_batch, set_batch

    lo, hi = cfg["min_ms"], cfg["max_ms"]
    target = cfg.get("target_ms") or lo ** 0.75 * hi ** 0.25   # see FilterConfig.target_ms
    cap = GPU_CAP_BYTES if cfg["device"] == "cuda" else None
    r = Runner(source, cfg["device"])
    memory: dict = {}
    ms = eager_ms(r, cfg, memory)
    batches = [b] if (b := get_batch(source)) is not None else []
    bounded = None   # the memory bound of the last rescale, when it lowered the BATCH time asked for
    for _ in range(cfg["max_rescales"]):
        if not batches:
            break
        batch = batches[-1]
        fits = memory_batch(memory, batch, cap, cfg["check_memory_multiple"])
        if lo <= ms <= hi and (fits is None or batch <= fits):
            break
        if ms < lo and fits is not None and fits <= batch:
            bounded = fits
            break    # faster than the window already at the most that fits: no size reaches it
        per_sample_mb = _per_sample_mb(r, batch)
        limit = max(1, int(min(cfg["max_input_mb"], cfg["max_output_mb"]) / per_sample_mb))
        new = max(1, min(limit, round(batch * target / max(ms, 1e-6))))
        if fits is not None and new > fits:
            new, bounded = max(1, fits), fits
        if new == batch:
            break
        while True:
            try:
                cand = Runner(set_batch(source, new), cfg["device"])
                memory_new: dict = {}
                ms_new = eager_ms(cand, cfg, memory_new)
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
        source, r, ms, memory = set_batch(source, new), cand, ms_new, memory_new
        batches.append(new)
    if not lo <= ms <= hi:
        how = f" after rescaling BATCH {' -> '.join(map(str, batches))}" if len(batches) > 1 else ""
        if ms < lo and bounded is not None:
            raise Reject("out_of_memory", f"eager {ms:.4g} ms at BATCH={batches[-1]}{how}, under {lo:g} ms; the checks "
                                          f"after the window fit the worker's GPU memory share "
                                          f"({cap / 2**20:.0f} MiB) up to about BATCH={bounded}")
        raise Reject("runtime_window", f"eager {ms:.4g} ms outside [{lo:g}, {hi:g}] ms{how}")
    return source, r, ms, batches, memory


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
            on = shortcut_runner(r, source, cfg)
            result["shortcut_device"] = on.device
            shortcut_checks(on, cfg, source, result["trace"] or [])
            result["passed"].append("shortcuts")
            stage("shortcuts", "window")
        final, r, ms, batches, memory = runtime_window(source, cfg)
        result["passed"].append("runtime_window")
        stage("window", "final_values")
        while True:
            try:
                base = _peak_reset(r)
                info = value_checks(r, cfg, full=False)
                stage("final_values", "criterion" if cfg["criterion"] else ("compile" if cfg["compile"] else ""))
                crit = check_payload(final, cfg) if cfg["criterion"] else None
                if crit is not None and not crit.ok:
                    raise Reject(crit.filter, crit.message)
                if crit is not None:
                    result["passed"].append("criterion")
                    stage("criterion", "compile" if cfg["compile"] else "")
                if base is not None and memory.get("held"):
                    # what the checks after the window held at their peak against what the timed runs
                    # held: the measure behind check_memory_multiple (the benchmark sums it up)
                    result["memory_mb"] = {"held": memory["held"] / 2**20, "weights": memory["weights"] / 2**20,
                                           "checks": (r.torch.cuda.max_memory_allocated() - base) / 2**20}
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
            memory = {}    # measured at the larger size: no ratio for this one
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


def _peak_reset(r: Runner) -> int | None:
    """On the GPU: the bytes allocated now, with the peak counter started again from here."""
    if r.device != "cuda":
        return None
    r.torch.cuda.synchronize()
    r.torch.cuda.reset_peak_memory_stats()
    return r.torch.cuda.memory_allocated()


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
    global GPU_CAP_BYTES
    req_fd, rep_fd = int(argv[0]), int(argv[1])
    warnings.simplefilter("ignore")
    import torch

    threads = int(os.environ.get("CUDA_AGENT_SYNTH_THREADS", "1"))
    torch.set_num_threads(max(1, threads))
    if torch.cuda.is_available():
        true_fp32(torch)   # the judge's references are true fp32
        limit_mb = int(os.environ.get("CUDA_AGENT_SYNTH_GPU_MB", "16384"))
        share = int(os.environ.get("CUDA_AGENT_SYNTH_GPU_SHARE", "1"))
        total = torch.cuda.mem_get_info()[1]
        fraction = gpu_memory_cap(total, limit_mb, share)
        torch.cuda.set_per_process_memory_fraction(fraction)
        GPU_CAP_BYTES = fraction * total
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
