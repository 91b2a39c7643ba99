"""A synthesized task loaded for the synth worker's checks: its module, models and inputs under
fixed seeds on one device (`Runner`), and the rejection the checks raise (`Reject`)."""

from __future__ import annotations

import types
from typing import Any

from cuda_agent.host import is_out_of_memory

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


def _trace(source: str) -> list[str] | None:
    """The operators the task runs on meta tensors, for decontamination (None: not traceable)."""
    from cuda_agent.synth.trace import TraceError, traced_ops

    try:
        return traced_ops(source)
    except TraceError:
        return None
