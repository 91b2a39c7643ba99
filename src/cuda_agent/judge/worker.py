"""The candidate process. Everything here is assumed compromised once candidate code runs.

It loads the candidate, answers the judge's requests and reports what it saw. The judge treats
every report as a claim: outputs are checked against references that never exist in this
process, and times are believed only when the judge's own clock agrees. The audit hook and the
observer of dispatched ops (observer.py) make honest mistakes and lazy hacks fail loudly; a determined
attacker who defeats them still faces the out-of-process checks.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the messages' types only: this module's imports stay light (spares start fast)
    from .protocol import BuildRequest, InitRequest


def _trim_traceback(exc: BaseException, limit: int = 2500) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    # keep the candidate's frames and the error, drop the harness's
    keep = [ln for ln in lines if "cuda_agent/judge" not in ln]
    text = "".join(keep[-12:])
    return text[-limit:]


def load_inline_request(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                        extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                        build_directory=None, verbose=False, with_cuda=None, is_python_module=True,
                        with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False, **_) -> BuildRequest:
    """The build request the judge receives for a `load_inline` call (the stand-in's signature is
    load_inline's). Compile workers bind statically read arguments to it too
    (cuda_agent.judge.buildplan), so both paths hand the judge the same request."""
    if extra_include_paths:
        raise RuntimeError("extra_include_paths is not supported by the judge")
    return {"op": "build", "name": name, "cpp_sources": cpp_sources, "cuda_sources": cuda_sources,
            "functions": functions, "cflags": extra_cflags, "cuda_cflags": extra_cuda_cflags,
            "ldflags": extra_ldflags, "with_cuda": with_cuda,
            "with_pytorch_error_handling": with_pytorch_error_handling}


class _Blocked(PermissionError):
    pass


# Native libraries the worker itself loaded for the judge (the observer, the libraries the judge
# built and placed in the workspace). Candidate code may import these again; any other native
# module must come from the Python/torch installation, never from a folder the candidate can write.
_JUDGE_LIBRARIES: set[str] = set()


def _native_allowed(filename: str, workdir_root: str) -> bool:
    real = os.path.realpath(filename)
    return real in _JUDGE_LIBRARIES or _installed(real, workdir_root)


def _installed(real: str, workdir_root: str) -> bool:
    """Whether a resolved path lies in the Python/torch installation (never in the workspace)."""
    if real == workdir_root or real.startswith(workdir_root + os.sep):
        return False
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    roots |= _INSTALL_PATHS
    return any(real.startswith(r + os.sep) for r in roots)


# The one compile of candidate source the audit hook lets through: (resolved path, exact bytes),
# set by the worker just before it compiles the module the judge checked, and consumed by it.
_EXPECTED_SOURCE: list[tuple[str, bytes]] = []


def _same_as_file(data, path: str, skip: int = 0) -> bool:
    """Whether `data` (bytes or text) is exactly what the file at `path` holds after `skip` bytes."""
    try:
        with open(path, "rb") as fh:
            held = fh.read()[skip:]
    except OSError:
        return False
    if isinstance(data, str):
        try:
            return data == held.decode("utf-8")
        except UnicodeDecodeError:
            return False
    try:
        return bytes(data) == held
    except TypeError:
        return False


def _is_importlib(code) -> bool:
    name = code.co_filename
    return name.startswith("<frozen importlib.") or name.endswith(
        (os.path.join("importlib", "_bootstrap.py"), os.path.join("importlib", "_bootstrap_external.py")))


def _in_library_import(frame, root: str) -> bool:
    """Whether a compile comes from an installed module's own top level while importlib imports it
    (mpmath, sympy and others generate functions as they load): every frame from the caller up
    to that module's top level is code of the installation, so no candidate function (and no
    string a candidate passed) stands between."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name or name.startswith("<") or not _installed(os.path.realpath(name), root):
            return False
        if frame.f_code.co_name == "<module>":
            return frame.f_back is not None and _is_importlib(frame.f_back.f_code)
        frame = frame.f_back
    return False


# Names no method a dataclass or namedtuple generates uses, short of a field so named; one in
# generated text means a field name carried code into it.
_SMUGGLED = {"__import__", "exec", "eval", "compile", "getattr", "setattr", "delattr", "globals", "locals",
             "vars", "breakpoint", "__builtins__"}


def _smuggles(source) -> bool:
    """Whether generated source imports something or names a way out of the policy."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, TypeError):
        return True
    return any(isinstance(n, (ast.Import, ast.ImportFrom)) or (isinstance(n, ast.Name) and n.id in _SMUGGLED)
               for n in ast.walk(tree))


def _code_source_refusal(event: str, args: tuple, caller, root: str, makers: dict) -> str | None:
    """Why new code may not come into being here, or None where it may.

    Once candidate code can run, the only Python that may be compiled is code the judge has read:
    the candidate's module (once, the bytes it checked) and the installation's own files (lazy
    imports, from source or from their bytecode caches, byte for byte as on disk). Everything else
    (a string handed to a library that compiles it, such as torch.package's importer or a custom
    importlib loader) is code no policy check has seen, so it is refused, except where no candidate
    chooses the text: an installed module generating code at its own top level while it is
    imported, `ast.parse` (an AST only; compiling the AST is checked again), and the generators of
    dataclass and namedtuple methods, whose text is made of identifiers (the source check refuses
    `__annotations__`, the one way to give them others, and the text is read for smuggled names)."""
    if event == "code.__new__":
        return "building code objects by hand"
    if event == "compile":
        source, filename = (args + (None, None))[:2]
        name = os.fsdecode(filename) if isinstance(filename, (str, bytes)) else ""
        real = os.path.realpath(name) if name and not name.startswith("<") else ""
        if _EXPECTED_SOURCE and (real, source) == _EXPECTED_SOURCE[0]:
            _EXPECTED_SOURCE.clear()
            return None
        if real and _installed(real, root) and _same_as_file(source, real):
            return None
        if _in_library_import(caller, root):
            return None
        if caller is not None and caller.f_code in makers:
            if makers[caller.f_code] == "parse" or not _smuggles(source):
                return None
            return "generated code that imports or reaches the interpreter"
        return f"compiling code the judge did not check ({name[:80] or type(source).__name__})"
    # marshal.loads / marshal.load: importlib reading a bytecode cache of the installation
    code = caller.f_code if caller is not None else None
    if code is not None and code.co_name == "_compile_bytecode" and _is_importlib(code):
        path = caller.f_locals.get("bytecode_path")
        real = os.path.realpath(path) if isinstance(path, str) else ""
        if real and _installed(real, root) and args and _same_as_file(args[0], real, skip=16):
            return None
    return "loading marshalled code"


# Import paths of the installation (user site, PYTHONPATH), taken before candidate code runs.
_INSTALL_PATHS: set[str] = set()


def _install_audit_hook(workdir: str, blocked: list[str]) -> None:
    deny = {
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
        "pty.spawn", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.string_at",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
        "sys.settrace", "sys.setprofile", "pickle.find_class", "urllib.Request",
        "http.client.connect", "os.kill", "os.killpg", "signal.pthread_kill", "sys.addaudithook",
        "os.setuid", "os.chroot", "resource.setrlimit", "syslog.openlog", "webbrowser.open",
    }
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
                   "os.symlink", "os.link", "shutil.rmtree", "shutil.move", "os.mkdir", "os.utime"}
    root = os.path.realpath(workdir)
    _INSTALL_PATHS.update(os.path.realpath(p) for p in sys.path if os.path.isabs(p) and os.path.isdir(p)
                          and not (os.path.realpath(p) + os.sep).startswith(root + os.sep))
    import ast
    import collections
    import dataclasses

    # the code generators whose compiles are let through (see _code_source_refusal); compared by
    # code object, which rebinding a module attribute cannot forge
    makers = {ast.parse.__code__: "parse", dataclasses._create_fn.__code__: "generate",
              collections.namedtuple.__code__: "generate"}
    code_events = {"compile", "code.__new__", "marshal.loads", "marshal.load"}

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in deny:
            blocked.append(event)
            raise _Blocked(f"{event} is not allowed in the judge's sandbox")
        if event in code_events:
            why = _code_source_refusal(event, args, sys._getframe(1), root, makers)
            if why is not None:
                blocked.append(why)
                raise _Blocked(f"{why} is not allowed in the judge's sandbox")
            return
        if event == "import" and len(args) > 1 and isinstance(args[1], str) \
                and not args[1].endswith((".py", ".pyc")) and not _native_allowed(args[1], root):
            # an extension module (native code) the judge did not build or install
            blocked.append(f"native module {args[1]!r}")
            raise _Blocked(f"loading native code from {args[1]!r} is not allowed (only what the judge built)")
        if event == "open":
            path, mode = args[0], args[1] if len(args) > 1 else "r"
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if isinstance(mode, int):
                writing = bool(mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if writing and not isinstance(path, int) and not inside(path):
                blocked.append(f"open-for-write {path!r}")
                raise _Blocked(f"writing {path!r} is not allowed (only the workspace is writable)")
        elif event in path_events:
            if not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
                blocked.append(f"{event} {args[:1]!r}")
                raise _Blocked(f"{event} outside the workspace is not allowed")
        elif event == "object.__setattr__":
            # Library code sets class attributes lazily (docstrings, cached properties); what is
            # refused is a library class method replaced by code that is not the library's own.
            target, value = args[0], args[2] if len(args) > 2 else None
            module = getattr(target, "__module__", "") if isinstance(target, type) else ""
            origin = getattr(value, "__module__", None) or ""
            if (isinstance(module, str) and module.startswith(("torch", "cuda_agent", "builtins"))
                    and callable(value) and not (isinstance(origin, str) and origin.startswith(("torch", "cuda_agent")))):
                blocked.append(f"patching {getattr(target, '__name__', '?')}.{args[1]}")
                raise _Blocked("patching library classes is not allowed")

    sys.addaudithook(hook)


_NOTHING = object()  # `_escapes` without outputs to check

# Names every module gets from the import system; the candidate keeps its own.
_MODULE_OWN = {"__name__", "__file__", "__spec__", "__loader__", "__package__", "__builtins__", "__cached__",
               "__doc__", "__path__"}
_FRAME_ATTRS = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "cr_frame", "ag_frame",
                "tb_frame", "tb_next", "gi_code", "cr_code"}


def _guarded_getattr(blocked: list[str], policy: str = "strict"):
    """getattr for candidate modules, whatever string built the name and however the function is
    passed around (`g = getattr`, `map(getattr, ...)`): the source check only sees literal names
    in direct calls. Refused: special names (`__globals__`, `__subclasses__`), frames, private
    names of modules and classes (`torch._C`, a library's `_utils`), and modules the policy does
    not let the candidate import (`torch.storage.np`: NumPy)."""
    import types

    from .policy import ALLOWED_PRIVATE, allowed_imports

    allowed = allowed_imports(policy)
    real = getattr

    def refuse(name: str):
        blocked.append(f"getattr(..., {name[:60]!r})")
        raise _Blocked(f"getattr of {name[:60]!r} is not allowed in the judge's sandbox")

    def getattr_(obj, name, *default):
        if isinstance(name, str):
            if (name.startswith("__") and name.endswith("__") and name not in ("__name__", "__init__")) \
                    or name in _FRAME_ATTRS:
                refuse(name)
            if name.startswith("_") and name not in ALLOWED_PRIVATE and isinstance(obj, (types.ModuleType, type)):
                refuse(name)
        found = real(obj, name, *default)
        if isinstance(found, types.ModuleType) and not _module_allowed(found.__name__, allowed):
            refuse(name)
        if isinstance(obj, type) and getattr(obj, "__module__", None) == "model_new" \
                and isinstance(found, types.FunctionType):
            refuse(name)  # a method taken from the candidate's class runs with any object as its self
        return found

    getattr_.__name__ = "getattr"
    return getattr_


def _module_allowed(name: str, allowed: set[str]) -> bool:
    """A module the candidate may hold: one it may import, or a public part of torch."""
    parts = name.split(".")
    return name in allowed or (parts[0] == "torch" and not any(p.startswith("_") for p in parts))


def _candidate_namespace(module, reference, blocked: list[str], policy: str = "strict") -> None:
    """KernelBench executes a solution in the namespace where the reference module ran, so
    published solutions use its globals (`batch_size`, helper functions) without defining them.
    The candidate module starts with those names; whatever it defines itself replaces them, and
    modules it could not import itself (a task's `import numpy as np` under the strict policy) are
    left out, with what came from them."""
    import types

    from .policy import allowed_imports

    allowed = allowed_imports(policy)
    if reference is not None:
        for name, value in vars(reference).items():
            if name in _MODULE_OWN:
                continue
            origin = value.__name__ if isinstance(value, types.ModuleType) else \
                getattr(value, "__module__", None) or type(value).__module__
            root = origin.split(".")[0] if isinstance(origin, str) else ""
            if isinstance(value, types.ModuleType) and not _module_allowed(value.__name__, allowed):
                continue
            if root not in ("torch", "builtins", "model", reference.__name__) and root not in allowed:
                continue  # NumPy's functions and the like: compute that is not torch's
            module.__dict__.setdefault(name, value)
    module.__dict__["getattr"] = _guarded_getattr(blocked, policy)


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


def main(sock_fd: int, data_fd: int, size: int, in_size: int) -> int:
    sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE; lazy imports must not write
    import torch
    from cuda_agent.host import is_out_of_memory, true_fp32

    from . import observer as obs
    from .protocol import MAX_KERNELS, Channel, DataPlane, ErrorCategory, receive_plane
    from .tensorio import TransportError, leaves, move_state, pack, packed_end, unpack
    from .timing import (GATE_KERNEL, CacheFlusher, CallTimer, bandwidth_probe, flushes_after_inputs,
                         largest_floating, touch_pages)

    sock = socket.socket(fileno=sock_fd)
    shared_error = None
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
        data_fd, size, in_size = receive_plane(sock)
    chan = Channel(sock)
    plane = DataPlane(fd=data_fd, size=size, in_size=in_size)
    plane.map()
    init: InitRequest = chan.recv()  # the judge's (trusted) set-up message
    device = init["device"]
    workdir = os.getcwd()
    blocked: list[str] = []

    def reply_error(category: ErrorCategory, message: str) -> None:
        chan.send({"ok": False, "category": category.value, "message": message, "blocked": blocked[:20]})

    # -- builds requested by load_inline go to the judge, which compiles in its own sandbox -------
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

                    shared = SharedGpuBuffer.open(str(init["gpu_plane"]), size)
                    calls = shared.tensor
                except Exception as exc:  # the judge falls back to the host region
                    shared_error = f"{type(exc).__name__}: {exc}"
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
        # The operator observer and the sealing of what would compute below it, before any code of
        # the task or the candidate is loaded (see observer.py). Trusted runs get them too: every
        # process pays the same cost per call, which the judge's null baseline then includes.
        observer = _load_module(obs.MODULE, str(init["observer"]))
        _JUDGE_LIBRARIES.discard(os.path.realpath(str(init["observer"])))  # not for the candidate to load
        token = obs.new_token()
        observer.install(token)
        if device == "cuda":
            # every kernel launch observed too (launches.py), where CUPTI can be had
            _install_launches(init.get("launches"))
        # not for trusted runs: torch.library's own custom ops redispatch
        sealed = {} if init.get("trusted") else obs.seal(torch, blocked.append)
        if not init.get("trusted") and init.get("policy", "strict") == "strict":
            sealed.update(obs.bridge_numpy(torch, lambda: observer.mark(obs.NUMPY_MARK)))
        flusher = CacheFlusher(device, init.get("flush", True))
        # "on", "auto" (calls whose inputs exceed the L2's size) or "off" (JudgeConfig.flush_after_inputs)
        flush_inputs = str(init.get("flush_inputs") or "off") if device == "cuda" and flusher.buf is not None \
            else "off"
        touch = bool(init.get("touch_pages")) and device == "cuda"
        # The gate's release word lives in the data plane's control page, which the judge writes:
        # with the GPU region, the judge reveals a call's inputs and opens its gate itself.
        timer = CallTimer(device, control_address=plane.control_address() if shared is not None else None)
        if init.get("reference_path"):
            sys.modules["model"] = _load_module("model", init["reference_path"])
        # the same numerics as the judge's references: no TF32 (trusted baselines time fp32 work)
        true_fp32(torch)
        flags_before = _numeric_flags(torch)
        watched = _watch(torch)
    except BaseException as exc:  # the harness itself failed before any candidate code ran
        reply_error(ErrorCategory.JUDGE, f"worker setup failed: {_trim_traceback(exc)}")
        return 1

    audit_hook = False
    confined = None
    if not init.get("trusted"):
        # Every restriction is in place before any candidate code loads (the workspace library's
        # static initialisers included); a process that cannot install one runs none of it.
        from .sandbox import install_seccomp, landlock_confined, missing_in_self

        confined = landlock_confined(workdir)  # the judge decides whether it had to be (isolation_gaps)
        missing = [] if install_seccomp() else ["seccomp filter (refused by the kernel or not x86-64)"]
        _install_audit_hook(workdir, blocked)
        audit_hook = True
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
            reply_error(ErrorCategory.JUDGE, "isolation incomplete, no candidate code was run: " + "; ".join(missing))
            return 1
    try:
        if init.get("library"):
            sys.modules["cuda_extension"] = _load_module("cuda_extension", init["library"])
    except BaseException as exc:
        reply_error(ErrorCategory.LOAD, f"loading the workspace library failed:\n{_trim_traceback(exc)}")
        return 1
    try:
        path = init["candidate_path"]
        spec = importlib.util.spec_from_file_location("model_new", path)
        module = importlib.util.module_from_spec(spec)
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
        reply_error(ErrorCategory.LOAD, f"importing the candidate failed:\n{_trim_traceback(exc)}")
        return 1
    model_cls = module.__dict__.get("ModelNew")
    if not isinstance(model_cls, type):
        reply_error(ErrorCategory.LOAD, "the candidate defines no class ModelNew")
        return 1
    try:
        init_args = unpack(init["init_args"], plane.view, 0, plane.in_size)
        state = unpack(init["state"], plane.view, 0, plane.in_size)
        state = dict(zip(init["state_names"], state))
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
        own = model.state_dict()
        matched, unmatched = [], []
        with torch.no_grad():
            for key, value in own.items():
                ref = state.get(key)
                if ref is not None and tuple(ref.shape) == tuple(value.shape) and value.dtype == ref.dtype:
                    value.copy_(ref)
                    matched.append(key)
                else:
                    unmatched.append(key)
        model = model.to(device)
        # the copied tensors as they are now (on the device), for the precision probe to move: kept
        # here, so that no candidate code (a state_dict of its own) runs between calls
        live = {key: value for key, value in model.state_dict().items() if key in matched}
        # each module's training flag as constructed: a stochastic task's training-mode calls put
        # these back after its eval-mode ones (the "mode" request)
        modes = [(vars_, vars_.get("training", True))
                 for vars_ in (object.__getattribute__(m, "__dict__") for m in _module_tree(model))]
        if device == "cuda":
            torch.cuda.synchronize()
    except BaseException as exc:
        reply_error(ErrorCategory.INIT, f"constructing ModelNew failed:\n{_trim_traceback(exc)}")
        return 1
    chan.send({"ok": True, "matched": matched, "unmatched": unmatched[:50], "blocked": blocked[:20],
               "gpu_plane": shared is not None, "gpu_plane_error": shared_error, "audit_hook": audit_hook,
               "staged_inputs": staging is not None, "staging_error": staging_error,
               "landlock": confined, "launch_observer": _LAUNCHES_PROBLEM if device == "cuda" else None,
               "timing_gate": timer.gate_problem, "judge_release": timer.can_hold()})

    poison_bytes = int(init.get("poison_bytes", 0))
    inputs: list = []
    # The last call's inputs, kept until the next call's clock and observer run: whatever dies with
    # them (a weak reference's callback, a finaliser) then runs inside that call, not before it,
    # when the next inputs are already in place.
    held: list = []
    poisoned = None  # with `touch`: the poisoned block, held until its pages are touched
    while True:
        msg = chan.recv()
        op = msg.get("op")
        if op == "exit":
            return 0
        escaped = _escapes(torch)
        if escaped:  # before any of the harness's own torch calls of this request
            blocked.extend(escaped)
            reply_error(ErrorCategory.RUNTIME, escaped[0])
            return 1
        if op == "prepare":
            # Untimed: cold caches, and allocator blocks full of NaN bytes so unwritten outputs show.
            # The inputs are not known yet, so no work can be done ahead of the timed request.
            if poison_bytes:  # freed at once (or after its pages are touched): the block returns to the
                # allocator's cache, where the call's outputs are allocated
                poisoned = torch.full((poison_bytes,), 0xFF, dtype=torch.uint8, device=device)
                if not touch:
                    poisoned = None
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
                reply_error(ErrorCategory.RUNTIME, f"staging the inputs failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op in ("perturb", "restore"):
            # The precision probe (harness): the parameters and buffers copied from Model moved as the
            # judge moves the reference's (signs from the seed and the key's position in Model's
            # state), or put back.
            try:
                seed = int(msg["seed"]) if op == "perturb" else None
                # in Model's order, as the judge moves the reference: the same signs
                move_state(live, state, list(init["state_names"]), seed, float(msg.get("delta") or 0.0))
                if device == "cuda":
                    torch.cuda.synchronize()
                chan.send({"ok": True})
            except BaseException as exc:
                reply_error(ErrorCategory.RUNTIME, f"moving the parameters failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "mode":
            # A stochastic task (harness, stochastic.py): eval mode for the calls checked exactly with
            # the random part off, the modes as constructed for the training-mode calls. The flags
            # are written into the modules' own dictionaries, so that no candidate code runs (no
            # train()/eval() or __setattr__ of its own): this is between calls.
            try:
                training = bool(msg["training"])
                for vars_, flag in modes:
                    vars_["training"] = flag if training else False
                chan.send({"ok": True})
            except BaseException as exc:
                reply_error(ErrorCategory.RUNTIME, f"setting the mode failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "echo":
            # after the call's clock stopped: the inputs as forward left them, for the judge to compare
            try:
                chan.send({"ok": True, "echo": pack(inputs, calls, 0, plane.in_size)})
            except BaseException as exc:
                reply_error(ErrorCategory.RUNTIME, f"reading back the inputs failed: {_trim_traceback(exc)}")
                return 1
            continue
        if op == "bandwidth" and device == "cuda":
            # a diagnostic the judge asks for after the calls (timing.bandwidth_probe)
            try:
                big = largest_floating(leaves(inputs))
                ms = {}
                if big is not None and flusher.buf is not None and shared is not None:
                    # the region itself (the inputs may be this process's staged copy)
                    n = big.numel() * big.element_size() // 4 * 4
                    ms = bandwidth_probe(calls[:n].view(torch.float32), flusher)
                chan.send({"ok": True, "op": "bandwidth", "ms": ms})
            except BaseException as exc:
                chan.send({"ok": False, "op": "bandwidth", "message": _trim_traceback(exc)[:500]})
            continue
        if op != "call":
            continue
        try:
            # Views of the judge's memory (the GPU region, or on the CPU the host plane), so any
            # write to them shows there; only CUDA over the host plane needs the echo. Staged
            # (stage_inputs), views of this process's copy, written back after the clock.
            held.append(inputs)
            release = msg.get("release") if device == "cuda" else None
            release = int(release) if isinstance(release, int) and not isinstance(release, bool) else None
            staged = staging is not None and release is None and msg.get("staged") is True
            inputs = unpack(msg["inputs"], staging if staged else calls, 0,
                            staging.numel() if staged else plane.in_size, device, share=device == "cpu")
            staged_bytes = packed_end(msg["inputs"]) if staged else 0
            if release is None and flushes_after_inputs(flush_inputs, leaves(inputs), flusher.l2_bytes):
                # `prepare` flushed before the inputs were written: their last lines sit dirty in the
                # L2. Flushed again (before the observer's take, so its ops are not the candidate's).
                flusher.flush()
            if touch and release is None:
                # The pages the call will stream (its inputs, and the block its outputs will take),
                # after the judge's own work between calls; still before the observer's take.
                touch_pages(leaves(inputs) + ([poisoned] if poisoned is not None else []))
            poisoned = None
            # Every call is observed the same way: the operators it ran (observer.cpp) and, on
            # CUDA, the kernels it launched (launches.cpp); the checked calls also take CUDA's
            # activity records (the kernels that ran, and their device time). Without the launch
            # observer, PyTorch's profiler lists the checked calls' kernels.
            prof = None
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

                prof = profile(activities=[ProfilerActivity.CUDA])
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
                held.clear()  # the last call's inputs and outputs die here, inside this call
                out = outs = None
                out = model(*inputs)
                if release is not None and not told:
                    chan.send({"ok": True, "op": "enqueued", "early": timer.enqueued()})
                inside_ms = timer.stop()
            escaped = _escapes(torch, out, leaves(inputs))
            if escaped:  # nothing more of the harness runs: no profiler, no packing
                blocked.extend(escaped)
                reply_error(ErrorCategory.RUNTIME, escaped[0])
                return 1
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
            meta = pack(outs, calls, plane.out_offset, plane.out_size)
            if shared is not None:
                torch.cuda.synchronize()  # the outputs are in the judge's memory before it hears of them
            flags_after = _numeric_flags(torch)
            changed = sorted(k for k in flags_before if flags_before[k] != flags_after[k])
            tampered = sorted(k for k, fn in watched.items() if _resolve(k, torch) is not fn)
            tampered += obs.changed(sealed) + unobserved
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
            if launches is not None and recording:
                # read after the reply, once the judge's clock of the call has stopped
                kernels, kernel_ms = launches.activity_take(ltoken)  # the gate left out (its `skip`)
                chan.send({"ok": True, "op": "kernels", "kernels": kernels[:MAX_KERNELS + 1],
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
                    kernel_ms = sum(e.time_range.elapsed_us() for e in events if e.name != GATE_KERNEL) / 1e3
                except Exception:  # a profiler without time ranges: only the diagnostic is missing
                    kernel_ms = None
                chan.send({"ok": True, "op": "kernels", "kernels": kernels[:512], "kernel_ms": kernel_ms})
        except BaseException as exc:
            category = ErrorCategory.OOM if is_out_of_memory(exc) else ErrorCategory.RUNTIME
            reply_error(category, f"forward failed:\n{_trim_traceback(exc)}")
            return 1


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:5])))
