"""The observer of what a call runs: built by the judge, loaded by every worker before candidate code.

`infra/observer.cpp` registers a global RecordFunction callback that records the name of every
operator entering the dispatcher (see that file). This module holds the two halves around it:

- the build spec (compiled once per toolchain through the judge's own `Builder` and cache);
- `seal`, run in the worker before candidate code loads: the few Python entry points that reach a
  kernel *without* passing Dispatcher::call (and so without RecordFunction) are replaced by
  functions that refuse, and so are the switches that turn RecordFunction off. Their identities
  are checked after every call, like the timers.

Every call then returns the set of operator names it ran, and a sentinel proves the callback was
still there when the call ended.
"""

from __future__ import annotations

import os
from importlib.resources import files

from .builds import BuildSpec

MODULE = "cuda_agent_observer"
FILE = "cuda_agent_observer.so"     # its name in a worker's folder

# Entry points below RecordFunction or switches of it: (module path, attribute). Each is replaced
# by a function that refuses before any candidate code runs.
SEALED = (
    ("torch._ops.OpOverload", "redispatch"),                        # redispatch_boxed to a chosen key
    ("torch._C._DispatchOperatorHandle", "redispatch_boxed"),
    ("torch._C._SafeKernelFunction", "call_boxed"),                  # a kernel called by key, no dispatcher
    ("torch._C", "_dispatch_get_computed_kernel_for_dispatch_key"),  # where such kernels come from
    ("torch._C._autograd", "_enable_record_function"),              # RecordFunction off on this thread
    ("torch.autograd", "_enable_record_function"),
    ("torch._C._autograd", "_clear_callbacks"),                      # removes every global callback
    ("torch.autograd", "_clear_callbacks"),
    ("torch.autograd.profiler", "_enable_record_function"),
)

# Ways between torch tensors and NumPy arrays, Python lists or raw bytes, in bulk: compute done on
# the far side (NumPy, Python) runs no ATen operator, so under the strict policy each use is written
# into the record as an operator of its own, which the policy refuses like any other compute that
# is not the candidate's.
NUMPY_MARK = "cuda_agent::numpy_bridge"
NUMPY_BRIDGES = (
    ("torch.Tensor", "numpy"), ("torch.Tensor", "__array__"), ("torch.Tensor", "__dlpack__"),
    ("torch", "from_numpy"), ("torch", "from_dlpack"), ("torch.utils.dlpack", "from_dlpack"),
    ("torch.utils.dlpack", "to_dlpack"), ("torch", "frombuffer"),
    ("torch.Tensor", "tolist"), ("torch.UntypedStorage", "tolist"), ("torch.UntypedStorage", "from_buffer"),
    ("torch.TypedStorage", "tolist"), ("torch.TypedStorage", "from_buffer"), ("torch", "asarray"),
    ("torch", "save"), ("torch", "load"),
)


def spec() -> BuildSpec:
    source = (files("cuda_agent") / "infra" / "observer.cpp").read_text()
    return BuildSpec(name=MODULE, sources=(("observer.cpp", source),), cflags=("-O2",), with_cuda=False,
                     slot="judge-observer")


def _owner(path: str, torch):
    import importlib

    head, *rest = path.split(".")
    obj = torch if head == "torch" else importlib.import_module(head)
    for i, part in enumerate(rest):
        nxt = getattr(obj, part, None)
        if nxt is None:  # a submodule not imported yet
            try:
                nxt = importlib.import_module(".".join([head, *rest[: i + 1]]))
            except ImportError:
                return None
        obj = nxt
    return obj


def _refuse(what: str, report):
    def refused(*args, **kwargs):
        report(f"{what} (computes without being observed)")
        raise RuntimeError(f"{what} is not available under the judge (it computes without being observed)")

    refused.__module__ = "cuda_agent.judge.observer"
    refused.__qualname__ = refused.__name__ = what.rpartition(".")[2]
    return refused


def seal(torch, report) -> dict[str, tuple]:
    """Replace the SEALED entry points (a use calls `report(what)`, then raises); returns
    {dotted name: (owner, attribute, object now there)} to check later."""
    sealed = {}
    for path, attr in SEALED:
        owner = _owner(path, torch)
        if owner is None or not hasattr(owner, attr):
            continue
        setattr(owner, attr, _refuse(f"{path}.{attr}", report))
        sealed[f"{path}.{attr}"] = (owner, attr, getattr(owner, attr))
    sealed.update(seal_kernel_by_key(torch, report))
    return sealed


def seal_kernel_by_key(torch, report) -> dict[str, tuple]:
    """Each OpOverload holds `_op_dk`, which calls the operator's kernel for a chosen dispatch key
    without entering Dispatcher::call. A class-level property shadows every instance's copy (and
    refuses), the copies already made are dropped, and `_get_operation_overload`, which hands new
    ones out, returns a refusing one instead."""
    import torch._ops as ops

    refused = _refuse("torch._ops.OpOverload._op_dk", report)
    ops.OpOverload._op_dk = property(lambda self: refused, lambda self, value: None)
    for ns in list(vars(torch.ops).values()):
        for packet in list(vars(ns).values()) if isinstance(ns, ops._OpNamespace) else ():
            for overload in list(vars(packet).values()) if isinstance(packet, ops.OpOverloadPacket) else ():
                if isinstance(overload, ops.OpOverload):
                    vars(overload).pop("_op_dk", None)
    original = torch._C._get_operation_overload

    def _get_operation_overload(*args, **kwargs):
        found = original(*args, **kwargs)
        if isinstance(found, tuple) and len(found) == 3:
            return found[0], refused, found[2]
        return found

    _get_operation_overload.__module__ = "torch._C"
    torch._C._get_operation_overload = _get_operation_overload
    return {"torch._ops.OpOverload._op_dk": (ops.OpOverload, "_op_dk", vars(ops.OpOverload)["_op_dk"]),
            "torch._C._get_operation_overload": (torch._C, "_get_operation_overload", _get_operation_overload)}


def bridge_numpy(torch, note) -> dict[str, tuple]:
    """Wrap the NUMPY_BRIDGES so that each use calls `note()` first (which records NUMPY_MARK)."""
    wrapped = {}
    for path, attr in NUMPY_BRIDGES:
        owner = _owner(path, torch)
        original = getattr(owner, attr, None) if owner is not None else None
        if original is None:
            continue

        def make(fn):
            def bridge(*args, **kwargs):
                note()
                return fn(*args, **kwargs)

            bridge.__module__ = "torch"
            bridge.__name__ = bridge.__qualname__ = getattr(fn, "__name__", attr)
            return bridge

        setattr(owner, attr, make(original))
        wrapped[f"{path}.{attr}"] = (owner, attr, getattr(owner, attr))
    return wrapped


def changed(installed: dict[str, tuple]) -> list[str]:
    """Names whose object is no longer the one installed (read from the class itself, so that a
    descriptor is compared, not what it returns)."""
    def current(owner, attr):
        if isinstance(owner, type):
            for klass in owner.__mro__:
                if attr in vars(klass):
                    return vars(klass)[attr]
            return None
        return getattr(owner, attr, None)

    return sorted(name for name, (owner, attr, obj) in installed.items() if current(owner, attr) is not obj)


def new_token() -> str:
    return os.urandom(24).hex()
