"""The candidate process's guards: what it refuses once candidate code can run.

The audit hook (`_install_audit_hook`) and its rules: no new processes, network, native code the
judge did not build or install, writes outside the workspace, patches of library classes, and no
Python compiled from text the judge has not read (`_code_source_refusal`). And the candidate
module's own namespace (`_candidate_namespace`): the reference's globals KernelBench solutions
rely on, and a `getattr` that refuses what the source check cannot see (`_guarded_getattr`).

Installed by the worker (worker.py) and the sanitizer's run (memcheck_run.py) before any
candidate code loads; the order is theirs. Imports stay light: spares import this at start.
"""

from __future__ import annotations

import os
import sys


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
