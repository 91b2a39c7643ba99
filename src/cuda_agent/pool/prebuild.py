"""What a compile worker can build for a candidate before a judge worker gets to it.

The judge's build cache is content-addressed (`Builder`: the key covers sources, flags, arch and
toolchain), so a library built here with the same `BuildSpec` is a cache hit when the judge asks
for it. Getting the same spec is the whole job of this module:

* a workspace: `workspace_spec` of its kernels, exactly as the judge makes it;
* a single file: the judge learns its `load_inline` arguments only when the candidate's module
  runs. Running untrusted code here is out of the question, so the arguments are read from the
  source statically: calls to `load_inline(...)` whose arguments are literals, or module-level
  names bound to literals (strings, lists, tuples, dicts, `+` of those). Anything else (an
  f-string, a computed flag list, a loop) is left to the judge, which builds it itself. A wrong
  guess costs one wasted build, never a wrong verdict: the judge still checks the binary it loads.

Sources that break the policy are not built: the judge refuses them before any build.
"""

from __future__ import annotations

import ast
from typing import Any

from pydantic import BaseModel

from cuda_agent import host
from cuda_agent.candidate import Candidate
from cuda_agent.judge import policy as pol
from cuda_agent.judge.build import Builder, BuildError, BuildSpec, build_arch, inline_spec, workspace_spec


class PrebuildPlan(BaseModel):
    """The specs to build and, for what cannot be built ahead, why."""

    specs: list[BuildSpec]
    skipped: list[str]


class _Unresolved(Exception):
    pass


def workspace_slot(candidate: Candidate) -> str:
    """The judge's persistent build-folder name for a workspace (same lock, same incremental state)."""
    if candidate.origin and candidate.origin != "<memory>":
        return f"ws:{candidate.origin}"
    return f"ws:{candidate.hash}"


def plan_prebuild(candidate: Candidate, device: str, policy: str) -> PrebuildPlan:
    try:
        tree = ast.parse(candidate.model_new)
    except SyntaxError:
        return PrebuildPlan(specs=[], skipped=["model_new does not parse"])
    violations = pol.check_python(candidate.model_new, policy)
    if violations:
        return PrebuildPlan(specs=[], skipped=[f"policy: {violations[0]}"])
    if candidate.kind == "workspace":
        for rel, src in candidate.kernels:
            found = pol.check_cpp(src, f"kernels/{rel}", policy)
            if found:
                return PrebuildPlan(specs=[], skipped=[f"policy: {found[0]}"])
        try:
            return PrebuildPlan(specs=[workspace_spec(candidate.kernels, workspace_slot(candidate), device)], skipped=[])
        except BuildError as exc:
            return PrebuildPlan(specs=[], skipped=[str(exc)])
    return _inline_plan(tree, device, policy)


# The judge's load_inline stand-in takes these positionally (cuda_agent.judge.worker.rpc_load_inline).
_POSITIONAL = ("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
               "extra_ldflags")


def _inline_plan(tree: ast.Module, device: str, policy: str) -> PrebuildPlan:
    names = _module_constants(tree)
    specs, skipped = [], []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _is_load_inline(call.func)):
            continue
        try:
            args = _bind(call, names)
        except _Unresolved as exc:
            skipped.append(f"load_inline at line {call.lineno}: {exc}")
            continue
        if args.get("extra_include_paths"):
            skipped.append(f"load_inline at line {call.lineno}: extra_include_paths (refused by the judge)")
            continue
        try:
            spec = _spec_like_the_judge(args)
        except BuildError as exc:
            skipped.append(f"load_inline at line {call.lineno}: {exc}")
            continue
        if device == "cpu" and spec.with_cuda:
            skipped.append(f"load_inline at line {call.lineno}: CUDA sources on the CPU backend")
            continue
        found = [v for rel, src in spec.sources for v in pol.check_cpp(src, f"{spec.name}/{rel}", policy)]
        if found:
            skipped.append(f"policy: {found[0]}")
            continue
        specs.append(spec)
    return PrebuildPlan(specs=specs, skipped=skipped)


def _spec_like_the_judge(args: dict[str, Any]) -> BuildSpec:
    """The spec the judge makes from the same arguments (cuda_agent.judge.harness.Judge._serve_build,
    after the arguments crossed its JSON channel)."""
    def text_list(x):
        if x is None:
            return []
        return [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple)) else [str(x)]

    functions = args.get("functions")
    if isinstance(functions, tuple):
        functions = list(functions)
    with_cuda = args.get("with_cuda")
    return inline_spec(
        name=str(args.get("name")), cpp_sources=text_list(args.get("cpp_sources")),
        cuda_sources=text_list(args.get("cuda_sources")), functions=functions,
        cflags=[str(f) for f in text_list(args.get("extra_cflags"))],
        cuda_cflags=[str(f) for f in text_list(args.get("extra_cuda_cflags"))],
        ldflags=[str(f) for f in text_list(args.get("extra_ldflags"))],
        with_cuda=with_cuda if isinstance(with_cuda, bool) else None,
        with_pytorch_error_handling=bool(args.get("with_pytorch_error_handling", True)))


def _is_load_inline(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "load_inline") or \
        (isinstance(func, ast.Attribute) and func.attr == "load_inline")


def _bind(call: ast.Call, names: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if len(call.args) > len(_POSITIONAL) or any(isinstance(a, ast.Starred) for a in call.args):
        raise _Unresolved("positional arguments beyond the judge's")
    for pname, node in zip(_POSITIONAL, call.args):
        args[pname] = _value(node, names)
    for kw in call.keywords:
        if kw.arg is None:
            raise _Unresolved("**kwargs")
        if kw.arg in ("verbose", "build_directory", "is_python_module", "keep_intermediates", "use_pch"):
            continue  # ignored by the judge's stand-in
        args[kw.arg] = _value(kw.value, names)
    if "name" not in args or "cpp_sources" not in args:
        raise _Unresolved("no name or cpp_sources")
    return args


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level `NAME = <literal>` bindings, in order (a later binding replaces an earlier one;
    a name bound to something not literal is forgotten)."""
    names: dict[str, Any] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    names[target.id] = _value(value, names)
                except _Unresolved:
                    names.pop(target.id, None)
    return names


def _value(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bool, int, float, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise _Unresolved(f"{node.id} is not a module-level literal")
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(e, names) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Unresolved("dict unpacking")
        return {_value(k, names): _value(v, names) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, names), _value(node.right, names)
        if type(left) is type(right) and isinstance(left, (str, list, tuple)):
            return left + right
    raise _Unresolved(f"{type(node).__name__} expression is not a literal")


def build_specs(builder: Builder, specs: list[BuildSpec]) -> tuple[int, int, list[str]]:
    """Build each spec into the builder's cache (a spec already there costs a look-up).
    Returns (built, already cached, the first line of each failure); a failure is only recorded:
    the judge builds the candidate again and reports the whole error in its verdict."""
    built, cached, failed = 0, 0, []
    for spec in specs:
        try:
            if builder.build(spec).cached:
                cached += 1
            else:
                built += 1
        except BuildError as exc:
            failed.append(str(exc).splitlines()[0][:200] if str(exc) else "build failed")
        except Exception as exc:  # noqa: BLE001 - one candidate's trouble must not end the others
            failed.append(f"{type(exc).__name__}: {exc}"[:200])
    return built, cached, failed


class AheadResult(BaseModel):
    """What `build_ahead` did for one candidate."""

    origin: str
    specs: int = 0
    built: int = 0
    cached: int = 0
    failed: list[str] = []
    skipped: list[str] = []
    seconds: float = 0.0


def build_ahead(candidates: list[Candidate], config, *, parallel: int = 4, jobs: int | None = None,
                on_result=None) -> list[AheadResult]:
    """Build what the judge will ask for, for many candidates at once, into `config.cache_dir`.

    `parallel` builds run side by side, each with `jobs` compiler processes (default: the cores
    shared out). Each concurrent build has its own sandbox uid when running as root, because a
    build's clean-up kills every process of its uid. A failed build is only counted: the judge
    builds it again and reports the compiler's error in its verdict. `on_result` is called with
    each `AheadResult` as it finishes (for a progress bar)."""
    import os
    import queue
    import threading
    import time

    from cuda_agent.judge.sandbox import work_root_dir

    arch = build_arch(config.device, config.arch)
    parallel = max(1, min(parallel, len(candidates) or 1))
    jobs = jobs or max(1, host.usable_cores() // parallel)
    base_uid = host.prebuild_uid_base(os.getpid())  # clear of the judges' (and their spares') and the pool's uids
    todo: queue.Queue = queue.Queue()
    for index, cand in enumerate(candidates):
        todo.put((index, cand))
    results: list[AheadResult | None] = [None] * len(candidates)

    def run(k: int) -> None:
        builder = Builder(config.cache_dir, work_root_dir(), arch=arch, timeout_s=config.build_timeout_s,
                          uid=base_uid + k, jobs=jobs)
        while True:
            try:
                index, cand = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.monotonic()
            plan = plan_prebuild(cand, config.device, config.policy)
            built, cached, failed = build_specs(builder, plan.specs)
            res = AheadResult(origin=cand.origin, specs=len(plan.specs), skipped=plan.skipped, built=built,
                              cached=cached, failed=failed, seconds=time.monotonic() - t0)
            results[index] = res
            if on_result is not None:
                on_result(res)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]
