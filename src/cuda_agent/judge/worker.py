"""The candidate process. Everything here is assumed compromised once candidate code runs.

It loads the candidate, answers the judge's requests and reports what it saw. The judge treats
every report as a claim: outputs are checked against references that never exist in this
process, and times are believed only when the judge's own clock agrees. The audit hook and the
guards of the candidate's namespace (guards.py) and the observer of dispatched ops (observer.py)
make honest mistakes and lazy hacks fail loudly; a determined attacker who defeats them still faces
the out-of-process checks.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import traceback
from typing import TYPE_CHECKING

from .guards import _EXPECTED_SOURCE, _JUDGE_LIBRARIES, _candidate_namespace, _install_audit_hook
from .inline_request import load_inline_request

if TYPE_CHECKING:  # the messages' types only: this module's imports stay light (spares start fast)
    from .protocol import InitRequest


def _trim_traceback(exc: BaseException, limit: int = 2500) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    # keep the candidate's frames and the error, drop the harness's
    keep = [ln for ln in lines if "cuda_agent/judge" not in ln]
    text = "".join(keep[-12:])
    return text[-limit:]


_NOTHING = object()  # `_escapes` without outputs to check


_WATCHED = ("time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns", "time.time",
            "time.process_time", "torch.cuda.synchronize", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.record",
            "torch.cuda.Event.synchronize", "torch.Tensor.cpu", "torch.Tensor.contiguous", "torch.Tensor.numpy",
            "torch.Tensor.to", "torch.Tensor.detach", "torch.frombuffer", "torch.empty",
            "torch.nn.Module.__call__", "torch.nn.Module.state_dict", "torch.nn.Module.load_state_dict")


def _resolve(name: str, torch):
    import time

    obj = {"time": time, "torch": torch}[name.split(".")[0]]
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


def _watch(torch) -> dict:
    """Identity of the library functions the harness and timing rely on."""
    return {name: _resolve(name, torch) for name in _WATCHED}


def _numeric_flags(torch) -> dict:
    flags = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
             "deterministic": torch.are_deterministic_algorithms_enabled()}
    b = torch.backends
    flags["cudnn.allow_tf32"] = bool(b.cudnn.allow_tf32)
    flags["cuda.matmul.allow_tf32"] = bool(b.cuda.matmul.allow_tf32)
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        flags[f"cuda.matmul.{name}"] = str(getattr(b.cuda.matmul, name, None))
    return flags


def _escapes(torch, out=_NOTHING, inputs=()) -> list[str]:
    """Ways candidate code would run inside the harness's own work, outside the call's clock and
    observer: a torch function or dispatch mode left on its stack (kept entered by a suspended
    generator, say) intercepts every torch call the harness makes (unpacking inputs, moving
    parameters, packing outputs); an output that is not a plain tensor, scalar or container runs
    its own methods while it is packed; and an object hung on an input or output tensor dies with
    it when the harness lets go of it (unpacking the next call's inputs), so a finaliser of its
    would run then, with the next inputs already in place."""
    found = []
    if torch._C._len_torch_function_stack():
        found.append("a torch function mode left active outside forward")
    if torch._C._len_torch_dispatch_stack():
        found.append("a torch dispatch mode left active outside forward")
    if out is not _NOTHING:
        what = _foreign_output(torch, out, 0)
        if what:
            found.append(f"forward returned {what} (its own code would run while the judge reads it)")
    for t in inputs:
        if isinstance(t, torch.Tensor) and vars(t):
            found.append("forward hung attributes on an input tensor (they outlive the call into the judge's own "
                         "work)")
            break
    return found


def _foreign_output(torch, value, depth: int) -> str | None:
    kind = type(value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return "a tensor carrying attributes of its own" if vars(value) else None
    if value is None or kind in (bool, int, float, str):
        return None
    if kind in (list, tuple, dict) and depth < 16:
        items = [x for pair in value.items() for x in pair] if kind is dict else value
        for item in items:
            found = _foreign_output(torch, item, depth + 1)
            if found:
                return found
        return None
    return f"an object of type {kind.__name__}"


def warm_dispatch(torch) -> None:
    """The first dispatch mode a process enters costs about a second (lazy imports and dispatcher
    set-up). Paid here, ahead of the task, it is not added to the first recorded call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Noop(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    # torch.empty: no compute, so no thread pool starts (the zygote forks after this).
    with _Noop():
        torch.empty(2)


def _warm_profiler(torch) -> None:
    """The first CUDA profiler session of a process initialises CUPTI, which takes seconds; a spare
    pays that while it waits, so the recorded calls of its task do not."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
    except Exception:  # only a speed-up; the recorded calls initialise it themselves otherwise
        pass


def _module_tree(model) -> list:
    """`model` and every module under it, read from the module dictionaries themselves (no
    `modules()` or `children()` that a candidate class could override)."""
    import torch

    seen: set[int] = set()
    found, stack = [], [model]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        found.append(m)
        subs = object.__getattribute__(m, "__dict__").get("_modules") or {}
        stack.extend(v for v in list(subs.values())[::-1] if isinstance(v, torch.nn.Module))
    return found


def _load_module(name: str, library: str):
    """A module from a file the judge placed (a native library it built, or the reference), marked
    as the judge's so that the audit hook lets it load."""
    _JUDGE_LIBRARIES.add(os.path.realpath(library))
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The launch observer once installed: (module, token); or why it is not (see `_install_launches`).
_LAUNCHES: tuple | None = None
_LAUNCHES_PROBLEM: str | None = "not installed"


def _install_launches(path: str | None) -> None:
    """The CUPTI launch observer (launches.py), loaded and subscribed before any candidate code;
    once per process. Where it cannot be, `_LAUNCHES_PROBLEM` says why, and the kernels of the
    checked calls are listed through PyTorch's profiler instead."""
    global _LAUNCHES, _LAUNCHES_PROBLEM
    if _LAUNCHES is not None:
        return
    from . import launches as ln
    from . import observer as obs
    from .timing import GATE_KERNEL

    if not path or not os.path.exists(path):
        _LAUNCHES_PROBLEM = "the judge gave the process no launch observer"
        return
    cupti = ln.cupti_library()
    if cupti is None:
        _LAUNCHES_PROBLEM = "no libcupti beside PyTorch's CUDA"
        return
    try:
        module = _load_module(ln.MODULE, path)
        token = obs.new_token()
        module.install(token, cupti, GATE_KERNEL)
        module.warm(token)  # CUPTI's activity machinery starts slowly the first time
        # from here to the first call's `begin`, this thread's launches are the judge's own (and the
        # candidate's __init__, which is no call); other threads' are kept for the first call
        module.take(token, True)
    except Exception as exc:
        _LAUNCHES_PROBLEM = f"the launch observer failed to start: {type(exc).__name__}: {exc}"[:300]
        return
    finally:
        _JUDGE_LIBRARIES.discard(os.path.realpath(path))  # not for the candidate to load
    _LAUNCHES, _LAUNCHES_PROBLEM = (module, token), None


class _Run:
    """What the steps of `main` share: the channel to the judge, the data plane, the judge's set-up
    message, the harness's state set up from it, and the harness's own functions and constants,
    bound before any candidate code runs (a module the candidate put in sys.modules afterwards is
    never imported by the harness)."""

    def __init__(self, torch, **bound):
        self.torch = torch
        self.__dict__.update(bound)

    def reply_error(self, category, message: str) -> None:
        self.chan.send({"ok": False, "category": category.value, "message": message, "blocked": self.blocked[:20]})


def main(sock_fd: int, data_fd: int, size: int, in_size: int) -> int:
    sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE; lazy imports must not write
    import torch
    from cuda_agent.host import is_out_of_memory, true_fp32

    from . import observer as obs
    from .protocol import MAX_KERNELS, Channel, DataPlane, ErrorCategory, receive_plane
    from .tensorio import TransportError, leaves, move_state, pack, packed_end, unpack
    from .timing import (GATE_KERNEL, CacheFlusher, CallTimer, bandwidth_probe, flushes_after_inputs,
                         largest_floating, touch_pages)

    r = _Run(torch, is_out_of_memory=is_out_of_memory, true_fp32=true_fp32, obs=obs, MAX_KERNELS=MAX_KERNELS,
             Channel=Channel, DataPlane=DataPlane, ErrorCategory=ErrorCategory, receive_plane=receive_plane,
             TransportError=TransportError, leaves=leaves, move_state=move_state, pack=pack, packed_end=packed_end,
             unpack=unpack, GATE_KERNEL=GATE_KERNEL, CacheFlusher=CacheFlusher, CallTimer=CallTimer,
             bandwidth_probe=bandwidth_probe, flushes_after_inputs=flushes_after_inputs,
             largest_floating=largest_floating, touch_pages=touch_pages)
    _connect(r, sock_fd, data_fd, size, in_size)
    _stand_in_builds(r)
    if not _set_up_harness(r):
        return 1
    if not _confine(r):
        return 1
    r.chan.send({"op": "loading"})  # from here on, a death of this process is the candidate's doing
    model_cls = _load_candidate(r)
    if model_cls is None:
        return 1
    if not _construct(r, model_cls):
        return 1
    return _serve(r)


def _connect(r: _Run, sock_fd: int, data_fd: int, size: int, in_size: int) -> None:
    """The judge's channel and data plane (a spare first warms up and waits for the plane), and the
    judge's (trusted) set-up message."""
    torch = r.torch
    sock = socket.socket(fileno=sock_fd)
    r.shared_error = None
    if data_fd < 0:
        # Started ahead of need (a spare): torch is imported and the GPU context made while the
        # judge does other work; the data plane arrives with the task, as a passed descriptor.
        if os.environ.get("CUDA_AGENT_PREINIT") == "cuda":
            torch.cuda.init()
            torch.cuda.set_device(0)
            _install_launches(os.environ.get("CUDA_AGENT_LAUNCHES"))
            if _LAUNCHES is None:
                _warm_profiler(torch)
            warm_dispatch(torch)
            from .timing import prepare_gate

            prepare_gate()  # the timing gate's kernel compiled while the spare waits
        data_fd, size, in_size = r.receive_plane(sock)
    r.size = size
    r.chan = r.Channel(sock)
    r.plane = r.DataPlane(fd=data_fd, size=size, in_size=in_size)
    r.plane.map()
    r.init: InitRequest = r.chan.recv()  # the judge's (trusted) set-up message
    r.device = r.init["device"]
    r.workdir = os.getcwd()
    r.blocked: list[str] = []


def _stand_in_builds(r: _Run) -> None:
    """Builds requested by load_inline go to the judge, which compiles in its own sandbox."""
    chan = r.chan
    import torch.utils.cpp_extension as cpp_extension

    def rpc_load_inline(*args, **kwargs):
        request = load_inline_request(*args, **kwargs)
        name = request["name"]
        chan.send(request)
        answer = chan.recv()
        if not answer.get("ok"):
            raise RuntimeError(f"Error building extension '{name}':\n{answer.get('message', '')}")
        return _load_module(name, answer["library"])

    def refuse_load(*args, **kwargs):
        raise RuntimeError("only load_inline (or a workspace) can build extensions under the judge")

    cpp_extension.load_inline = rpc_load_inline
    cpp_extension.load = refuse_load


def _set_up_harness(r: _Run) -> bool:
    """The harness's side, before any code of the task or the candidate: the GPU, the calls' region,
    the observers, the timer, the reference. False (the judge told) where it failed."""
    torch, obs, init, device, plane, blocked = r.torch, r.obs, r.init, r.device, r.plane, r.blocked
    try:
        calls = plane.view  # where per-call inputs and outputs travel
        shared = None
        staging = None  # this process's block for a copy of each call's inputs (stage_inputs)
        staging_error = None
        if device == "cuda":
            torch.cuda.init()
            torch.cuda.set_device(0)
            if init.get("gpu_plane"):
                # Mapped now, before any candidate code runs (the sandbox forbids it later).
                try:
                    from .cudaipc import SharedGpuBuffer

                    shared = SharedGpuBuffer.open(str(init["gpu_plane"]), r.size)
                    calls = shared.tensor
                except Exception as exc:  # the judge falls back to the host region
                    r.shared_error = f"{type(exc).__name__}: {exc}"
            if shared is not None and init.get("stage_inputs"):
                # The calls' inputs staged in this process's own memory (JudgeConfig.stage_inputs):
                # a kernel streams memory mapped from another process (CUDA IPC) ~20% slower than its
                # own on an H200 (timing.bandwidth_probe), which Nsight Compute's run never pays.
                try:
                    stage_bytes = min(int(init["stage_inputs"]), plane.in_size)  # one call's inputs, not the weights
                    staging = torch.empty(stage_bytes, dtype=torch.uint8, device="cuda")
                except Exception as exc:  # out of memory: the calls read the region itself
                    staging_error = f"{type(exc).__name__}: {exc}"[:300]
            if shared is None:
                plane.pin()
        r.calls, r.shared, r.staging, r.staging_error = calls, shared, staging, staging_error
        # The operator observer and the sealing of what would compute below it, before any code of
        # the task or the candidate is loaded (see observer.py). Trusted runs get them too: every
        # process pays the same cost per call, which the judge's null baseline then includes.
        observer = r.observer = _load_module(obs.MODULE, str(init["observer"]))
        _JUDGE_LIBRARIES.discard(os.path.realpath(str(init["observer"])))  # not for the candidate to load
        r.token = obs.new_token()
        observer.install(r.token)
        if device == "cuda":
            # every kernel launch observed too (launches.py), where CUPTI can be had
            _install_launches(init.get("launches"))
        # not for trusted runs: torch.library's own custom ops redispatch
        sealed = r.sealed = {} if init.get("trusted") else obs.seal(torch, blocked.append)
        if not init.get("trusted") and init.get("policy", "strict") == "strict":
            sealed.update(obs.bridge_numpy(torch, lambda: observer.mark(obs.NUMPY_MARK)))
        flusher = r.flusher = r.CacheFlusher(device, init.get("flush", True))
        # "on", "auto" (calls whose inputs exceed the L2's size) or "off" (JudgeConfig.flush_after_inputs)
        r.flush_inputs = str(init.get("flush_inputs") or "off") if device == "cuda" and flusher.buf is not None \
            else "off"
        r.touch = bool(init.get("touch_pages")) and device == "cuda"
        # The gate's release word lives in the data plane's control page, which the judge writes:
        # with the GPU region, the judge reveals a call's inputs and opens its gate itself.
        r.timer = r.CallTimer(device, control_address=plane.control_address() if shared is not None else None)
        if init.get("reference_path"):
            sys.modules["model"] = _load_module("model", init["reference_path"])
        # the same numerics as the judge's references: no TF32 (trusted baselines time fp32 work)
        r.true_fp32(torch)
        r.flags_before = _numeric_flags(torch)
        r.watched = _watch(torch)
    except BaseException as exc:  # the harness itself failed before any candidate code ran
        r.reply_error(r.ErrorCategory.JUDGE, f"worker setup failed: {_trim_traceback(exc)}")
        return False
    return True


def _confine(r: _Run) -> bool:
    """Every restriction in place before any candidate code loads (the workspace library's static
    initialisers included); a process that cannot install one runs none of it (False)."""
    init, workdir, blocked = r.init, r.workdir, r.blocked
    r.audit_hook = False
    r.confined = None
    if not init.get("trusted"):
        from .sandbox import install_seccomp, landlock_confined, missing_in_self

        r.confined = landlock_confined(workdir)  # the judge decides whether it had to be (isolation_gaps)
        missing = [] if install_seccomp() else ["seccomp filter (refused by the kernel or not x86-64)"]
        _install_audit_hook(workdir, blocked)
        r.audit_hook = True
        # No cyclic collection from here on: it would run finalisers and weak-reference callbacks of
        # the candidate's garbage at whatever allocation triggers it, the harness's own included,
        # outside any call. Reference counting still frees everything that is not in a cycle.
        import gc

        gc.disable()
        missing += missing_in_self(init.get("require") or {})
        if missing:
            # The judge checks the same from its side (before start, and the kernel's record after
            # loading) and fails the verdict as its own; this refusal only keeps candidate code
            # from running meanwhile.
            r.reply_error(r.ErrorCategory.JUDGE,
                          "isolation incomplete, no candidate code was run: " + "; ".join(missing))
            return False
    return True


def _load_candidate(r: _Run):
    """The workspace library, then the candidate's module; its class ModelNew, or None (the judge told)."""
    init, blocked, ErrorCategory = r.init, r.blocked, r.ErrorCategory
    try:
        if init.get("library"):
            sys.modules["cuda_extension"] = _load_module("cuda_extension", init["library"])
    except BaseException as exc:
        r.reply_error(ErrorCategory.LOAD, f"loading the workspace library failed:\n{_trim_traceback(exc)}")
        return None
    try:
        path = init["candidate_path"]
        spec = importlib.util.spec_from_file_location("model_new", path)
        # kept for the process's life (as every object candidate code made): none dies between steps
        module = r.module = importlib.util.module_from_spec(spec)
        if not init.get("trusted"):
            _candidate_namespace(module, sys.modules.get("model"), blocked, init.get("policy", "strict"))
        sys.modules["model_new"] = module
        # Compiled here from the bytes read once, which the audit hook lets through exactly once:
        # no other candidate source is ever compiled in this process (_code_source_refusal).
        with open(path, "rb") as fh:
            source = fh.read()
        _EXPECTED_SOURCE[:] = [(os.path.realpath(path), source)]
        code = compile(source, path, "exec", dont_inherit=True)
        _EXPECTED_SOURCE.clear()
        exec(code, module.__dict__)
    except BaseException as exc:
        r.reply_error(ErrorCategory.LOAD, f"importing the candidate failed:\n{_trim_traceback(exc)}")
        return None
    model_cls = module.__dict__.get("ModelNew")
    if not isinstance(model_cls, type):
        r.reply_error(ErrorCategory.LOAD, "the candidate defines no class ModelNew")
        return None
    return model_cls


def _construct(r: _Run, model_cls) -> bool:
    """ModelNew constructed and given Model's parameters, and the judge told what matched (or, False,
    why it failed)."""
    torch, obs, init, device, plane, blocked = r.torch, r.obs, r.init, r.device, r.plane, r.blocked
    observer, token, unpack = r.observer, r.token, r.unpack
    try:
        init_args = unpack(init["init_args"], plane.view, 0, plane.in_size)
        state = unpack(init["state"], plane.view, 0, plane.in_size)
        state = r.state = dict(zip(init["state_names"], state))
        torch.manual_seed(init["init_seed"])
        observer.take(token)  # what the judge's own unpacking ran
        model = model_cls(*init_args)
        # __init__ is held to forward's rules for what it reaches: the observer must still be on
        # when it returns (a RecordFunction switch found by address and flipped for a while shows
        # here as for a call), and NumPy is as foreign to it as to forward (strict policy)
        observer.sentinel()
        init_ops = observer.take(token)
        if observer.SENTINEL not in init_ops:
            blocked.append("the operator observer was switched off during ModelNew() (its sentinel went unrecorded)")
            raise RuntimeError(blocked[-1])
        if obs.NUMPY_MARK in init_ops:
            blocked.append("NumPy reached during ModelNew() (tensor memory handed to NumPy or back; strict policy)")
            raise RuntimeError(blocked[-1])
        if not isinstance(model, torch.nn.Module):
            raise TypeError("ModelNew is not a torch.nn.Module")
        own = r.own = model.state_dict()
        matched, unmatched = [], []
        with torch.no_grad():
            for key, value in own.items():
                ref = state.get(key)
                if ref is not None and tuple(ref.shape) == tuple(value.shape) and value.dtype == ref.dtype:
                    value.copy_(ref)
                    matched.append(key)
                else:
                    unmatched.append(key)
        model = r.model = model.to(device)
        # the copied tensors as they are now (on the device), for the precision probe to move: kept
        # here, so that no candidate code (a state_dict of its own) runs between calls
        r.live = {key: value for key, value in model.state_dict().items() if key in matched}
        # each module's training flag as constructed: a stochastic task's training-mode calls put
        # these back after its eval-mode ones (the "mode" request)
        r.modes = [(vars_, vars_.get("training", True))
                   for vars_ in (object.__getattribute__(m, "__dict__") for m in _module_tree(model))]
        if device == "cuda":
            torch.cuda.synchronize()
    except BaseException as exc:
        r.reply_error(r.ErrorCategory.INIT, f"constructing ModelNew failed:\n{_trim_traceback(exc)}")
        return False
    r.chan.send({"ok": True, "matched": matched, "unmatched": unmatched[:50], "blocked": blocked[:20],
                 "gpu_plane": r.shared is not None, "gpu_plane_error": r.shared_error, "audit_hook": r.audit_hook,
                 "staged_inputs": r.staging is not None, "staging_error": r.staging_error,
                 "landlock": r.confined, "launch_observer": _LAUNCHES_PROBLEM if device == "cuda" else None,
                 "timing_gate": r.timer.gate_problem, "judge_release": r.timer.can_hold()})
    return True


def _serve(r: _Run) -> int:
    """The judge's requests, until it says `exit`: the calls (`_call`) and what it asks between them."""
    torch, init, device, blocked, chan = r.torch, r.init, r.device, r.blocked, r.chan
    ErrorCategory, TransportError, packed_end = r.ErrorCategory, r.TransportError, r.packed_end
    staging, calls, flusher, shared = r.staging, r.calls, r.flusher, r.shared
    poison_bytes = int(init.get("poison_bytes", 0))
    r.inputs = []
    # The last call's inputs, kept until the next call's clock and observer run: whatever dies with
    # them (a weak reference's callback, a finaliser) then runs inside that call, not before it,
    # when the next inputs are already in place.
    r.held = []
    r.poisoned = None  # with `touch`: the poisoned block, held until its pages are touched
    while True:
        msg = chan.recv()
        op = msg.get("op")
        if op == "exit":
            return 0
        escaped = _escapes(torch)
        if escaped:  # before any of the harness's own torch calls of this request
            blocked.extend(escaped)
            r.reply_error(ErrorCategory.RUNTIME, escaped[0])
            return 1
        if op == "prepare":
            # Untimed: cold caches, and allocator blocks full of NaN bytes so unwritten outputs show.
            # The inputs are not known yet, so no work can be done ahead of the timed request.
            if poison_bytes:  # freed at once (or after its pages are touched): the block returns to the
                # allocator's cache, where the call's outputs are allocated
                r.poisoned = torch.full((poison_bytes,), 0xFF, dtype=torch.uint8, device=device)
                if not r.touch:
                    r.poisoned = None
            flusher.flush()
            chan.send({"ok": True})
            continue
        if op == "stage":
            # Untimed, once the judge has written a call's inputs into the region: copied into this
            # process's own memory, where the call (`staged`) then reads them.
            try:
                if staging is None:
                    raise TransportError("no staging block (the judge was told so at init)")
                used = packed_end(msg["inputs"])
                if not 0 <= used <= staging.numel():
                    raise TransportError("inputs larger than the staging block")
                if used:
                    staging[:used].copy_(calls[:used])
                    torch.cuda.synchronize()
                chan.send({"ok": True, "op": "staged"})
            except BaseException as exc:
                r.reply_error(ErrorCategory.RUNTIME, f"staging the inputs failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op in ("perturb", "restore"):
            # The precision probe (harness): the parameters and buffers copied from Model moved as the
            # judge moves the reference's (signs from the seed and the key's position in Model's
            # state), or put back.
            try:
                seed = int(msg["seed"]) if op == "perturb" else None
                # in Model's order, as the judge moves the reference: the same signs
                r.move_state(r.live, r.state, list(init["state_names"]), seed, float(msg.get("delta") or 0.0))
                if device == "cuda":
                    torch.cuda.synchronize()
                chan.send({"ok": True})
            except BaseException as exc:
                r.reply_error(ErrorCategory.RUNTIME, f"moving the parameters failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "mode":
            # A stochastic task (harness, stochastic.py): eval mode for the calls checked exactly with
            # the random part off, the modes as constructed for the training-mode calls. The flags
            # are written into the modules' own dictionaries, so that no candidate code runs (no
            # train()/eval() or __setattr__ of its own): this is between calls.
            try:
                training = bool(msg["training"])
                for vars_, flag in r.modes:
                    vars_["training"] = flag if training else False
                chan.send({"ok": True})
            except BaseException as exc:
                r.reply_error(ErrorCategory.RUNTIME, f"setting the mode failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "echo":
            # after the call's clock stopped: the inputs as forward left them, for the judge to compare
            try:
                chan.send({"ok": True, "echo": r.pack(r.inputs, calls, 0, r.plane.in_size)})
            except BaseException as exc:
                r.reply_error(ErrorCategory.RUNTIME, f"reading back the inputs failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "bandwidth" and device == "cuda":
            # a diagnostic the judge asks for after the calls (timing.bandwidth_probe)
            try:
                big = r.largest_floating(r.leaves(r.inputs))
                ms = {}
                if big is not None and flusher.buf is not None and shared is not None:
                    # the region itself (the inputs may be this process's staged copy)
                    n = big.numel() * big.element_size() // 4 * 4
                    ms = r.bandwidth_probe(calls[:n].view(torch.float32), flusher)
                chan.send({"ok": True, "op": "bandwidth", "ms": ms})
            except BaseException as exc:
                chan.send({"ok": False, "op": "bandwidth", "message": _trim_traceback(exc)[:500]})
            continue
        if op != "call":
            continue
        try:
            _call(r, msg)
        except BaseException as exc:
            category = ErrorCategory.OOM if r.is_out_of_memory(exc) else ErrorCategory.RUNTIME
            r.reply_error(category, f"forward failed:\n{_trim_traceback(exc)}")
            return 1
        if r.escaped:  # nothing more of the harness ran: no profiler, no packing
            return 1


def _call(r: _Run, msg: dict) -> None:
    """One call of forward: its inputs unpacked, forward run on the clock and under the observers,
    and the judge told what it returned, took and ran. Sets `r.escaped` (the judge told) where
    candidate code would run on inside the harness's own work."""
    torch, device, blocked, chan, plane, calls = r.torch, r.device, r.blocked, r.chan, r.plane, r.calls
    staging, flusher, shared, timer, observer, token = r.staging, r.flusher, r.shared, r.timer, r.observer, r.token
    obs, leaves, pack, packed_end, MAX_KERNELS, GATE_KERNEL = r.obs, r.leaves, r.pack, r.packed_end, r.MAX_KERNELS, \
        r.GATE_KERNEL
    r.escaped = False
    # Views of the judge's memory (the GPU region, or on the CPU the host plane), so any
    # write to them shows there; only CUDA over the host plane needs the echo. Staged
    # (stage_inputs), views of this process's copy, written back after the clock.
    r.held.append(r.inputs)
    release = msg.get("release") if device == "cuda" else None
    release = int(release) if isinstance(release, int) and not isinstance(release, bool) else None
    staged = staging is not None and release is None and msg.get("staged") is True
    inputs = r.inputs = r.unpack(msg["inputs"], staging if staged else calls, 0,
                                 staging.numel() if staged else plane.in_size, device, share=device == "cpu")
    staged_bytes = packed_end(msg["inputs"]) if staged else 0
    if release is None and r.flushes_after_inputs(r.flush_inputs, leaves(inputs), flusher.l2_bytes):
        # `prepare` flushed before the inputs were written: their last lines sit dirty in the
        # L2. Flushed again (before the observer's take, so its ops are not the candidate's).
        flusher.flush()
    if r.touch and release is None:
        # The pages the call will stream (its inputs, and the block its outputs will take),
        # after the judge's own work between calls; still before the observer's take.
        r.touch_pages(leaves(inputs) + ([r.poisoned] if r.poisoned is not None else []))
    r.poisoned = None
    # Every call is observed the same way: the operators it ran (observer.cpp) and, on
    # CUDA, the kernels it launched (launches.cpp); the checked calls also take CUDA's
    # activity records (the kernels that ran, and their device time). Without the launch
    # observer, PyTorch's profiler lists the checked calls' kernels.
    r.prof = prof = None  # the last call's profiler, kept until here
    launches, ltoken = _LAUNCHES if _LAUNCHES is not None else (None, None)
    recording = device == "cuda" and bool(msg.get("kernels", True))
    if launches is not None:
        # What this thread launched since the last call (the judge's own unpacking, flushing
        # and touching) was left out; what other threads launched meanwhile (a team the
        # candidate left running) is kept and counts as this call's.
        launches.begin(ltoken)
        if recording:
            launches.activity_start(ltoken)
    elif recording:
        from torch.profiler import ProfilerActivity, profile

        prof = r.prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
    observer.take(token)  # what the judge's own unpacking ran
    # `release`: the judge writes this call's inputs and opens its gate only once forward
    # has enqueued its work ("enqueued"), so its own clock of the call starts there and
    # excludes the host's enqueueing, as the gated time does. Without a gate to hold the
    # work, the process waits for the release before it runs forward at all.
    told = False
    if release is not None and not timer.can_hold():
        chan.send({"ok": True, "op": "enqueued", "early": False})
        timer.wait_release(release)
        told = True
    with torch.no_grad():
        timer.start(release if not told else None)
        gated = timer.gate is not None  # the gate kernel launched: the launch observer must have seen it
        if release is not None and not told and not timer.can_hold():
            # the gate failed to launch: the inputs come with the release, so wait for it
            chan.send({"ok": True, "op": "enqueued", "early": False})
            timer.wait_release(release)
            told = True
            timer.start()
        r.held.clear()  # the last call's inputs and outputs die here, inside this call
        r.out = r.outs = None
        out = r.model(*inputs)
        if release is not None and not told:
            chan.send({"ok": True, "op": "enqueued", "early": timer.enqueued()})
        inside_ms = timer.stop()
    escaped = _escapes(torch, out, leaves(inputs))
    if escaped:  # nothing more of the harness runs: no profiler, no packing
        blocked.extend(escaped)
        r.reply_error(r.ErrorCategory.RUNTIME, escaped[0])
        r.escaped = True
        return
    observer.sentinel()
    ops = observer.take(token)
    # before the outputs are copied out: those kernels are the judge's
    if prof is not None:
        prof.__exit__(None, None, None)
    launched = owners = None
    unobserved = [] if observer.SENTINEL in ops else ["the operator observer (its sentinel went unrecorded)"]
    if launches is not None:
        if recording:
            launches.activity_stop(ltoken)
        owned = launches.take_owned(ltoken, True)  # and the judge's own work again, until the next begin
        launched = [name for name, _ in owned]
        owners = {name: chains[:8] for name, chains in owned[:MAX_KERNELS + 1] if name != GATE_KERNEL}
        unobserved += [f"the launch observer ({name} no longer traced)" for name in launches.disabled(ltoken)[:3]]
        if gated and GATE_KERNEL not in launched:
            unobserved.append("the launch observer (the gate's launch went unrecorded)")
        launched = [k for k in launched if k != GATE_KERNEL]
    ops = [o for o in ops if o != observer.SENTINEL]
    structure = "tensor" if isinstance(out, torch.Tensor) else type(out).__name__
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else [out]
    r.out, r.outs = out, outs  # held until the next call's clock runs (as its inputs are)
    meta = pack(outs, calls, plane.out_offset, plane.out_size)
    if shared is not None:
        torch.cuda.synchronize()  # the outputs are in the judge's memory before it hears of them
    flags_after = _numeric_flags(torch)
    changed = sorted(k for k in r.flags_before if r.flags_before[k] != flags_after[k])
    tampered = sorted(k for k, fn in r.watched.items() if _resolve(k, torch) is not fn)
    tampered += obs.changed(r.sealed) + unobserved
    chan.send({"ok": True, "inside_ms": inside_ms, "stream_ms": timer.last_stream_ms, "timing": timer.method,
               "lag_ms": timer.last_lag_ms, "run_delay_ms": timer.last_run_delay_ms,
               "structure": structure, "outputs": meta,
               "tampered": tampered, "ops": ops[:4096], "flags_changed": changed,
               "launched": launched[:MAX_KERNELS + 1] if launched is not None else None,
               "owners": owners,
               "blocked": blocked[:20]})
    if staged:
        # after the clock: the inputs as forward left them, back where the judge reads them
        if staged_bytes:
            calls[:staged_bytes].copy_(staging[:staged_bytes])
            torch.cuda.synchronize()
        chan.send({"ok": True, "op": "inputs_back"})
    _send_kernels(r, launches, ltoken, recording, prof)


def _send_kernels(r: _Run, launches, ltoken, recording: bool, prof) -> None:
    """The kernels the call ran, sent after its reply, once the judge's clock of the call has stopped."""
    if launches is not None and recording:
        # read after the reply, once the judge's clock of the call has stopped
        kernels, kernel_ms = launches.activity_take(ltoken)  # the gate left out (its `skip`)
        r.chan.send({"ok": True, "op": "kernels", "kernels": kernels[:r.MAX_KERNELS + 1],
                     "kernel_ms": kernel_ms if kernel_ms >= 0 else None})
    elif prof is not None:
        # Listing the profiler's events takes time that grows with the kernels launched: it
        # is sent after the reply, once the judge's clock of the call has stopped.
        events = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
        kernels = sorted({e.name for e in events})
        # The device time of the call's kernels and copies as CUDA's activity records give
        # it (what Nsight Compute reads), the gate's spin left out: set beside the gated
        # time it says whether a slow call was slow inside its kernels or between them.
        try:
            kernel_ms = sum(e.time_range.elapsed_us() for e in events if e.name != r.GATE_KERNEL) / 1e3
        except Exception:  # a profiler without time ranges: only the diagnostic is missing
            kernel_ms = None
        r.chan.send({"ok": True, "op": "kernels", "kernels": kernels[:512], "kernel_ms": kernel_ms})


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:5])))
