"""Speed-of-light of a task: the least work its reference implies and the least time that work takes.

`count_work` runs the reference once under a dispatch mode (on the meta device, so nothing is
computed and any size fits; on a real device only when meta kernels are missing) and records:

- **FLOPs by precision** of the operators torch's FLOP counter knows (`torch.utils.flop_counter`:
  GEMMs, batched GEMMs, convolutions, attention), attributed to the dtype of their operands. These
  are the operations that can run on tensor cores.
- **Vector FLOPs** by precision: one per output element of a pointwise operator and one per element
  read by a reduction, softmax or normalisation. That is less than any real implementation does
  (an exp or an erf costs several instructions), which keeps the figure a lower bound; it exists so
  that a task without a GEMM still has an arithmetic intensity for the roofline.
- **Minimum DRAM bytes**: every input, parameter, buffer and output moved once. The judge flushes
  the L2 cache before each timed call, so nothing of these can be served from cache, and nothing
  else must be moved (intermediates can, in principle, stay on chip).

`speed_of_light` turns that into a time on one GPU model (`peaks.py`): memory time = bytes / peak
bandwidth, compute time = the larger of the tensor-core (GEMM-class) time and the vector time, each
at its peak; the bound is the larger of memory and compute time (perfect overlap). A kernel cannot
beat it; the share `sol_ms / runtime_ms` says how close a candidate comes.

fp32 GEMMs: the judge computes references in true fp32 and its tolerance rejects TF32 operands, but
a split-precision GEMM (3xTF32: each operand as a sum of two TF32 numbers, three tensor-core
products) is as accurate as fp32 and passes. So fp32 GEMM work is rated at the faster of the FP32
CUDA-core peak and a third of the TF32 peak, which keeps the bound below anything that can pass.

The physical floor (`floor_ms`, `floor_breach`): what no correct implementation can beat, used by
the judge as a check (a runtime below it, beyond `JudgeConfig.floor_margin`, fails with the timing
category). It is narrower than the bound above, because the bound counts the reference's own work
and an honest kernel may do less:
- FLOPs are not part of it. An algebraic shortcut is correct and can skip a GEMM outright
  (KernelBench level 2 "Matmul_Sum_...": sum(x W^T, dim=1) = x (sum of W's rows), a GEMM becomes a
  GEMV; softmax over a dimension of size 1 is a constant), so the reference's FLOP count at any peak
  is no floor. The FLOP side stays in `sol_ms` and its share, for information.
- Bytes: only inputs and parameters the output depends on (`required_bytes`: elements whose
  gradient under a random cotangent is non-zero, from one forward and backward of the reference on
  the judge's device; non-float inputs, buffers and elements behind zero-gradient operators such as
  ReLU's negative side, sign or argmax are not counted, which only lowers the floor), plus the outputs
  without the dimensions along which their values repeat (a candidate may return an expanded view of
  one slice; the judge materialises it after the call's clock). Where an output holds exactly the
  values of an input or a parameter (the identity, a transpose, a reshape) there is no floor: a
  candidate may return a view of it and move nothing within the call.
- The L2: a call can find up to the L2's size of its inputs on chip when it starts (the judge writes
  inputs after its flush, and stages them in the process's memory) and leave up to that much of its
  outputs there, dirty, when it ends. So reads count only beyond the L2's size, and writes too:
  floor bytes = max(0, required inputs - L2) + max(0, outputs - L2), at the datasheet's DRAM peak
  (above anything measured: 3.0 of 3.35 TB/s on the H100 SXM, 4.3 of 4.8 on the H200).
- Parameters are the same in every call: a candidate that derives something smaller from them once
  (the summed rows above) and reuses it reads less than the floor counts in later calls. That is work
  moved out of the timed calls (THREAT_MODEL.md, category 6), which the floor then refuses.
Not covered: Hopper's compressible memory (an allocation made with the driver's compression flag
moves fewer bytes for compressible data, zeros say) and an output within tolerance that skips an
input whose contribution is below it; `JudgeConfig.floor_margin` is the room left for these.

Not covered: operators outside the FLOP counter and the pointwise/reduction families (sorting,
scans, indexing, pooling, interpolation) add no FLOPs (listed in `uncounted_ops`); a task whose
forward is data-dependent in a way meta tensors cannot follow is counted on the judge's device.
"""

from __future__ import annotations

import math
import types
from collections import defaultdict

from pydantic import BaseModel, ConfigDict, Field

from .peaks import GpuPeaks, known_models, peaks_for

# operators that only move, allocate or reinterpret data: no arithmetic to count
_MOVEMENT = frozenset({
    "clone", "copy_", "copy", "_to_copy", "contiguous", "fill_", "fill", "zero_", "zeros_like", "ones_like",
    "empty_like", "full_like", "cat", "stack", "constant_pad_nd", "flip", "roll", "repeat", "index", "index_select",
    "gather", "scatter", "scatter_", "masked_fill", "masked_fill_", "expand_copy", "permute_copy", "lift_fresh",
    "lift_fresh_copy", "detach", "alias", "_unsafe_view", "slice_scatter", "select_scatter", "index_put_",
    "index_put", "masked_scatter", "tril", "triu", "_local_scalar_dense", "empty", "empty_strided", "zeros", "ones",
    "full", "arange", "scalar_tensor", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided",
    "resize_", "set_", "split_with_sizes_copy", "unbind_copy", "_reshape_alias", "pad", "reflection_pad1d",
    "reflection_pad2d", "replication_pad1d", "replication_pad2d",
})

# reductions, softmax and normalisations the operator tags do not mark: one FLOP per element read
_READS_EACH = frozenset({
    "_softmax", "_log_softmax", "softmax", "log_softmax", "native_layer_norm", "native_group_norm",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "_fused_rms_norm", "rms_norm", "cumsum", "cumprod", "logcumsumexp",
    "logsumexp", "linalg_vector_norm", "norm", "_euclidean_dist", "_cdist_forward", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d", "mse_loss", "huber_loss",
    "smooth_l1_loss", "nll_loss_forward", "nll_loss2d_forward", "binary_cross_entropy", "kl_div",
    "cosine_similarity", "upsample_nearest2d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_nearest1d", "upsample_linear1d", "upsample_bicubic2d", "upsample_trilinear3d",
})


def precision_of(dtype) -> str:
    """The peaks-table precision key work in `dtype` runs at."""
    import torch

    if dtype in (torch.float16,):
        return "fp16"
    if dtype in (torch.bfloat16,):
        return "bf16"
    if dtype in (torch.float64, torch.complex128):
        return "fp64"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    if "float8" in str(dtype):
        return "fp8"
    return "fp32"


class TaskWork(BaseModel):
    """The least work a task's reference implies, independent of the device. FLOPs and bytes per call."""

    model_config = ConfigDict(frozen=True)
    matmul_flops: dict[str, int] = Field(default_factory=dict)   # per precision: GEMM, convolution, attention
    vector_flops: dict[str, int] = Field(default_factory=dict)   # per precision: pointwise and reductions
    input_bytes: int = 0
    param_bytes: int = 0          # parameters and buffers
    output_bytes: int = 0
    counted_on: str = "meta"      # where the reference ran while counted
    uncounted_ops: list[str] = Field(default_factory=list)
    # inputs and parameters (bytes) the output depends on, and output bytes a candidate must write (see
    # the module docstring: repeated values and rearranged inputs need less); None: not established
    required_input_bytes: int | None = None
    required_output_bytes: int | None = None

    @property
    def flops(self) -> int:
        return sum(self.matmul_flops.values()) + sum(self.vector_flops.values())

    @property
    def dram_bytes(self) -> int:
        return self.input_bytes + self.param_bytes + self.output_bytes

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity in FLOP per DRAM byte."""
        return self.flops / self.dram_bytes if self.dram_bytes else None


class SpeedOfLight(BaseModel):
    """A task's work and, on a GPU model in the peaks table, the least time it can take there."""

    model_config = ConfigDict(frozen=True)
    work: TaskWork
    device_name: str
    gpu_model: str | None = None         # the peaks-table entry used; None: no bound (reason says why)
    dram_gbs: float | None = None
    memory_ms: float | None = None
    matmul_ms: float | None = None
    vector_ms: float | None = None
    sol_ms: float | None = None
    bound: str | None = None             # "memory" | "compute"
    reason: str | None = None            # why there is no bound
    # The physical floor (module docstring): bytes that must cross DRAM in a call and their time at
    # the DRAM peak. Records stored before the floor existed lack these fields (see `has_floor_fields`).
    l2_bytes: int | None = None
    floor_bytes: int | None = None
    floor_ms: float | None = None

    @property
    def has_floor_fields(self) -> bool:
        """Whether this record was made by a `speed_of_light` that knew the floor (a cached record from
        before it has neither field set, and is counted again)."""
        return "floor_bytes" in self.model_fields_set

    def floor_share(self, runtime_ms: float | None) -> float | None:
        """floor_ms / runtime_ms: over 1.0 is faster than any correct implementation can be."""
        if not self.floor_ms or not runtime_ms or runtime_ms <= 0:
            return None
        return self.floor_ms / runtime_ms

    @property
    def compute_ms(self) -> float | None:
        if self.matmul_ms is None or self.vector_ms is None:
            return None
        return max(self.matmul_ms, self.vector_ms)

    def share(self, runtime_ms: float | None) -> float | None:
        """Runtime as a share of speed-of-light: sol_ms / runtime_ms (1.0 = at the hardware's limit)."""
        if self.sol_ms is None or not runtime_ms or runtime_ms <= 0:
            return None
        return self.sol_ms / runtime_ms

    def achieved(self, runtime_ms: float | None) -> tuple[float, float] | None:
        """(FLOP/s, bytes/s) a call of `runtime_ms` achieves with this task's least work (roofline point)."""
        if not runtime_ms or runtime_ms <= 0:
            return None
        return self.work.flops / (runtime_ms * 1e-3), self.work.dram_bytes / (runtime_ms * 1e-3)


def matmul_rate(peaks: GpuPeaks, precision: str) -> float:
    """FLOP/s a GEMM-class operator in `precision` can reach at most (see the module docstring for fp32)."""
    fp32 = peaks.flops_per_s("fp32") or 0.0
    if precision == "fp32":
        return max(fp32, (peaks.flops_per_s("tf32") or 0.0) / 3)
    return peaks.flops_per_s(precision) or fp32


def vector_rate(peaks: GpuPeaks, precision: str) -> float:
    """FLOP/s of pointwise work on CUDA cores: fp32 lanes, twice that for packed fp16/bf16 (and the
    8-bit types, which are no faster than packed halves there), the FP64 peak for fp64."""
    fp32 = peaks.flops_per_s("fp32") or 0.0
    if precision == "fp64":
        return peaks.flops_per_s("fp64") or fp32
    if precision in ("fp16", "bf16", "fp8", "int8"):
        return 2 * fp32
    return fp32


def floor_bytes(work: TaskWork, l2_bytes: int) -> int:
    """Bytes a call must move through DRAM whatever it computes (module docstring): the inputs it
    depends on beyond what the L2 can hold when it starts, the outputs beyond what it can hold when it ends."""
    need = work.required_input_bytes or 0
    out = work.output_bytes if work.required_output_bytes is None else work.required_output_bytes
    return max(0, need - l2_bytes) + max(0, out - l2_bytes)


def speed_of_light(work: TaskWork, device_name: str, peaks: GpuPeaks | None = None,
                   l2_bytes: int | None = None) -> SpeedOfLight:
    """The bound of `work` on the GPU torch calls `device_name` (or on `peaks` when given).
    `l2_bytes`: the L2 size the device reports; the floor takes the larger of it and the table's."""
    peaks = peaks or peaks_for(device_name)
    if peaks is None:
        reason = ("the CPU backend has no speed-of-light (its limit depends on the host's cores, vector units, "
                  "clocks and memory channels, which the judge does not measure)"
                  if device_name.startswith("cpu") else
                  f"no peak figures for {device_name!r} (known GPU models: {', '.join(known_models())})")
        return SpeedOfLight(work=work, device_name=device_name, reason=reason, floor_bytes=None)
    memory_ms = work.dram_bytes / (peaks.dram_gbs * 1e9) * 1e3
    matmul_ms = sum(f / matmul_rate(peaks, p) for p, f in work.matmul_flops.items()) * 1e3
    vector_ms = sum(f / vector_rate(peaks, p) for p, f in work.vector_flops.items()) * 1e3
    compute_ms = max(matmul_ms, vector_ms)
    l2 = max(int(peaks.l2_mb * 1e6), l2_bytes or 0)
    moved = floor_bytes(work, l2)
    return SpeedOfLight(work=work, device_name=device_name, gpu_model=peaks.model, dram_gbs=peaks.dram_gbs,
                        memory_ms=memory_ms, matmul_ms=matmul_ms, vector_ms=vector_ms,
                        sol_ms=max(memory_ms, compute_ms), bound="memory" if memory_ms >= compute_ms else "compute",
                        l2_bytes=l2, floor_bytes=moved, floor_ms=moved / (peaks.dram_gbs * 1e9) * 1e3)


def floor_breach(sol: SpeedOfLight | None, runtime_ms: float | None, margin: float) -> str | None:
    """Why `runtime_ms` is impossible for correct work on this GPU, or None: it breaks the floor when
    floor_ms / runtime_ms exceeds `margin` (the room for what the floor does not model, module
    docstring). `margin` <= 0: no check."""
    if sol is None or margin <= 0:
        return None
    share = sol.floor_share(runtime_ms)
    if share is None or share <= margin:
        return None
    work = sol.work
    l2_mb = (sol.l2_bytes or 0) / 1e6
    written = work.output_bytes if work.required_output_bytes is None else work.required_output_bytes
    return (f"runtime {runtime_ms:.4g} ms is below the physical floor of this task on {sol.gpu_model}: "
            f"{sol.floor_ms:.4g} ms = {sol.floor_bytes / 1e6:.1f} MB that must cross DRAM / {sol.dram_gbs:.0f} GB/s "
            f"(the datasheet peak). The bytes: inputs and parameters the output depends on "
            f"{(work.required_input_bytes or 0) / 1e6:.1f} MB and outputs {written / 1e6:.1f} MB, "
            f"each less the {l2_mb:.0f} MB the L2 can hold. The runtime is {share:.3g}x faster than that "
            f"(allowed: {margin:.3g}x); no correct implementation moves those bytes faster")


# ------------------------------------------------------------------------------------------ counting
def _tensors(values) -> list:
    import torch

    out = []
    stack = [values]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    return out


def _nbytes(tensors) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _counter():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class _Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.matmul: dict[str, int] = defaultdict(int)
            self.vector: dict[str, int] = defaultdict(int)
            self.uncounted: set[str] = set()

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            name = packet.__name__
            ins = _tensors((args, kwargs))
            outs = _tensors(out)
            first = next((t for t in ins if t.is_floating_point()), ins[0] if ins else None)
            if packet in flop_registry:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                if flops:
                    self.matmul[precision_of(first.dtype if first is not None else torch.float32)] += int(flops)
                return out
            if func.is_view or name in _MOVEMENT or name.endswith("_copy") or not outs:
                return out
            tags = set(func.tags)
            big_in = max((t.numel() for t in ins), default=0)
            if torch.Tag.pointwise in tags:
                n = max(t.numel() for t in outs)
            elif torch.Tag.reduction in tags or name.rstrip("_") in _READS_EACH:
                n = big_in
            else:
                self.uncounted.add(name)
                return out
            dtype = (first if first is not None else outs[0]).dtype
            if n:
                self.vector[precision_of(dtype)] += int(n)
            return out

    return _Count()


def count_work(source: str, *, device: str = "cpu", name: str = "task") -> TaskWork:
    """Count the work of the KernelBench-format reference in `source` (see the module docstring).
    Runs the reference's code in this process: call it only where the reference is trusted (the
    judge's own process, a task set's tooling). Raises ValueError when it can run on neither the
    meta device nor `device`."""
    import torch

    module = types.ModuleType(f"sol_{name}")
    exec(compile(source, name, "exec"), module.__dict__)
    problems = []
    for where in ("meta", device):
        try:
            torch.manual_seed(0)
            with torch.device(where):
                model = module.Model(*module.get_init_inputs())
                inputs = list(module.get_inputs())
            if hasattr(model, "to"):
                model = model.to(where)
            inputs = [x.to(where) if isinstance(x, torch.Tensor) else x for x in inputs]
            params = (list(model.parameters()) + list(model.buffers())) if isinstance(model, torch.nn.Module) else []
            counter = _counter()
            with counter, torch.no_grad():
                out = model(*inputs)
            return TaskWork(matmul_flops=dict(counter.matmul), vector_flops=dict(counter.vector),
                            input_bytes=_nbytes(_tensors(inputs)), param_bytes=_nbytes(params),
                            output_bytes=_nbytes(_tensors(out)), counted_on=where,
                            uncounted_ops=sorted(counter.uncounted))
        except Exception as exc:  # a missing meta kernel or data-dependent code: count for real
            problems.append(f"{where}: {type(exc).__name__}: {str(exc)[:200]}")
    raise ValueError(f"{name}: cannot count the reference's work ({'; '.join(problems)})")


def _distinct_bytes(t) -> int:
    """Bytes of `t` once the dimensions along which its values repeat are left out: a candidate may
    return such an output as an expanded view of one slice, which writes only that slice."""
    import torch

    for dim in range(t.dim()):
        if t.shape[dim] > 1 and torch.equal(t, t.narrow(dim, 0, 1).expand_as(t)):
            t = t.narrow(dim, 0, 1)
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _rearranges(out, sources) -> bool:
    """Whether `out` holds exactly the values of one of `sources`, maybe reordered (a transpose, a
    reshape, a flip, the identity): a candidate may return a view of it and move nothing in the call."""
    import torch

    flat = out.detach().reshape(-1)
    for src in sources:
        if src.numel() == out.numel() and src.dtype == out.dtype:
            if torch.equal(torch.sort(flat).values, torch.sort(src.detach().reshape(-1)).values):
                return True
    return False


def required_bytes(source: str, *, device: str, name: str = "task", seed: int = 0) -> tuple[int, int] | None:
    """(bytes of the inputs and parameters the reference's output depends on, bytes of output a
    candidate must write). The first from one forward and one backward of the reference on `device`
    (real values: meta tensors have no gradients) with a random cotangent: an element counts when its
    gradient is non-zero (module docstring); only top-level float input tensors and parameters are
    asked, the rest count as not needed, which only lowers the floor. Outputs count without the
    dimensions along which their values repeat, and (0, 0), no floor at all, where an output is a
    rearrangement of an input or a parameter. Runs the reference's code in this process (trusted
    only). None when it cannot run (a backward that raises, memory): the floor then counts the outputs."""
    import torch

    module = types.ModuleType(f"dep_{name}")
    try:
        exec(compile(source, name, "exec"), module.__dict__)
        torch.manual_seed(seed)
        with torch.device(device):
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
        if hasattr(model, "to"):
            model = model.to(device)
        inputs = [x.to(device).detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
                  else x for x in inputs]
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        if isinstance(model, torch.nn.Module):
            leaves += [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
        with torch.enable_grad():
            every = _tensors(model(*inputs))
            outs = [t for t in every if t.is_floating_point() and t.requires_grad]
            with torch.no_grad():
                if any(_rearranges(t, leaves) for t in every):
                    return 0, 0
                written = sum(_distinct_bytes(t.detach()) for t in {id(t): t for t in every}.values())
            if not outs or not leaves:
                return 0, written
            gen = torch.Generator(device=device).manual_seed(seed + 1)
            cotangents = [torch.randn(t.shape, dtype=t.dtype, device=t.device, generator=gen) for t in outs]
            grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
        # NaN != 0, so a NaN gradient counts as a dependence (sqrt at 0 and the like); never more than the
        # tensor's storage (an expanded input is stored once)
        read = sum(min(int((g != 0).sum()) * leaf.element_size(), leaf.untyped_storage().nbytes())
                   for leaf, g in zip(leaves, grads) if g is not None)
        return read, written
    except Exception:  # a reference that cannot run backward (in-place on leaves, integer paths, memory)
        return None
    finally:
        module.__dict__.clear()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def fmt_flops(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def fmt_share(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"
