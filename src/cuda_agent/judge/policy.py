"""What a candidate may do, checked three ways.

1. Python source (AST): imports, names and attributes a glue module never needs, and in the
   strict policy any PyTorch compute in `forward`.
2. C++/CUDA source (tokens, comments and strings removed): escape hatches (dlopen, asm, threads,
   processes, files, timers, Python C-API) and, strictly, ATen/torch compute.
3. What actually ran, reported on every call by the judge's observers: the ATen operators that
   entered the dispatcher (observer.py) and, on CUDA, the kernels launched (launches.py, CUPTI
   launch callbacks), judged by name here and by who issued them in launches.py
   (`check_kernel_owners`: PyTorch's kernels, direct or replayed from a graph, and vendor kernels
   beyond the task's allowance). Source patterns can be
   obfuscated; the few ways below the dispatcher's RecordFunction are sealed before candidate code
   loads.
4. What the compiled library imports (`check_binary`): an allow-list under the strict policy, and
   vendor libraries only for the functions and tasks they serve (`vendor_allowance`).

The strict policy is the CUDA Agent skill: `forward` may only create tensors, take views and call
the candidate's own extension; cuBLAS (GEMM) and cuDNN (convolution) may be called from C++.
"""

from __future__ import annotations

import ast
import re

from cuda_agent import pysource

from .reach import code_by_address, foreign_module_attrs, strip_cpp

# ---------------------------------------------------------------------------------------------
# Python

# Importing a module cannot tamper by itself: what the strict policy refuses is *compute* through
# it in forward (the compute rule below, and the operator observer at run time), so
# `import torch.nn.functional as F` (in most published solutions) and the pure-Python helpers are
# allowed under both policies. Only modules that compute outside torch (NumPy) or reach the
# reference (`model`) stay lenient-only.
ALLOWED_IMPORTS_STRICT = {"torch", "torch.nn", "torch.nn.functional", "torch.utils.cpp_extension", "math",
                          "typing", "__future__", "cuda_extension", "dataclasses", "functools",
                          "collections.abc", "torch.nn.init", "torch.nn.modules.utils", "torch.nn.parameter",
                          "operator", "itertools", "collections"}
ALLOWED_IMPORTS_LENIENT = ALLOWED_IMPORTS_STRICT | {"model", "numpy", "einops"}


def allowed_imports(policy: str) -> set[str]:
    """The modules a candidate may import (and, in the worker, hold) under `policy`."""
    return ALLOWED_IMPORTS_STRICT if policy == "strict" else ALLOWED_IMPORTS_LENIENT

# Builtins that run code the AST cannot see, reach the interpreter's namespaces or change objects
# by a computed name. `getattr` is not among them: it is checked where it is called (a literal
# name like any attribute; a computed one only on the candidate's own `self` under the strict
# policy), and the candidate's module gets a getattr that refuses special names at run time.
BANNED_NAMES = {"eval", "exec", "compile", "__import__", "setattr", "delattr", "globals",
                "locals", "vars", "open", "breakpoint", "memoryview", "__builtins__",
                "__loader__", "__spec__", "type", "object",
                # a class body's annotation dict written by hand gives dataclasses field names that
                # are not identifiers, and the generated __init__ then runs them as code
                "__annotations__"}
# Private helpers of torch.nn.init and torch.nn.modules.utils that published models call to
# initialise weights the way nn.Linear/nn.ConvNd do, or to normalise kernel-size arguments.
ALLOWED_PRIVATE = {"_calculate_fan_in_and_fan_out", "_calculate_correct_fan", "_no_grad_uniform_",
                   "_no_grad_normal_", "_no_grad_trunc_normal_", "_no_grad_fill_", "_no_grad_zero_",
                   "_single", "_pair", "_triple", "_quadruple", "_ntuple", "_reverse_repeat_tuple"}
FRAME_ATTRS = {"f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "cr_frame", "f_code", "f_builtins",
               "gi_code", "cr_code", "tb_next", "ag_frame",
               # inspect's ways to the caller's frame (the harness's locals are in it)
               "currentframe", "getargvalues", "getouterframes", "getinnerframes", "getframeinfo", "_getframe",
               "frame"}
MODULE_ATTRS = {"sys", "os", "gc", "inspect", "builtins", "importlib", "ctypes", "subprocess", "threading",
                "multiprocessing", "socket", "signal", "mmap", "marshal", "pickle", "shutil", "time",
                "np",
                # standard modules torch's own modules hold under their usual names: frames
                # (traceback.walk_stack, logging.currentframe), patching by dotted name
                # (unittest.mock), files, processes and callbacks at collection time (weakref)
                "traceback", "logging", "unittest", "tempfile", "zipfile", "tarfile", "glob", "pathlib",
                "linecache", "copyreg", "dis", "python_multiprocessing", "contextvars", "concurrent",
                "platform", "weakref", "pdb", "bdb", "runpy", "pkgutil", "zipimport", "faulthandler"}
# Decorators under which a method still receives its own instance as `self`
SELF_KEEPING_DECORATORS = {"property", "torch.no_grad()", "torch.inference_mode()", "torch.enable_grad()"}
# Protocols through which another library takes a tensor's memory (or an object posing as one)
# without any bridge the observer marks: defining them in a class hands NumPy or DLPack consumers
# raw addresses. Refused by definition under the strict policy, whoever would consume them.
ARRAY_PROTOCOLS = {"__array_interface__", "__array_struct__", "__array__", "__array_function__",
                   "__array_ufunc__", "__array_priority__", "__cuda_array_interface__", "__dlpack__",
                   "__dlpack_device__", "__buffer__", "__release_buffer__"}
# Methods the interpreter calls on its own schedule (an object's death, a generator dropped while
# suspended inside a `with` block), not when the candidate's forward calls them.
FINALISERS = {"__del__", "__exit__", "__aexit__"}
# PyTorch's own compilers: TorchScript (whose fusers run kernels of their own, without a dispatched
# operator once a warm-up has profiled the graph), torch.compile, torch.fx and torch.export. None
# of them is the candidate's kernel, so the strict policy refuses reaching them at all.
TORCH_COMPILERS = {"jit", "compile", "fx", "export", "_dynamo", "_inductor"}
# PEP 263: the interpreter decodes a module by its coding declaration, the checker reads it as UTF-8
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
ALLOWED_DUNDERS = {"__init__", "__name__"}
# The typing machinery evaluates string annotations as code, out of the checker's sight: these
# names are refused, and every string annotation is checked as the expression it stands for.
EVALUATING_NAMES = {"get_type_hints", "ForwardRef", "get_annotations", "evaluate_forward_ref",
                    "call_annotate_function", "annotationlib"}
TORCH_CREATION = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
                  "full", "full_like", "tensor", "device", "dtype", "float32", "float16", "bfloat16",
                  "float64", "int32", "int64", "int8", "uint8", "bool", "Size", "no_grad",
                  "inference_mode", "is_tensor", "cuda", "Tensor", "strided", "contiguous_format",
                  "channels_last"}
TENSOR_COMPUTE_METHODS = {
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "matmul", "mm", "bmm", "addmm", "baddbmm",
    "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "relu", "relu_", "softmax",
    "log_softmax", "exp", "log", "tanh", "sigmoid", "clone", "to", "float", "half", "bfloat16", "double",
    "copy_", "index_select", "gather", "scatter", "scatter_", "sort", "topk", "cumsum", "pow", "sqrt",
    "rsqrt", "abs", "neg", "cat", "stack", "norm", "var", "std", "clamp", "clamp_", "where",
    "masked_fill", "masked_fill_", "einsum", "conv2d", "conv1d", "linear", "layer_norm", "gelu", "silu",
    "prod", "all", "any", "round", "floor", "ceil", "sign", "erf", "sin", "cos", "repeat", "tile",
    "flip", "roll", "type", "type_as", "cpu", "numpy", "tolist", "item", "apply_", "map_",
}


def source_encoding(source: str) -> str | None:
    """The encoding a module's PEP 263 declaration names (first two lines), or None."""
    for line in source.splitlines()[:2]:
        m = _CODING.match(line)
        if m:
            return m[1]
    return None


def method_self_nodes(tree: ast.Module) -> set[int]:
    """ids of the `self` names that stand for a method's own instance: the first parameter of a
    method of a class the candidate defined, undecorated (or under a decorator that keeps the
    binding), never rebound, read in the method or in a function nested in it that does not bind
    a `self` of its own. A plain function's parameter named `self`, a staticmethod's, or one a
    decorator fills can be bound to any object (a library module), so `self._x` on it is the
    private attribute of whatever that is."""
    out: set[int] = set()
    keeping = transparent_decorators(tree)

    def binds_self(fn) -> bool:
        a = fn.args
        return any(x.arg == "self" for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x)

    def visit(node: ast.AST, found: list) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and binds_self(child):
                continue  # another scope with a `self` of its own
            if isinstance(child, ast.Name) and child.id == "self":
                found.append(child)
            visit(child, found)

    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.args.args and fn.args.args[0].arg == "self"):
                continue
            if any(ast.unparse(d) not in SELF_KEEPING_DECORATORS and not (isinstance(d, ast.Name) and d.id in keeping)
                   for d in fn.decorator_list):
                continue
            found: list = []
            visit(fn, found)
            if any(not isinstance(n.ctx, ast.Load) for n in found):
                continue  # rebound somewhere (`self = torch`): no longer the instance
            out.update(id(n) for n in found)
    return out


def transparent_decorators(tree: ast.Module) -> set[str]:
    """Names of the module's own decorators that hand a method its own arguments: `def d(fn)` whose
    body is one function taking only `*args` (and `**kwargs`), wrapped at most by `functools.wraps(fn)`,
    that never rebinds them and uses them only to call `fn(*args, **kwargs)` as given; then `return`
    of that function. Under such a decorator a method's `self` is still its instance (the idiom of
    published solutions: a caching or timing wrapper); any other decorator could fill `self` with
    whatever it likes."""
    names = set()
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and not fn.decorator_list and len(fn.args.args) == 1
                and not (fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs)
                and len(fn.body) == 2):
            continue
        wrapped = fn.args.args[0].arg
        inner, ret = fn.body
        if not (isinstance(inner, ast.FunctionDef) and isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name)
                and ret.value.id == inner.name):
            continue
        a = inner.args
        if a.args or a.posonlyargs or a.kwonlyargs or a.vararg is None:
            continue
        if any(ast.unparse(d) not in (f"functools.wraps({wrapped})", f"wraps({wrapped})") for d in inner.decorator_list):
            continue
        star, kw = a.vararg.arg, a.kwarg.arg if a.kwarg else None

        def clean(c) -> bool:   # fn(*args) or fn(*args, **kwargs), exactly as received
            return (isinstance(c.func, ast.Name) and c.func.id == wrapped and len(c.args) == 1
                    and isinstance(c.args[0], ast.Starred) and isinstance(c.args[0].value, ast.Name)
                    and c.args[0].value.id == star
                    and all(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kw for k in c.keywords))

        calls = [c for c in ast.walk(inner) if isinstance(c, ast.Call) and clean(c)]
        passed = {id(c.args[0].value) for c in calls} | {id(k.value) for c in calls for k in c.keywords}
        uses = [n for n in ast.walk(inner) if isinstance(n, ast.Name) and n.id in {star, kw}]
        if calls and all(id(n) in passed for n in uses):
            names.add(fn.name)
    return names


def class_methods(tree: ast.Module) -> dict[str, set[str]]:
    """{class defined in the module: its methods that take the instance as `self`}. Reached through
    the class (`ModelNew.helper(torch)`), such a method runs with any object as its `self`."""
    return {cls.name: {fn.name for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.args.args
                       and fn.args.args[0].arg == "self" and fn.name not in ALLOWED_DUNDERS}
            for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)}


def check_python(source: str, policy: str) -> list[str]:
    """Violations in a candidate module (assumes it parses; syntax errors are reported elsewhere)."""
    tree = pysource.parse(source)
    strict = policy == "strict"
    importable = allowed_imports(policy)
    out: list[str] = []

    def add(node: ast.AST, what: str) -> None:
        out.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    encoding = source_encoding(source)
    if encoding is not None and encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        out.append(f"line 1: a source encoding other than UTF-8 ('{encoding}') is not allowed: the judge checks "
                   f"the text as UTF-8, the interpreter would decode it otherwise")
    own_self = method_self_nodes(tree)
    methods_of = class_methods(tree)
    foreign = foreign_module_attrs(importable)
    direct_callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}

    def check_attr(node: ast.AST, owner: ast.AST, attr: str) -> None:
        if attr in ALLOWED_DUNDERS:
            pass
        elif attr.startswith("__") and attr.endswith("__"):
            add(node, f"access to '{attr}' is not allowed")
        elif (attr.startswith("_") and attr not in ALLOWED_PRIVATE
              and not (isinstance(owner, ast.Name) and id(owner) in own_self)):
            add(node, f"access to private attribute '{attr}' is not allowed"
                      + (" (only on a method's own self)" if isinstance(owner, ast.Name) and owner.id == "self" else ""))
        elif attr in FRAME_ATTRS:
            add(node, f"frame access '{attr}' is not allowed")
        elif attr in MODULE_ATTRS or (attr in foreign and not (isinstance(owner, ast.Name) and id(owner) in own_self)):
            add(node, f"reaching module '{attr}' through an attribute is not allowed")
        elif isinstance(owner, ast.Name) and attr in methods_of.get(owner.id, ()):
            add(node, f"'{owner.id}.{attr}' (a method taken from its class, callable with any object as self) "
                      f"is not allowed")

    for node in ast.walk(tree):
        for ann in _string_annotations(node):
            try:
                expr = pysource.parse(ann.value, mode="eval")
            except SyntaxError:
                add(ann, "a string annotation that is not an expression is not allowed")
                continue
            for found in check_python(f"_ = ({ast.unparse(expr.body)})", policy):
                add(ann, f"in a string annotation: {found.partition(': ')[2]}")
        if isinstance(node, (ast.Name, ast.Attribute, ast.alias)) and \
                (getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)) \
                in EVALUATING_NAMES:
            add(node, "evaluating annotations (typing.get_type_hints, ForwardRef) is not allowed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            # getattr(x, "name") is x.name; a computed name is refused where it could reach a
            # library object (strict), and special names are refused at run time as well.
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                check_attr(node, node.args[0], node.args[1].value)
            elif node.func.id == "getattr" and strict and not (
                    node.args and isinstance(node.args[0], ast.Name) and id(node.args[0]) in own_self):
                add(node, "getattr with a computed name on anything but a method's self is not allowed (strict policy)")
        if strict and isinstance(node, ast.Name) and node.id in ("getattr", "hasattr") and \
                id(node) not in direct_callees:
            # `g = getattr` or `map(getattr, ...)`: the computed-name rule above reads direct calls only
            add(node, f"'{node.id}' used other than in a direct call is not allowed (strict policy)")
        if strict and ((isinstance(node, ast.Attribute) and node.attr in TORCH_COMPILERS) or (
                isinstance(node, ast.ImportFrom) and any(a.name in TORCH_COMPILERS for a in node.names))):
            add(node, "TorchScript, torch.compile, torch.fx and torch.export generate kernels that are not the "
                      "candidate's (strict policy)")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in FINALISERS:
            add(node, f"defining '{node.name}' is not allowed: it runs when its object dies or its generator "
                      f"is dropped, which can be inside the judge's own work, outside the call's clock and observer")
        if strict and isinstance(node, ast.ClassDef):
            defined = {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            defined |= {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for name in sorted(defined & ARRAY_PROTOCOLS):
                add(node, f"defining '{name}' is not allowed: it hands memory to another library's compute "
                          f"(strict policy)")
        if strict and isinstance(node, ast.Name) and node.id == "self" and isinstance(node.ctx, (ast.Store, ast.Del)):
            add(node, "rebinding 'self' is not allowed (strict policy)")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in importable:
                    add(node, f"import of '{alias.name}' is not allowed")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod not in importable:
                if not (mod == "torch.utils.cpp_extension"):
                    add(node, f"import from '{'.' * node.level}{mod}' is not allowed")
            if any(a.name.startswith("_") and a.name not in ALLOWED_PRIVATE for a in node.names):
                add(node, "import of private names is not allowed")
        elif isinstance(node, (ast.Name, ast.Attribute, ast.alias)) and \
                (getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)) \
                in ("attrgetter", "methodcaller"):
            add(node, "operator.attrgetter/methodcaller (attribute names computed at run time) is not allowed")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            add(node, f"use of '{node.id}' is not allowed")
        elif isinstance(node, ast.Attribute):
            check_attr(node, node.value, node.attr)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            add(node, "try/except is not allowed (no fallbacks)")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            add(node, "global/nonlocal is not allowed")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await)):
            add(node, "async code is not allowed")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and strict:
            pass

    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    model_new = classes.get("ModelNew")
    if model_new is not None:
        for base in model_new.bases:
            text = ast.unparse(base)
            if text not in {"nn.Module", "torch.nn.Module", "Module"}:
                if strict or text in {"Model", "model.Model"}:
                    add(base, f"ModelNew must derive from nn.Module, not {text}")
    if strict:
        out += _strict_forward_checks(tree)
    return out


def _string_annotations(node: ast.AST) -> list[ast.Constant]:
    """The annotations of `node` written as strings (evaluated lazily by typing, so code)."""
    anns: list = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        anns += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None]
        anns.append(getattr(node, "returns", None))
    elif isinstance(node, ast.AnnAssign):
        anns.append(node.annotation)
    found = []
    for ann in anns:
        for sub in ast.walk(ann) if ann is not None else ():
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found.append(sub)
    return found


def _extension_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound to the candidate's own extension, and `self.<attr>` aliases of them."""
    names = {"cuda_extension"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if ast.unparse(node.value.func).rpartition(".")[2] in {"load_inline", "load"}:
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    attrs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    attrs.add(t.attr)
    return names, attrs


def _strict_forward_checks(tree: ast.Module) -> list[str]:
    out = []
    ext_names, ext_attrs = _extension_names(tree)
    # `math.sqrt(fan_in)` is Python's math, not tensor compute, where the name is never rebound
    rebound = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    python_math = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                   for a in n.names if a.name == "math"} - rebound
    tensors = _registered_tensors(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Model":
            out.append(f"line {node.lineno}: the reference Model may not be used (no fallback)")
    for fn in _compute_functions(tree):
        where = getattr(fn, "name", "a lambda")
        for op in ast.walk(fn):
            # `A @ B` is no call, yet it is a GEMM on tensors (nothing else in a glue module has
            # one). Other operators are compute where an operand is surely a tensor (a parameter or
            # buffer the module registered); on sizes and scalars they are not, and what they do on
            # input tensors the observer sees (its switch is reachable only by address, refused above)
            if isinstance(op, (ast.BinOp, ast.AugAssign)) and isinstance(op.op, ast.MatMult):
                out.append(f"line {op.lineno}: tensor compute '@' in {where} (strict policy)")
            elif isinstance(op, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
                operands = [op.left, op.right] if isinstance(op, ast.BinOp) else \
                    [op.target, op.value] if isinstance(op, ast.AugAssign) else [op.operand]
                hit = next((ast.unparse(x) for x in operands if isinstance(x, ast.Attribute)
                            and isinstance(x.value, ast.Name) and x.value.id == "self" and x.attr in tensors), None)
                if hit:
                    out.append(f"line {op.lineno}: tensor compute (an operator on '{hit}') in {where} (strict policy)")
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            name = ast.unparse(call.func)
            head, _, last = name.rpartition(".")
            root = head.split(".")
            if root[0] in ext_names or (root[0] == "self" and len(root) > 1 and root[1] in ext_attrs):
                continue  # the candidate's own extension
            if head in python_math:
                continue
            if head in {"torch", "torch.nn.functional", "F", "nn.functional", "torch.special",
                        "torch.linalg", "torch.fft"} and last not in TORCH_CREATION:
                out.append(f"line {call.lineno}: PyTorch compute '{name}' in {where} (strict policy)")
            elif head and last in TENSOR_COMPUTE_METHODS:
                out.append(f"line {call.lineno}: tensor compute '.{last}()' in {where} (strict policy)")
    return list(dict.fromkeys(out))  # a nested function is read on its own and inside its parent


def _registered_tensors(tree: ast.Module) -> set[str]:
    """Attributes of `self` that are surely tensors: assigned an `nn.Parameter(...)`, or registered
    with `register_buffer("name", ...)`/`register_parameter("name", ...)`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func) in {"nn.Parameter", "torch.nn.Parameter", "Parameter"}:
            names |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id == "self"}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in {"register_buffer", "register_parameter"} and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            names.add(node.args[0].value)
    return names


def _compute_functions(tree: ast.Module) -> list[ast.AST]:
    """The functions whose calls the strict compute check reads: every function and lambda of the
    module, wherever defined (forward may call a module-level helper), except constructors
    (`__init__` builds parameters with torch) and module-level functions used only inside them
    (weight initialisation helpers) or nowhere (a copied `get_inputs`: the judge runs the task's)."""
    inits = [fn for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
             for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name == "__init__"]
    skip = {id(n) for fn in inits for n in ast.walk(fn)}
    top = {fn.name: fn for fn in tree.body if isinstance(fn, ast.FunctionDef)}
    used_outside_init = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip}
    for name, fn in top.items():
        if name not in used_outside_init:  # never used (get_inputs copied along), or only in __init__
            skip |= {id(n) for n in ast.walk(fn)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and id(n) not in skip]


# ---------------------------------------------------------------------------------------------
# C++ / CUDA

_CPP_ALWAYS = [
    (r"\bdlopen\b|\bdlsym\b|\bdlvsym\b|\bRTLD_\w+", "dynamic loading"),
    (r"\bmprotect\b|\bmmap\b|\bmremap\b|/proc/self", "memory mapping/patching"),
    (r"\basm\b|__asm__|__asm\b", "inline assembly (use CUDA intrinsics)"),
    # Bytes placed in an executable section are machine code the compiler never wrote (a raw
    # `syscall` stub, say): no section of the candidate's choosing, by attribute or pragma.
    (r"\b_?_?section_?_?\s*\(|#\s*pragma\s+(GCC\s+)?section|\bcode_seg\b|\balloc_text\b",
     "placing code or data in a section of its own"),
    (r"\bsyscall\b|\bfork\b|\bvfork\b|\bexec[lv]p?e?\b|\bsystem\s*\(|\bpopen\b|\bposix_spawn\w*|\bkill\s*\(",
     "processes"),
    (r"std::thread|std::async|std::jthread|pthread_\w+|(?<![.>\w])\s*\bclone\s*\(|\bGOMP_\w+|\b__kmpc_\w+",
     "threads"),
    (r"\bf?open\s*\(|std::[io]?fstream|\bfreopen\b|\bunlink\b|\bremove\s*\(|\brename\s*\(|\bFILE\s*\*"
     r"|\btmpfile\w*\s*\(|\bmkstemp\w*|\bmkdtemp\b|\btempnam\b|\btmpnam\b|\bfdopen\b",
     "file access"),
    (r"\b(getenv|setenv|putenv|unsetenv)\b|\benviron\b", "environment access"),
    (r"\bcu(da)?Event\w*|\bcu(da)?Ipc\w*|\bcupti\w*|\bcudaProfiler\w*|\bnvtx\w*", "timers/profilers/IPC"),
    (r"\bcudaMallocManaged\b|\bcuMemAllocManaged\b|\bcudaDeviceReset\b|\bcudaDeviceSetLimit\b", "device-wide state"),
    (r"__attribute__\s*\(\s*\(\s*(constructor|destructor)|\binit_priority\b", "static constructors"),
    # Python reached from C++. A binding needs pybind11 only to define functions (`m.def`), while its
    # templates link the C-API that imports, gets attributes and calls (so the import table cannot
    # tell): every C-API or THP name, the pybind11 functions that reach Python objects by name
    # (even through argument-dependent lookup, a type alias or a member-function pointer), and
    # attributes of Python objects (`m.attr("np")`).
    (r"\b_?Py_?[A-Z]\w*|\w*PyObject\w*|\bTHP\w*|\b(import|getattr|hasattr|setattr|delattr|globals|eval|exec"
     r"|eval_file|reinterpret_borrow|reinterpret_steal)\b|(\.|->|::)\s*attr\b", "the Python C-API"),
    # pybind11 by name: only what declares a binding; no other name for the namespace (an alias, a
    # using-directive, a macro), since the check reads names as written
    (r"\b(?:py|pybind11)\s*::\s*(?!(?:module_|module|arg|arg_v|kw_only|pos_only|call_guard|gil_scoped_release"
     r"|gil_scoped_acquire|return_value_policy|overload_cast|const_|none|ssize_t|detail::overload_cast_impl)\b)\w+"
     r"|\bnamespace\s+\w+\s*=\s*(::\s*)?(py|pybind11)\b|\busing\s+namespace\s+(::\s*)?(py|pybind11)\b"
     r"|#\s*define\b[^\n]*\b(py|pybind11)\b", "pybind11 beyond declaring the binding"),
    (r"##", "token pasting"),
    (r"#\s*include\s*[<\"](/|\.\./)", "includes outside the workspace"),
    # <cstdio>/<stdio.h> stay allowed (printf in kernels and host code): their file functions are
    # refused by name above and in the compiled library's imports.
    (r"#\s*include\s*[<\"](dlfcn|link|elf|sys/mman|sys/syscall|unistd|thread|pthread|fstream)\.?h?[>\"]",
     "system headers for loading, processes, threads or files"),
]

_ALLOWED_QUALIFIED = re.compile(
    r"^(torch|at|c10)::("
    r"Tensor|TensorOptions|Scalar|ScalarType|Device|DeviceType|IntArrayRef|ArrayRef|optional|nullopt|"
    r"Half|BFloat16|Layout|MemoryFormat|k[A-Z]\w*|dtype|device|empty|empty_like|empty_strided|zeros|"
    r"zeros_like|ones|full|TensorAccessor|PackedTensorAccessor\w*|GenericPackedTensorAccessor|"
    r"RestrictPtrTraits|DefaultPtrTraits|cuda::getCurrentCUDAStream|cuda::getStreamFromPool|"
    r"cuda::CUDAGuard|cuda::OptionalCUDAGuard|cuda::CUDAStream|cuda::getCurrentDeviceProperties|"
    r"cuda::getCurrentCUDABlasHandle|cuda::getCurrentCUDABlasLtHandle|cuda::device_count|"
    r"cuda::current_device|cuda::getDeviceProperties|cuda::is_available|cuda::CUDACachingAllocator|"
    r"cuda::get_device_properties|"
    r"Half|detail::TensorDataContainer|ArrayRef|irange|elementSize|toString|isFloatingType|"
    r"DeviceGuard|OptionalDeviceGuard|Error|IndexError|ValueError|TypeError|str|"
    r"get_num_threads|set_num_threads|parallel_for|in_parallel_region|"
    r"Tensor::\w+|ScalarType::\w+|Device::\w+|DeviceType::\w+|MemoryFormat::\w+|"
    r"wrap_pybind_function|Layout::\w+|util::\w+|complex|SymInt|SymIntArrayRef|Stream|"
    r"cuda::CUDAStreamGuard|cuda::stream_synchronize"
    r")$")

_TENSOR_METHOD_COMPUTE = re.compile(
    r"\.(add_?|sub_?|mul_?|div_?|matmul|mm|bmm|addmm|baddbmm|sum|mean|amax|amin|argmax|argmin|relu_?|"
    r"softmax|log_softmax|exp|log|tanh|sigmoid|clone|to|copy_|index_select|gather|scatter_?|sort|topk|"
    r"cumsum|pow|sqrt|rsqrt|abs|neg|norm|var|std|clamp_?|where|masked_fill_?|einsum|conv[123]d|"
    r"linear|layer_norm|gelu|silu|prod|round|floor|ceil|erf|repeat|flip|roll|type_as|cpu|cuda|"
    r"half|float|double|bfloat16|max|min)\s*\(")


def check_cpp(source: str, where: str, policy: str) -> list[str]:
    out = []
    # includes are checked before strings are blanked; everything else after
    for pattern, what in _CPP_ALWAYS:
        text = source if "include" in pattern else strip_cpp(source)
        for m in re.finditer(pattern, text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{where}:{line}: {what} ('{m.group(0).strip()}') is not allowed")
            break
    for pos, text, what in code_by_address(source)[:3]:
        line = source.count("\n", 0, pos) + 1
        out.append(f"{where}:{line}: {what} ('{' '.join(text.split())[:60]}') is not allowed: functions are reached "
                   f"by name, never by an address computed from data")
    if policy == "strict":
        code = strip_cpp(source)
        for m in re.finditer(r"\b(?:torch|at|c10)(?:::\w+)+", code):
            name = m.group(0)
            if not _ALLOWED_QUALIFIED.match(name) and not name.startswith("c10::cuda::"):
                line = code.count("\n", 0, m.start()) + 1
                out.append(f"{where}:{line}: PyTorch compute '{name}' in C++ (strict policy)")
        for m in _TENSOR_METHOD_COMPUTE.finditer(code):
            before = code[max(0, m.start() - 40): m.start()]
            if re.search(r"(std|thrust|cub|math|fmax|fmin)\s*$", before):
                continue
            line = code.count("\n", 0, m.start()) + 1
            out.append(f"{where}:{line}: tensor compute '{m.group(0).rstrip('(')}()' in C++ (strict policy)")
    return out


# ---------------------------------------------------------------------------------------------
# What actually ran

ALLOWED_ATEN_STRICT = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "zero_", "fill_", "ones", "ones_like", "full", "full_like", "new_full", "new_ones",
    "view", "_unsafe_view", "reshape", "as_strided", "expand", "permute", "transpose", "t", "unsqueeze",
    "squeeze", "flatten", "unflatten", "select", "slice", "narrow", "detach", "alias", "contiguous",
    "lift_fresh", "split", "split_with_sizes", "chunk", "unbind", "view_as", "expand_as", "resize_",
    "set_", "_reshape_alias", "is_same_size", "sym_size", "sym_stride", "sym_numel", "size", "stride",
    "_local_scalar_dense", "record_stream", "is_nonzero", "movedim", "swapaxes", "lift", "result_type",
    "scalar_tensor", "resolve_conj", "resolve_neg",
}
_FORBIDDEN_KERNEL = re.compile(r"at::native|at_cuda_detail|\bat::|triton_|elementwise_kernel|reduce_kernel"
                               r"|vectorized_|unrolled_elementwise|cunn_|softmax_warp|CatArrayBatched")


def check_dispatched(ops: list[str], policy: str) -> list[str]:
    if policy != "strict":
        return []
    bad = sorted({op for op in ops if op.split(".")[0].removeprefix("aten::") not in ALLOWED_ATEN_STRICT})
    return [f"PyTorch ran '{op}' during forward (strict policy: only the candidate's kernels may compute)"
            for op in bad[:10]]


def check_kernels(kernels: list[str], policy: str) -> list[str]:
    if policy != "strict":
        return []
    bad = sorted({k for k in kernels if _FORBIDDEN_KERNEL.search(k)})
    return [f"a PyTorch kernel ran during forward: '{k[:160]}'" for k in bad[:5]]


# ---------------------------------------------------------------------------------------------
# What the compiled library links against
#
# Source patterns can be dodged (macros, function pointers, `using namespace`, declaring a symbol
# by hand); the dynamic symbols a library imports cannot: to call a function it did not compile
# itself, the library must name it in its import table. The judge reads that table from the
# binary the trusted compiler produced.

_DENY_ALWAYS = [
    (re.compile(r"^(fork|vfork|forkpty|clone3?|exec[lv]p?e?|execvpe|fexecve|system|popen|posix_spawnp?|daemon|"
                r"login_tty|openpty)$"), "process creation"),
    (re.compile(r"^(pthread_create|thrd_create)$|^at::(launch|intraop_launch|internal::launch\w*)$|"
                r"^c10::ThreadPool::|^at::get_thread_pool|^at::PTThreadPool|"
                # libgomp's pre-4.9 entry points start a team and return before it ends (the caller
                # ends it later with GOMP_parallel_end): a team left working after the call replied.
                # Compilers since GCC 4.9 emit GOMP_parallel, which returns once the team is done.
                r"^GOMP_parallel\w*_start$|^GOMP_parallel_end$"), "thread creation or background tasks"),
    (re.compile(r"^(dlopen|dlmopen|dlsym|dlvsym|dl_iterate_phdr|dladdr1?|mprotect|mmap(64)?|mremap|syscall|ptrace|"
                r"process_vm_readv|process_vm_writev|prctl|personality)$"), "loading, patching or raw system calls"),
    (re.compile(r"^(open(64)?|openat(64)?|creat(64)?|fopen(64)?|freopen(64)?|fdopen|unlink(at)?|rename(at2?)?|"
                r"mkdir(at)?|rmdir|truncate(64)?|symlink(at)?|link(at)?|chmod|fchmod(at)?|chown|remove|"
                r"opendir|nftw|ftw|read|pread(64)?|readv|preadv\d?|write|pwrite(64)?|writev|lseek(64)?|readlink(at)?|"
                r"tmpfile(64)?|mkstemps?(64)?|mkostemps?(64)?|mkdtemp|tmpnam(_r)?|tempnam|"
                r"fstat(at)?|stat|lstat|statx|dup[23]?|fcntl|ioctl|sendfile(64)?|splice|memfd_create)$"),
     "file or descriptor access"),
    (re.compile(r"^std::(thread::|jthread::|__future_base::|async\b|filesystem::|__cxx11::basic_filebuf|basic_filebuf|"
                r"__cxx11::basic_[io]?fstream|basic_[io]?fstream|experimental::filesystem)"),
     "threads or files through the C++ library"),
    (re.compile(r"^(socket|socketpair|connect|bind|listen|accept4?|sendto|sendmsg|getaddrinfo|gethostbyname)$"),
     "network access"),
    (re.compile(r"^(kill|killpg|tgkill|tkill|sigqueue)$"), "signalling other processes"),
    (re.compile(r"^(getenv|secure_getenv|setenv|putenv|unsetenv|clearenv)$"), "environment access"),
    (re.compile(r"^(clock_gettime|gettimeofday|clock|times|rdtsc|__rdtsc|timespec_get)$|steady_clock::now|"
                r"system_clock::now|high_resolution_clock::now"), "clocks"),
    (re.compile(r"^c10::impl::(TorchDispatchModeTLS|PythonDispatcherTLS|raw_local_dispatch_key_set|tls_\w+|"
                r"_force_tls_local_dispatch_key_set)|^c10::ThreadLocalDebugInfo|^at::ThreadLocalState|"
                r"^at::impl::(ThreadLocalPythonObjects|torch_function_mode_enabled)|^at::GradMode::|"
                r"^c10::AutogradState|^at::profiler|^torch::profiler|^c10::impl::PyInterpreter::"),
     "inspecting the dispatcher's or profiler's state"),
    (re.compile(r"^(cu(da)?Event\w*|cu(da)?Ipc\w*|cupti\w*|cudaProfiler\w*|cuProfiler\w*|nvtx\w*|"
                r"cudaDeviceReset|cudaDeviceSetLimit|cudaMallocManaged|cuMemAllocManaged|nccl\w*)$"),
     "CUDA timers, IPC, profiler or device-wide state"),
]
_ATEN_FORBIDDEN_NS = re.compile(r"^at::(native|cpu|meta|compositeexplicitautograd\w*|compositeimplicitautograd\w*|"
                                r"compositeexplicitautogradnonfunctional)::")
_ATEN_CUDA_OK = re.compile(r"^at::cuda::(getCurrentCUDAStream|getStreamFromPool|getDefaultCUDAStream|"
                           r"getCurrentCUDABlasHandle|getCurrentCUDABlasLtHandle|getCurrentDeviceProperties|"
                           r"getDeviceProperties|device_count|current_device|warp_size|CUDAStream|"
                           r"getCurrentCUDASolverDnHandle|detail::|CUDACachingAllocator|getChosenWorkspaceSize|"
                           r"getCUDABlasLtWorkspace|getCUDABlasLtWorkspaceSize|clearCublasWorkspaces)")
_VENDOR_CPU_BLAS = re.compile(r"^([sdcz]gemm_?|[sdcz]gemv_?|cblas_\w+|mkl_\w+|MKL_\w+|openblas_\w+|dnnl_\w+|"
                              r"mkldnn_\w+|[sd]gemm_batch\w*|bli_\w+)$")
_CUDA_LIBS_OK = re.compile(r"^(cublas\w*|cublasLt\w*|cudnn\w*)$")
_CUDA_LIBS_OTHER = re.compile(r"^(cufft\w*|cusparse\w*|cusolver\w*|curand\w*|nvjpeg\w*|cutensor\w*)$")


def _op_allowed(op: str) -> bool:
    return any(op == base or op.startswith(base + "_") for base in ALLOWED_ATEN_STRICT)


# What a binding may import under the strict policy: anything else is refused, however it is named.
# Grouped by why an honest binding needs it. Demangled names; for functions, the part before "(".
_ALLOW_STRICT = [re.compile(p) for p in (
    # C and C++ runtime: memory, strings for messages, exceptions, static initialisation
    r"^operator (new|delete)(\[\])?$", r"^std::", r"^__gnu_cxx::", r"^__cxa_\w+$", r"^__gxx_personality_v0$",
    r"^_Unwind_\w+$", r"^__stack_chk_fail$", r"^__dso_handle$", r"^__tls_get_addr$", r"^_GLOBAL_OFFSET_TABLE_$",
    r"^__assert_fail$", r"^abort$", r"^atexit$", r"^exit$", r"^__dynamic_cast$", r"^__libc_single_threaded$", r"^__cpu_model$",
    r"^__cpu_indicator_init$", r"^__errno_location$",
    r"^(VTT|vtable|typeinfo|typeinfo name|construction vtable) for (std::|__cxxabiv1::|__gnu_cxx::|pybind11::|"
    r"c10::(\w*Error|Warning|SymNodeImpl|intrusive_ptr_target|TensorImpl|StorageImpl|UndefinedTensorImpl)\b|"
    r"at::TensorBase\b|at::Tensor\b|torch::autograd::AutogradMeta\b)",
    r"^typeinfo( name)? for [a-z ]+( const)?\**$",  # builtin types (thrown or caught by value)
    # stdio on the streams a process starts with (opening files is refused above)
    r"^(printf|fprintf|vfprintf|fputc|fputs|puts|putchar|fflush|fwrite|__(v?f?printf)_chk|stderr|stdout)$",
    # locks and once-flags of libstdc++'s own inline code (creating threads is refused above)
    r"^pthread_(mutex_(lock|unlock|trylock|init|destroy)|once|getspecific|setspecific|key_create|key_delete|"
    r"self|equal|cond_\w+|rwlock_\w+)$",
    r"^(memcpy|memmove|memset|memcmp|memchr|strlen|strcmp|strncmp|strcpy|strncpy|strchr|strrchr|strstr|strdup|"
    r"malloc|free|calloc|realloc|posix_memalign|aligned_alloc|snprintf|vsnprintf|sprintf|strtol|strtoll|"
    r"strtoul|strtod|strtof|qsort|bsearch|abs|labs|llabs)$",
    r"^__(memcpy|memmove|memset|snprintf|vsnprintf|sprintf|strcpy|strncpy|strcat)_chk$",
    # libm (and its vectorised and "finite" variants)
    r"^(__)?(sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|tanh|asinh|acosh|atanh|exp|exp2|exp10|expm1|log|log2|"
    r"log10|log1p|pow|sqrt|cbrt|hypot|erf|erfc|erfinv|lgamma|tgamma|floor|ceil|round|lround|llround|trunc|"
    r"rint|lrint|llrint|nearbyint|fmod|remainder|fmin|fmax|fabs|fdim|fma|frexp|ldexp|modf|copysign|nextafter|"
    r"sincos|scalbn|ilogb|logb|isnan|isinf|finite|fpclassify|signbit)(f|l)?(_finite)?$",
    r"^_ZGV\w+$",
    # OpenMP
    r"^(GOMP|omp|__kmpc|kmp)_\w+$",
    # pybind11 and the parts of the Python C-API its templates use (not running code: see _DENY_PY)
    r"^pybind11::", r"^_?Py_?[A-Za-z]\w*$", r"^THP\w+$",
    r"^torch::(PyWarningHandler|translate_exception_to_python|utils::|python::|autograd::utils::wrap|"
    r"autograd::(Variable|make_variable)|detail::)", r"^torch::autograd::THPVariable\w*",
    # tensors: accessors, options, creation (ATen calls are checked against the allowed operators),
    # TORCH_CHECK machinery, scalar types, devices, allocators and streams
    r"^at::TensorBase::", r"^at::Tensor::", r"^at::TensorOptions", r"^at::(get_num_threads|set_num_threads|"
    r"in_parallel_region|get_thread_num|init_num_threads|internal::invoke_parallel|internal::lazy_init_num_threads|"
    r"internal::GRAIN_SIZE)$", r"^at::detail::(empty_\w+|getCUDAHooks|check_size_nonnegative)$", r"^at::empty_(cpu|cuda)$",
    r"^at::(cuda::)?(getCurrentCUDAStream|getStreamFromPool|getDefaultCUDAStream)$",
    r"^c10::(detail::(torchCheck\w*|torchInternalAssertFail|check\w*|_str\w*|StringUtil\w*|maybe_wrap_dim\w*)|"
    r"Error|Error::|SymbolicShapeMeta::|impl::getGlobalPyInterpreter|throwNullDataPtrError|warnDeprecatedDataPtr|"
    r"IndexError|ValueError|TypeError|NotImplementedError|OutOfMemoryError|LinAlgError|Warning|Warning::|"
    r"WarningHandler|ThreadLocalWarningHandler|warn|WarningUtils|SymInt::|SymBool::|SymFloat::|SymNode|Scalar::|"
    r"IValue::|ivalue::|intrusive_ptr|TensorImpl::|StorageImpl::|UndefinedTensorImpl::|Storage::|DataPtr|"
    r"Device::|DeviceTypeName|toString|typeMetaToScalarType|TypeMeta|ScalarType|get_backtrace|impl::cow::|"
    r"impl::SizesAndStrides|GetCPUAllocator|GetAllocator|Allocator::|fromIntArrayRefSlow|SmallVectorBase|"
    r"memoryFormat|Layout|str|BFloat16|Half|Float8_\w+|complex|impl::ExcludeDispatchKeyGuard|"
    r"impl::IncludeDispatchKeyGuard|AutogradMetaInterface|AutogradMetaFactory|impl::GetAutogradMetaFactory|"
    r"VariableVersion|GradMode::is_enabled|InferenceMode::is_enabled|AutoGradMode|"
    r"cuda::(getCurrentCUDAStream|getStreamFromPool|getDefaultCUDAStream|CUDAStream|c10_cuda_check_implementation|"
    r"device_count|current_device|set_device|ExchangeDevice|MaybeExchangeDevice|GetDevice|SetDevice|"
    r"CUDACachingAllocator::(get|raw_alloc|raw_delete|raw_alloc_with_stream|allocator)|warning_caching_allocator|"
    r"getCurrentCUDABlasHandle|impl::))",
    r"^caffe2::(TypeMeta|detail::_typeMetaData|detail::TypeMetaData)",
    # CUDA runtime: launches, memory, streams, device queries, errors (events and IPC are denied above)
    r"^__cuda\w+$", r"^__nv\w+$", r"^__fatbinwrap\w*$",
    r"^cuda(LaunchKernel|LaunchKernelExC?|LaunchCooperativeKernel|GetLastError|PeekAtLastError|GetErrorString|"
    r"GetErrorName|Malloc|Free|MallocAsync|FreeAsync|MallocHost|FreeHost|HostAlloc|Memcpy\w*|Memset\w*|"
    r"StreamCreate\w*|StreamDestroy|StreamSynchronize|StreamQuery|StreamWaitEvent|StreamGetPriority|"
    r"DeviceGetStreamPriorityRange|DeviceSynchronize|GetDevice|SetDevice|GetDeviceCount|GetDeviceProperties\w*|"
    r"DeviceGetAttribute|FuncSetAttribute|FuncGetAttributes|FuncSetCacheConfig|FuncSetSharedMemConfig|"
    r"Occupancy\w+|PointerGetAttributes|GetSymbolAddress|GetSymbolSize|GetFuncBySymbol|MemGetInfo|"
    r"DriverGetVersion|RuntimeGetVersion|DeviceGetLimit)(_v2|_ptsz|_ptds)?$",
)]
# The Python C-API that runs code, imports modules or reaches frames: never in a binding.
_DENY_PY = re.compile(r"^(PyRun_\w+|PyImport_\w+|PyEval_(Eval\w*|GetFrame|GetGlobals|GetLocals|GetBuiltins|SetTrace|"
                      r"SetProfile|CallObject\w*)|Py_CompileString\w*|PyFrame_\w+|PySys_\w+|PyObject_(Call\w*|"
                      r"SetAttr\w*|GenericSetAttr|VectorcallMethod)|PyCFunction_Call|PyMarshal_\w+|PyCode_\w+)$")
# pybind11 itself calls these for every binding (a function call into a bound method, setting the
# module's attributes), so they are allowed; what they reach is only what the binding defines.
_PY_PYBIND = re.compile(r"^(PyObject_SetAttrString|PyObject_SetAttr|PyObject_Call|PyObject_CallObject|"
                        r"PyObject_CallFunctionObjArgs|PyObject_Vectorcall|PyObject_CallNoArgs|PyImport_AddModule|"
                        r"PyImport_ImportModule|PyEval_GetBuiltins|PyEval_SaveThread|PyEval_RestoreThread|"
                        r"PyEval_InitThreads|PyEval_AcquireThread|PyEval_ReleaseThread|PyEval_GetFrame|"
                        r"PyFrame_GetCode|PyFrame_GetBack|PyFrame_GetLineNumber|PySys_GetObject|PyCode_Addr2Line)$")

# Vendor libraries, per function and per task: cuBLAS/cuBLASLt GEMMs where the reference has a GEMM,
# cuDNN convolutions where it has a convolution (see `vendor_allowance`).
_CUBLAS_GEMM = re.compile(r"^(cublas(Create|Destroy|SetStream|GetStream|SetMathMode|GetMathMode|SetWorkspace|"
                          r"SetPointerMode|GetPointerMode|GetStatusString|GetStatusName|GetVersion|"
                          r"[SDHCZ]gemm\w*|Gemm\w*|SgemmEx|gemm\w*)(_v2|_64|_v2_64)?|cublasLt(Create|Destroy|"
                          r"Matmul\w*|GetStatusString|GetStatusName|GetVersion|Heuristic\w*))$")
_CUDNN_CONV = re.compile(r"^cudnn(Create|Destroy|SetStream|GetStream|GetErrorString|GetVersion|"
                         r"(Create|Destroy|Set|Get)(Tensor|TensorNd|Filter|FilterNd|Convolution|ConvolutionNd|"
                         r"Convolution2d)\w*Descriptor\w*|Set(Tensor|Filter|Convolution)\w+|Get(Tensor|Filter)\w+|"
                         r"Convolution\w+|FindConvolution\w+|GetConvolution\w+|AddTensor)$")
GEMM_OPS = {"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "einsum", "addmv", "mv", "dot",
            "vdot", "tensordot", "bilinear", "_trilinear", "chain_matmul", "linalg_multi_dot", "_addmm_activation",
            "_scaled_mm", "addr", "inner", "outer", "ger", "scaled_dot_product_attention", "_fused_sdp_choice",
            "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention", "lstm", "gru",
            "rnn_tanh", "rnn_relu", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell"}
CONV_OPS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
            "conv_transpose3d", "cudnn_convolution", "cudnn_convolution_transpose", "mkldnn_convolution",
            "conv_tbc", "_conv_depthwise2d", "slow_conv2d_forward", "slow_conv3d_forward", "thnn_conv2d",
            "slow_conv_transpose2d", "slow_conv_transpose3d", "_slow_conv2d_forward", "conv_depthwise3d",
            "_nnpack_spatial_convolution", "miopen_convolution"}


def _allowed(plain: str) -> bool:
    # a template function's demangled name starts with its return type ("float* at::TensorBase::data_ptr<float>")
    core = plain.rsplit(" ", 1)[-1] if " " in plain.split("<")[0] and not plain.startswith("operator ") else plain
    return any(p.search(name) for p in _ALLOW_STRICT for name in {plain, core}) or bool(_ATEN_CUDA_OK.match(plain))


def vendor_allowance(reference_ops) -> frozenset[str]:
    """The vendor libraries a task's candidates may call, from the ATen operators its reference runs:
    "gemm" (cuBLAS/cuBLASLt GEMMs) and "conv" (cuDNN convolutions)."""
    names = {str(op).split(".")[0].removeprefix("aten::") for op in reference_ops}
    allowed = set()
    if names & GEMM_OPS:
        allowed.add("gemm")
    if names & CONV_OPS:
        allowed.add("conv")
    return frozenset(allowed)


def check_binary(symbols: list[str], policy: str, device: str,
                 vendor: frozenset[str] | None = None) -> list[str]:
    """Violations in a compiled library's import table. `vendor`: the task's vendor allowance
    (`vendor_allowance`); None when no task is known (a build tool), which allows both."""
    out: list[str] = []
    vendor = frozenset({"gemm", "conv"}) if vendor is None else vendor

    def add(sym: str, what: str) -> None:
        if len(out) < 12:
            out.append(f"the compiled extension imports '{sym[:120]}' ({what})")

    for sym in symbols:
        plain = sym.split("(")[0].strip()
        for pattern, what in _DENY_ALWAYS:
            if pattern.search(plain):
                add(sym, what)
                break
        else:
            if policy != "strict":
                continue
            m = re.match(r"^at::_ops::(\w+)::(call|redispatch)$", plain)
            if m and not _op_allowed(m.group(1)):
                add(sym, "PyTorch compute; strict policy")
            elif re.match(r"^c10::(Dispatcher|OperatorHandle|TypedOperatorHandle|impl::OperatorEntry|KernelFunction)"
                          r"|^torch::jit::|^at::_ops::\w+::redispatch", plain):
                add(sym, "calling PyTorch operators through the dispatcher by name; strict policy")
            elif _ATEN_FORBIDDEN_NS.match(plain):
                add(sym, "a PyTorch kernel called directly; strict policy")
            elif plain.startswith("at::cuda::") and not _ATEN_CUDA_OK.match(plain):
                add(sym, "a PyTorch CUDA kernel called directly; strict policy")
            elif _VENDOR_CPU_BLAS.match(plain):
                add(sym, "a vendor BLAS/DNN library; strict policy allows cuBLAS and cuDNN on CUDA only")
            elif _CUDA_LIBS_OTHER.match(plain) or (device != "cuda" and _CUDA_LIBS_OK.match(plain)):
                add(sym, "a library outside the policy (cuBLAS for GEMM and cuDNN for convolution only)")
            elif plain.startswith("cublas"):
                if not ("gemm" in vendor and _CUBLAS_GEMM.match(plain)):
                    add(sym, "cuBLAS is allowed for GEMMs only, in tasks whose reference has a GEMM"
                             + ("" if "gemm" in vendor else " (this one has none)"))
            elif plain.startswith("cudnn"):
                if not ("conv" in vendor and _CUDNN_CONV.match(plain)):
                    add(sym, "cuDNN is allowed for convolutions only, in tasks whose reference has a convolution"
                             + ("" if "conv" in vendor else " (this one has none)"))
            elif m:
                pass  # an allowed operator (creation, views)
            elif _DENY_PY.match(plain) and not _PY_PYBIND.match(plain):
                add(sym, "the Python C-API running code; strict policy")
            elif not _allowed(plain):
                add(sym, "not among what a binding may import: tensor accessors, TORCH_CHECK, allocation and "
                         "streams, pybind11, libc/libm/libstdc++, OpenMP, the CUDA runtime; strict policy")
    return out
