"""What the judge builds for a candidate, decided in one place.

`plan_build(candidate, device, policy)` turns a candidate into a `BuildPlan`: whether it loads at
all, the static policy violations of its sources, and the `BuildSpec`s to compile, each with its
build-folder name (slot). Everyone who builds "like the judge" asks this module:

* the judge itself: `Judge.evaluate` plans, then builds each spec with `build_spec` (build, then
  the library's imports checked); `CandidateBuilds.serve` (candidate.py) turns a candidate's `load_inline` request
  into a spec with `spec_from_request`; `Judge.build` is `build_planned` of its plan;
* compile workers (`cuda_agent.pool.prebuild`), which carry out the same plan with
  `build_planned` into the content-addressed build cache ahead of the judge: the same spec is
  the same cache key, so their library is a cache hit (they hold a builder, not a whole judge:
  a CUDA judge needs a GPU, a compile worker only the compiler);
* the agent's compile tool, through `Judge.build`.

Specs of a workspace come from its kernels. A single file's `load_inline` arguments are known to
the judge only when the candidate's module runs; running untrusted code here is out of the
question, so they are read from the source statically: calls whose arguments are literals, or
module-level names bound to literals (strings, lists, tuples, dicts, `+` of those). The arguments
are bound to the judge's own stand-in for `load_inline` (`cuda_agent.judge.inline_request.
load_inline_request`, which the candidate process calls too) and go through the judge's
request-to-spec step, so a statically read call yields exactly the spec the judge makes when the
module makes that call. Anything not literal (an
f-string, a computed flag list, a loop) is listed in `skipped` and left to the judge, which builds
it when asked. A wrong static guess costs one wasted build, never a wrong verdict: the judge still
checks every binary it loads.
"""

from __future__ import annotations

import ast
import inspect
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from cuda_agent import pysource
from cuda_agent.candidate import Candidate

from .. import policy as pol
from ..inline_request import load_inline_request
from ..verdict import Failure, FailureCategory
from .builder import Builder, BuildError, BuildSpec, inline_spec, library_imports, workspace_spec


class BuildPlan(BaseModel):
    """What the judge would build for one candidate, before anything is compiled.

    `load_error`: the candidate cannot load (syntax error, no ModelNew, a workspace with nothing to
    compile); `violations`: the policy's objections to its sources. Either one means nothing is
    built (`specs` is empty). `skipped`: `load_inline` calls that could not be read statically,
    each with why (the judge builds them when the module asks)."""

    device: str
    policy: str
    load_error: str | None = None
    violations: list[str] = Field(default_factory=list)
    specs: list[BuildSpec] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)

    @property
    def refused(self) -> bool:
        return self.load_error is not None or bool(self.violations)

    @property
    def not_built(self) -> list[str]:
        """Why anything is left unbuilt: the refusal, or the calls left to the judge."""
        refusal = [self.load_error] if self.load_error is not None else []
        refusal += [f"policy: {self.violations[0]}"] if self.violations else []
        return refusal + self.skipped


class SpecBuild(BaseModel):
    """One spec through the judge's build step: compiled (or found in the cache), then the
    library's imports checked against the policy. `failure`: compile, compile_timeout, or policy
    (forbidden imports, listed in `violations`; the library exists but the judge will not load it)."""

    key: str
    library: Path | None = None
    seconds: float = 0.0
    cached: bool = False
    headers: str | None = None     # which of torch's headers its .cu files saw (BuildResult.headers)
    failure: Failure | None = None
    violations: list[str] = Field(default_factory=list)
    note: str | None = None


class BuildOutcome(BaseModel):
    """What `Judge.build` did for one candidate: the judge's static checks and builds, no run.

    `compiled`: every spec of the plan built and no check refused it; `failure` says why not (the
    category the verdict would carry: load, policy, compile, compile_timeout). `builds`: the specs
    built, in order, up to the first failure (as the judge stops there)."""

    compiled: bool
    failure: Failure | None = None
    builds: list[SpecBuild] = Field(default_factory=list)
    seconds: float = 0.0
    policy_violations: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def libraries(self) -> list[Path]:
        return [b.library for b in self.builds if b.library is not None and b.failure is None]

    @property
    def library(self) -> Path | None:
        """The first library built (a workspace's only one), when it may be loaded."""
        return self.libraries[0] if self.libraries else None

    @property
    def keys(self) -> list[str]:
        """Build-cache keys of the libraries built."""
        return [b.key for b in self.builds if b.failure is None]

    @property
    def cached(self) -> bool:
        """Every library came from the build cache (nothing compiled)."""
        return bool(self.builds) and all(b.cached for b in self.builds)


def workspace_slot(candidate: Candidate) -> str:
    """The persistent build-folder name of a workspace: its path when it has one (the same folder,
    lock and incremental state for every version of it), else its content hash."""
    if candidate.origin and candidate.origin != "<memory>":
        return f"ws:{candidate.origin}"
    return f"ws:{candidate.hash}"


def plan_build(candidate: Candidate, device: str, policy: str) -> BuildPlan:
    """The judge's plan for `candidate`: load checks, then policy, then the specs to build."""
    plan = BuildPlan(device=device, policy=policy)
    try:
        tree = pysource.parse(candidate.model_new)
    except SyntaxError as exc:
        plan.load_error = f"model_new: syntax error at line {exc.lineno}: {exc.msg}"
        return plan
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        plan.load_error = "the candidate defines no class ModelNew at module level"
        return plan
    plan.violations = pol.check_python(candidate.model_new, policy)
    for rel, src in candidate.kernels:
        plan.violations += pol.check_cpp(src, f"kernels/{rel}", policy)
    if plan.violations:
        return plan
    if candidate.kind == "workspace":
        try:
            plan.specs = [workspace_spec(candidate.kernels, workspace_slot(candidate), device)]
        except BuildError as exc:
            plan.load_error = str(exc)
        return plan
    for line, args in static_load_inline_calls(tree, plan.skipped):
        try:
            spec = spec_from_request(json.loads(json.dumps(load_inline_request(*args.args, **args.kwargs))))
        except (BuildError, RuntimeError, TypeError, ValueError) as exc:
            plan.skipped.append(f"load_inline at line {line}: {exc}")
            continue
        refusal = inline_refusal(spec, device, policy)
        if refusal is not None:
            plan.skipped.append(f"load_inline at line {line}: {refusal.message}")
            continue
        plan.specs.append(spec)
    return plan


def build_spec(builder: Builder, spec: BuildSpec, *, policy: str, device: str,
               vendor: frozenset[str] | None = None) -> SpecBuild:
    """The judge's build step for one spec: the build (sandboxed, cached) and the check of the
    library's imports against the policy (`vendor`: the task's vendor-library allowance, None when no
    task is known). A candidate's fault is in the result, never raised."""
    key = spec.key(builder.fingerprint)
    try:
        result = builder.build(spec)
    except BuildError as exc:
        category = FailureCategory.COMPILE_TIMEOUT if exc.timeout else FailureCategory.COMPILE
        return SpecBuild(key=key, failure=Failure(category=category, message=str(exc)))
    built = SpecBuild(key=result.key, library=result.library, seconds=result.seconds, cached=result.cached,
                      headers=result.headers)
    symbols = library_imports(result.library)
    if symbols is None:
        built.note = "nm not found: the compiled extension's imports were not checked"
        return built
    built.violations = pol.check_binary(symbols, policy, device, vendor=vendor)
    if built.violations:
        built.failure = Failure(category=FailureCategory.POLICY, message=built.violations[0])
    return built


def build_planned(plan: BuildPlan, builder: Builder) -> BuildOutcome:
    """Carry out a plan as the judge does: its refusal, else each spec in order until one fails."""
    t0 = time.monotonic()
    outcome = BuildOutcome(compiled=False, skipped=list(plan.skipped))
    if plan.load_error is not None:
        outcome.failure = Failure(category=FailureCategory.LOAD, message=plan.load_error)
    elif plan.violations:
        outcome.failure = Failure(category=FailureCategory.POLICY, message=plan.violations[0])
        outcome.policy_violations = list(plan.violations)
    else:
        for spec in plan.specs:
            built = build_spec(builder, spec, policy=plan.policy, device=plan.device)
            outcome.builds.append(built)
            outcome.policy_violations += built.violations
            outcome.notes += [built.note] if built.note else []
            if built.failure is not None:
                outcome.failure = built.failure
                break
    outcome.compiled = outcome.failure is None
    outcome.seconds = time.monotonic() - t0
    return outcome


def spec_from_request(msg: dict) -> BuildSpec:
    """The spec of a candidate's `load_inline` build request, as it arrives over the judge's JSON
    channel (`load_inline_request`). Raises BuildError for arguments the judge cannot build."""
    def text_list(x):
        if x is None:
            return []
        return [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple)) else [str(x)]

    return inline_spec(
        name=str(msg.get("name")), cpp_sources=text_list(msg.get("cpp_sources")),
        cuda_sources=text_list(msg.get("cuda_sources")), functions=msg.get("functions"),
        cflags=[str(f) for f in text_list(msg.get("cflags"))],
        cuda_cflags=[str(f) for f in text_list(msg.get("cuda_cflags"))],
        ldflags=[str(f) for f in text_list(msg.get("ldflags"))],
        with_cuda=msg.get("with_cuda") if isinstance(msg.get("with_cuda"), bool) else None,
        with_pytorch_error_handling=bool(msg.get("with_pytorch_error_handling", True)))


class InlineRefusal(BaseModel):
    """Why the judge refuses a `load_inline` spec before compiling it: `compile` (nothing the
    backend can build) or `policy` (`violations` lists them all)."""

    category: Literal["compile", "policy"]
    message: str
    violations: list[str] = Field(default_factory=list)


def inline_refusal(spec: BuildSpec, device: str, policy: str) -> InlineRefusal | None:
    """The judge's checks of a `load_inline` spec before it compiles it; None when it may build."""
    if device == "cpu" and spec.with_cuda:
        return InlineRefusal(category="compile", message="CUDA sources cannot be built for the CPU backend")
    found = [v for rel, src in spec.sources for v in pol.check_cpp(src, f"{spec.name}/{rel}", policy)]
    if found:
        return InlineRefusal(category="policy", message=f"policy: {found[0]}", violations=found)
    return None


# ---------------------------------------------------------------------------------------------
# Static reading of load_inline calls


class _Unresolved(Exception):
    pass


_STAND_IN = inspect.signature(load_inline_request)


def static_load_inline_calls(tree: ast.Module, skipped: list[str]):
    """(line, bound arguments) of each `load_inline(...)` call whose arguments are literals (or
    module-level names bound to literals); the others are described in `skipped`. The one reader of
    load_inline calls without running the module: the compile workers' plan, and the benchmarks'
    static checks of published solutions."""
    names = _module_constants(tree)
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _is_load_inline(call.func)):
            continue
        try:
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                raise _Unresolved("*args or **kwargs")
            args = [_value(a, names) for a in call.args]
            kwargs = {k.arg: _keyword_value(k, names) for k in call.keywords}
            bound = _STAND_IN.bind(*args, **kwargs)
        except _Unresolved as exc:
            skipped.append(f"load_inline at line {call.lineno}: {exc}")
            continue
        except TypeError as exc:  # arguments the stand-in does not take: the module would raise too
            skipped.append(f"load_inline at line {call.lineno}: {exc}")
            continue
        yield call.lineno, bound


# What the judge's request carries; the stand-in ignores every other argument of load_inline.
_REQUESTED = frozenset(("name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                        "extra_ldflags", "extra_include_paths", "with_cuda", "with_pytorch_error_handling"))


def _keyword_value(kw: ast.keyword, names: dict[str, Any]) -> Any:
    try:
        return _value(kw.value, names)
    except _Unresolved:
        if kw.arg in _REQUESTED:
            raise
        return None  # e.g. build_directory=some_path(): the judge ignores it


def _is_load_inline(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "load_inline") or \
        (isinstance(func, ast.Attribute) and func.attr == "load_inline")


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
