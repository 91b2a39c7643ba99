"""Similarity of a task to a benchmark: what it runs, and its source up to names and sizes.

- traced operators (`trace.py`): the ATen operators the reference's forward runs on meta tensors,
  in order, in a canonical form (no-ops, views and casts dropped, common composites decomposed);
  compared with difflib's ratio. Aliases, subclasses, helpers, renamed classes and inserted no-ops
  do not change it. Traces are computed in isolated processes (the synth worker for candidates, a
  child process for the benchmark), never in the pipeline's own.
- normalised AST: docstrings dropped, user-chosen names (classes, functions, variables, `self.`
  attributes) renamed in order of first appearance, numbers replaced by 0; torch API names and
  strings kept. Equal hashes mean the same program up to renaming and sizes.
- operator sequence (static, the fallback when a task cannot be traced): the compute ops `forward`
  runs, in evaluation order, with `self.x(...)` resolved through `__init__`, aliases merged and pure
  shape ops left out.
- MinHash: 128 permutations over 4-token shingles of the AST token stream with every user-chosen
  name read as one token `ID` (a new name does not renumber the ones after it); the estimate of
  Jaccard similarity between the two shingle sets.

All pure functions of source text except tracing, which executes the task (see trace.py).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent import pysource
from cuda_agent.tasks import TaskError, validate_reference_source

KEEP_NAMES = {"torch", "nn", "F", "math", "Model", "forward", "__init__", "get_inputs", "get_init_inputs", "self",
              "super", "functional"} | set(dir(builtins))
SHAPE_OPS = {"view", "reshape", "permute", "transpose", "flatten", "unsqueeze", "squeeze", "contiguous", "size",
             "expand", "expand_as", "view_as", "reshape_as", "t", "unflatten", "to", "float", "half", "type",
             "detach", "clone", "cat", "stack", "chunk", "split", "narrow", "Parameter", "super", "len", "range",
             "int", "float", "tuple", "list", "zeros", "ones", "empty", "zeros_like", "ones_like", "empty_like",
             "arange", "tensor", "dim", "numel", "item", "Identity", "Dropout", "Flatten", "Unflatten"}
ALIASES = {"mm": "matmul", "bmm": "matmul", "subtract": "sub", "multiply": "mul", "divide": "div",
           "truedivide": "div", "arctan": "atan", "arctan2": "atan2", "absolute": "abs", "negative": "neg",
           "swish": "silu", "softmax2d": "softmax", "rsub": "sub"}   # keys without underscores
BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.MatMult: "matmul", ast.Pow: "pow",
          ast.FloorDiv: "floor_divide", ast.Mod: "remainder"}
N_PERM = 128
SHINGLE = 4
_PRIME = (1 << 31) - 1
_rng = np.random.default_rng(20240611)   # fixed: signatures must be comparable across runs
_A = _rng.integers(1, _PRIME, N_PERM, dtype=np.int64)
_B = _rng.integers(0, _PRIME, N_PERM, dtype=np.int64)


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


class _Normaliser(ast.NodeTransformer):
    """Renames user-chosen names: numbered by first appearance, or (`anonymous`) all to `ID`."""

    def __init__(self, anonymous: bool = False):
        self.names: dict[str, str] = {}
        self.anonymous = anonymous

    def _rename(self, name: str) -> str:
        if name in KEEP_NAMES:
            return name
        if self.anonymous:
            return "ID"
        return self.names.setdefault(name, f"n{len(self.names)}")

    def visit_Name(self, node: ast.Name):
        return ast.copy_location(ast.Name(id=self._rename(node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg):
        return ast.copy_location(ast.arg(arg=self._rename(node.arg), annotation=None), node)

    def visit_FunctionDef(self, node: ast.FunctionDef):
        node.name = self._rename(node.name)
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef):
        node.name = self._rename(node.name)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node: ast.Attribute):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._rename("self." + node.attr)
        return node

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool):
            return ast.copy_location(ast.Constant(value=0), node)
        return node


def normalised_tree(source: str, anonymous: bool = False) -> ast.Module:
    tree = pysource.parse(source)
    tree.body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    _strip_docstrings(tree)
    return _Normaliser(anonymous).visit(tree)


def ast_hash(source: str) -> str:
    return hashlib.sha256(ast.dump(normalised_tree(source), annotate_fields=False).encode()).hexdigest()[:16]


def tokens(source: str) -> list[str]:
    out = []
    for node in ast.walk(normalised_tree(source, anonymous=True)):
        out.append(type(node).__name__)
        for attr in ("id", "attr", "arg", "name"):
            v = getattr(node, attr, None)
            if isinstance(v, str):
                out.append(v)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


def minhash(source: str) -> np.ndarray:
    toks = tokens(source)
    grams = {" ".join(toks[i:i + SHINGLE]) for i in range(max(1, len(toks) - SHINGLE + 1))}
    hashes = np.array([int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little") % _PRIME
                       for g in grams], dtype=np.int64)
    return ((np.outer(_A, hashes) + _B[:, None]) % _PRIME).min(axis=1)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b))


# -- operator sequences ------------------------------------------------------------------------------

def _call_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _canon(name: str) -> str:
    """nn.MaxPool2d, F.max_pool2d and torch.max_pool2d all read `maxpool2d`; `__add__` reads `add`."""
    n = name.lower().replace("_", "")
    return ALIASES.get(n, n)


def _module_ops(value: ast.AST) -> list[str]:
    """Ops of a constructor expression assigned in __init__ (`nn.Conv2d(...)`, `nn.Sequential(...)`)."""
    if not isinstance(value, ast.Call):
        return []
    name = _call_name(value.func)
    if name is None:
        return []
    if name in ("Sequential", "ModuleList"):
        return [op for a in value.args for op in _module_ops(a)]
    if name in SHAPE_OPS:
        return []
    return [_canon(name)]


def _model_class(tree: ast.Module) -> ast.ClassDef | None:
    """The class `Model` names: a class of that name, or the class an alias `Model = X` binds."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    target = "Model"
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) \
                and any(isinstance(t, ast.Name) and t.id == "Model" for t in node.targets):
            target = node.value.id
    return classes.get(target) or classes.get("Model")


def _class_chain(tree: ast.Module, cls: ast.ClassDef) -> list[ast.ClassDef]:
    """`cls` and the classes of this file it inherits from, nearest first (`class Model(Base): pass`)."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    chain, todo = [], [cls]
    while todo:
        c = todo.pop(0)
        if c in chain:
            continue
        chain.append(c)
        todo += [classes[b.id] for b in c.bases if isinstance(b, ast.Name) and b.id in classes]
    return chain


def operator_sequence(source: str) -> list[str]:
    """The static operator sequence of `Model.forward` (the class an alias names, its bases in the
    file, module-level helpers it calls, one level deep)."""
    try:
        tree = pysource.parse(source)
    except SyntaxError:
        return []
    model = _model_class(tree)
    if model is None:
        return []
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    attrs: dict[str, list[str]] = {}
    forward = None
    for cls in reversed(_class_chain(tree, model)):   # a subclass's methods win
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            if fn.name == "forward":
                forward = fn
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            attrs[t.attr] = _module_ops(node.value)
    if forward is None:
        return []
    ops: list[str] = []

    def visit(node: ast.AST, depth: int) -> None:
        # children first: evaluation order of nested calls
        for child in ast.iter_child_nodes(node):
            visit(child, depth)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                ops.extend(attrs.get(f.attr, []))
                return
            if isinstance(f, ast.Name) and f.id in helpers and depth == 0:
                for stmt in helpers[f.id].body:
                    visit(stmt, depth + 1)
                return
            name = _call_name(f)
            if name and name not in SHAPE_OPS:
                ops.append(_canon(name))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOPS:
            ops.append(BINOPS[type(node.op)])

    for stmt in forward.body:
        visit(stmt, 0)
    return ops


def sequence_similarity(a: list[str], b: list[str]) -> float:
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


# -- the benchmark index -------------------------------------------------------------------------------

class DecontamConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    minhash_threshold: float = Field(0.8, description="reject at or above this estimated Jaccard similarity")
    ops_threshold: float = Field(0.9, description="reject at or above this static operator-sequence similarity")
    trace_threshold: float = Field(0.9, description="reject at or above this traced operator-sequence similarity")
    trace: bool = Field(True, description="compare the operators the references run (traced on meta tensors)")


class Nearest(BaseModel):
    """The benchmark task closest to a candidate and how close it is on each measure."""

    name: str = ""
    minhash: float = 0.0
    ops: float = 0.0
    ast_equal: bool = False
    trace: float = 0.0          # traced operator-sequence similarity (0 when either side has no trace)
    traced: bool = False        # both the candidate and that benchmark task were traced

    @property
    def score(self) -> float:
        return 1.0 if self.ast_equal else max(self.minhash, self.ops, self.trace)


@dataclass(frozen=True)
class _Entry:
    name: str
    ast_hash: str
    ops: list[str]
    signature: np.ndarray
    trace: list[str] | None = None


def _trace_cache() -> Path:
    from cuda_agent.judge.config import default_cache_dir

    return default_cache_dir() / "synth" / "benchmark_traces.jsonl"


def cached_traces(sources: list[str], cache: Path | None = None) -> list[list[str] | None]:
    """Traces of benchmark sources, from a cache keyed by source and torch version (computed once,
    in a child process, for the sources the cache lacks)."""
    import json

    import torch

    from .trace import trace_many

    path = cache or _trace_cache()
    from .trace import MAX_OPS

    key = [hashlib.sha256(f"{torch.__version__}\0{MAX_OPS}\0{s}".encode()).hexdigest()[:24] for s in sources]
    known: dict[str, list[str] | None] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                known[row["key"]] = row["ops"]
            except (ValueError, KeyError):
                continue
    missing = [i for i, k in enumerate(key) if k not in known]
    if missing:
        got = trace_many([sources[i] for i in missing])
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            for i, ops in zip(missing, got):
                known[key[i]] = ops
                f.write(json.dumps({"key": key[i], "ops": ops}) + "\n")
    return [known[k] for k in key]


class BenchmarkIndex:
    """Every KernelBench-format `.py` under a folder (other Python files are skipped and counted)."""

    def __init__(self, entries: list[_Entry], skipped: int = 0):
        self.entries = entries
        self.skipped = skipped
        self._sigs = np.stack([e.signature for e in entries]) if entries else np.zeros((0, N_PERM), np.int64)
        self._hashes = {e.ast_hash: e.name for e in entries}

    @classmethod
    def from_dir(cls, root: str | Path, trace: bool = True, cache: Path | None = None) -> "BenchmarkIndex":
        """Index `root`; with `trace`, each task's traced operators too (a child process, cached)."""
        root = Path(root)
        if not root.is_dir():
            raise TaskError(f"{root}: benchmark directory not found")
        found, skipped = [], 0
        for path in sorted(root.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
                validate_reference_source(text, str(path))
            except (OSError, UnicodeDecodeError, TaskError):
                skipped += 1
                continue
            found.append((str(path.relative_to(root)), text))
        traces = cached_traces([t for _, t in found], cache) if trace else [None] * len(found)
        return cls([cls.entry(name, text, tr) for (name, text), tr in zip(found, traces)], skipped)

    @staticmethod
    def entry(name: str, source: str, trace: list[str] | None = None) -> _Entry:
        return _Entry(name=name, ast_hash=ast_hash(source), ops=operator_sequence(source), signature=minhash(source),
                      trace=trace)

    def __len__(self) -> int:
        return len(self.entries)

    def _trace_scores(self, trace: list[str] | None, threshold: float, top: int = 5) -> np.ndarray:
        """Traced-sequence similarity to each entry, exact where it matters: for every entry whose
        upper bound (difflib's quick_ratio) reaches `threshold`, and for the `top` highest bounds;
        0 elsewhere (those can be neither over the threshold nor the nearest)."""
        out = np.zeros(len(self.entries))
        if not trace:
            return out
        m = difflib.SequenceMatcher(None, autojunk=False)
        m.set_seq2(trace)   # the candidate's index is built once
        bound = np.zeros(len(self.entries))
        for i, e in enumerate(self.entries):
            if e.trace:
                m.set_seq1(e.trace)
                bound[i] = m.real_quick_ratio() and m.quick_ratio()
        order = np.argsort(-bound)
        for i in sorted(set(order[:top].tolist()) | set(np.nonzero(bound >= threshold)[0].tolist())):
            if bound[i] > 0:
                m.set_seq1(self.entries[i].trace)
                out[i] = m.ratio()
        return out

    def nearest(self, source: str, cfg: DecontamConfig | None = None, trace: list[str] | None = None) -> Nearest:
        """The closest benchmark task; among those over a threshold of `cfg`, the closest of them.
        `trace` is the candidate's traced operators (None: not traced)."""
        if not self.entries:
            return Nearest()
        h = ast_hash(source)
        if h in self._hashes:
            return Nearest(name=self._hashes[h], minhash=1.0, ops=1.0, ast_equal=True, trace=1.0 if trace else 0.0)
        sig = minhash(source)
        mh = (self._sigs == sig[None, :]).mean(axis=1)
        ops = operator_sequence(source)
        seq = np.array([sequence_similarity(ops, e.ops) for e in self.entries])
        tr = self._trace_scores(trace, cfg.trace_threshold if cfg is not None else 1.0)
        score = np.maximum(np.maximum(mh, seq), tr)
        if cfg is not None:
            over = (mh >= cfg.minhash_threshold) | (seq >= cfg.ops_threshold) | (tr >= cfg.trace_threshold)
            if over.any():
                score = np.where(over, score + 1.0, score)
        i = int(score.argmax())
        return Nearest(name=self.entries[i].name, minhash=float(mh[i]), ops=float(seq[i]), trace=float(tr[i]),
                       traced=bool(trace) and self.entries[i].trace is not None)


def contamination(near: Nearest, cfg: DecontamConfig) -> str | None:
    """The reason a candidate counts as a copy of `near` (from `nearest(source, cfg)`), or None."""
    if near.ast_equal:
        return f"same normalised AST as benchmark task {near.name}"
    if near.trace >= cfg.trace_threshold:
        return f"traced operators {near.trace:.2f} >= {cfg.trace_threshold:g} similar to benchmark task {near.name}"
    if near.minhash >= cfg.minhash_threshold:
        return f"MinHash similarity {near.minhash:.2f} >= {cfg.minhash_threshold:g} to benchmark task {near.name}"
    if near.ops >= cfg.ops_threshold:
        return f"operator-sequence similarity {near.ops:.2f} >= {cfg.ops_threshold:g} to benchmark task {near.name}"
    return None
