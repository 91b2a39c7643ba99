"""The operators a reference actually runs: a trace of its forward on `meta` tensors.

Decontamination compares what runs, not how it is spelled: a class alias (`Model = DenseStack`),
a subclass (`class Model(Original): pass`), a helper function that `forward` calls, an unused
constant or an inserted no-op (`x = x * 1.0`) all leave the trace as it was. The module is built
and run under `torch.device("meta")`, so tensors have shapes but no storage: a level-3 network
traces in well under a second and allocates nothing, whatever its sizes.

Canonical form of a trace (`canonical_ops`):
- ATen operator names without overload (`aten.mul.Tensor` -> `mul`), in-place forms merged with
  their functional ones (`relu_` -> `relu`);
- a curated set of fused activations and small composites decomposed with torch's own
  decomposition table, so `F.silu(x)` and `x * torch.sigmoid(x)` trace alike (both sigmoid, mul);
- `addmm`/`baddbmm` read as a product then an add, `bmm` as `mm`: `F.linear` and `x @ w.t() + b`
  trace alike;
- views, copies, allocations and dtype casts left out (they move no arithmetic), and so are
  arithmetic no-ops with a Python scalar (`* 1`, `/ 1`, `+ 0`, `- 0`, `** 1`).

What is not covered: ops without a meta kernel or forwards that read tensor values (`.item()`,
data-dependent control flow) cannot be traced; `traced_ops` returns None and the caller falls back
to the static operator sequence of `decontam`. Rewrites that change the arithmetic (a softmax
written out by hand with `max` instead of `amax`) still differ by those ops.

Run as a module it traces sources from stdin (JSON lines `{"source": ...}`) and answers one JSON
line each (`{"ops": [...]}` or `{"ops": null, "error": ...}`): the pipeline traces benchmark tasks
in such a child process, never in its own.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import types
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# decomposed before they are recorded: ops that are commonly written out by hand
DECOMPOSE = {"silu", "mish", "hardswish", "hardsigmoid", "selu", "celu", "softplus", "leaky_relu", "relu6",
             "glu", "softshrink", "hardshrink", "threshold", "square", "rsub", "addcmul", "addcdiv", "lerp",
             "rms_norm", "logsumexp", "xlogy", "logit"}
# ops that move, view, allocate or cast data without arithmetic
SKIP = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze",
        "clone", "contiguous", "alias", "detach", "_to_copy", "to", "copy", "copy_", "slice", "select",
        "as_strided", "unbind", "split", "split_with_sizes", "empty", "empty_like", "empty_strided", "zeros",
        "zeros_like", "ones", "ones_like", "full", "full_like", "new_empty", "new_zeros", "new_ones", "new_full",
        "fill", "lift_fresh", "lift_fresh_copy", "scalar_tensor", "_local_scalar_dense", "flatten", "unflatten",
        "view_as", "reshape_as", "expand_as", "_reshape_alias", "unsafe_view", "resize_", "set_", "type_as",
        "chunk", "narrow", "movedim", "_unsafe_index", "arange", "clamp_min_", "detach_", "lift"}
RENAME = {"bmm": "mm", "matmul": "mm", "convolution": "conv", "_convolution": "conv", "cudnn_convolution": "conv",
          "mkldnn_convolution": "conv", "native_layer_norm": "layer_norm", "_softmax": "softmax",
          "_log_softmax": "log_softmax", "native_group_norm": "group_norm", "native_batch_norm": "batch_norm",
          "_native_batch_norm_legit": "batch_norm", "_native_batch_norm_legit_no_training": "batch_norm",
          "max_pool2d_with_indices": "max_pool2d", "max_pool3d_with_indices": "max_pool3d",
          "true_divide": "div", "subtract": "sub", "multiply": "mul", "divide": "div", "absolute": "abs"}
SPLIT = {"addmm": ("mm", "add"), "baddbmm": ("mm", "add"), "addbmm": ("mm", "add"), "addmv": ("mv", "add")}
IDENTITY_SCALAR = {"mul": 1, "div": 1, "add": 0, "sub": 0, "pow": 1}
TRACE_TIMEOUT_S = 30
# A trace keeps the first MAX_OPS operators: a recurrent network unrolled over its sequence runs
# ~10^5, and its opening layers already say what it is (the forward is stopped there).
MAX_OPS = 1024


class TraceError(Exception):
    """The source could not be traced on meta tensors."""


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items() if op.overloadpacket.__name__ in DECOMPOSE}


class _Full(Exception):
    """The trace reached MAX_OPS: the forward is stopped."""


class _Recorder(TorchDispatchMode):
    def __init__(self, table: dict):
        super().__init__()
        self.table = table
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        decomp = self.table.get(func)
        if decomp is not None:
            with self:   # the decomposition's own ops are recorded in its place
                out = decomp(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = func.overloadpacket.__name__
        if name.endswith("_") and not name.startswith("_"):
            name = name[:-1]
        if not _is_noop(name, args):
            self.ops.extend(SPLIT.get(name, (RENAME.get(name, name),)))
            if len(self.ops) >= MAX_OPS:
                raise _Full()
        return func(*args, **kwargs)


def _is_noop(name: str, args: tuple) -> bool:
    if name in SKIP:
        return True
    ident = IDENTITY_SCALAR.get(name)
    if ident is None or len(args) != 2:
        return False
    a, b = args
    return isinstance(a, torch.Tensor) and isinstance(b, (int, float)) and not isinstance(b, bool) and b == ident


def _load(source: str) -> types.ModuleType:
    module = types.ModuleType("traced_task")
    module.__file__ = "<traced>"
    exec(compile(source, "<traced>", "exec", dont_inherit=True), module.__dict__)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise TraceError(f"missing {name}")
    return module


def traced_ops(source: str) -> list[str]:
    """The canonical operator sequence `Model(*get_init_inputs())(*get_inputs())` runs on meta
    tensors. Raises TraceError when the module cannot be built or run there. Executes `source`:
    call it only inside an isolated process (a synth worker, or `trace_many`'s child)."""
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            module = _load(source)
            torch.manual_seed(0)
            model = module.Model(*module.get_init_inputs())
            inputs = list(module.get_inputs())
            rec = _Recorder(_decompositions())
            try:
                with torch.no_grad(), rec:
                    model(*inputs)
            except _Full:
                pass
    except TraceError:
        raise
    except Exception as exc:  # a refusal on meta tensors is the answer: the caller falls back
        raise TraceError(f"{type(exc).__name__}: {str(exc)[:300]}") from None
    return rec.ops[:MAX_OPS]


def trace_many(sources: list[str], timeout_s: float = 600.0) -> list[list[str] | None]:
    """Traces of `sources` (None where tracing failed), computed in one child process."""
    import subprocess

    if not sources:
        return []
    payload = "".join(json.dumps({"source": s}) + "\n" for s in sources)
    proc = subprocess.run([sys.executable, "-m", "cuda_agent.synth.trace"], input=payload, capture_output=True,
                          text=True, timeout=timeout_s)
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(answers) != len(sources):
        raise RuntimeError(f"tracing child answered {len(answers)} of {len(sources)} (exit {proc.returncode}): "
                           f"{proc.stderr[-800:]}")
    return [a.get("ops") for a in answers]


def _alarm(*_):
    raise TimeoutError(f"trace took longer than {TRACE_TIMEOUT_S} s")


def main() -> int:
    # answers go to the original stdout; whatever the traced modules print goes to stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    for line in sys.stdin:
        if not line.strip():
            continue
        src = json.loads(line)["source"]
        signal.alarm(TRACE_TIMEOUT_S)
        try:
            ans: dict = {"ops": traced_ops(src)}
        except (TraceError, TimeoutError) as exc:
            ans = {"ops": None, "error": str(exc)}
        finally:
            signal.alarm(0)
        answers.write(json.dumps(ans) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
