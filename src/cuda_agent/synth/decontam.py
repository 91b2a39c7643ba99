"""Similarity of a task to a benchmark: normalised AST, operator sequence and MinHash.

- normalised AST: docstrings dropped, user-chosen names (classes, functions, variables, `self.`
  attributes) renamed in order of first appearance, numbers replaced by 0; torch API names and
  strings kept. Equal hashes mean the same program up to renaming and sizes.
- operator sequence: the compute ops `forward` runs, in evaluation order, with `self.x(...)`
  resolved through `__init__` (`nn.Conv2d` -> conv2d, `nn.Sequential` expanded), aliases merged
  (`@`/mm/bmm -> matmul, `+` -> add) and pure shape ops (view, reshape, permute...) left out;
  compared with difflib's ratio.
- MinHash: 128 permutations over 4-token shingles of the normalised AST token stream; the
  estimate of Jaccard similarity between the two shingle sets.

All pure functions of source text; no execution.
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
    def __init__(self):
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name in KEEP_NAMES:
            return name
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


def normalised_tree(source: str) -> ast.Module:
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    _strip_docstrings(tree)
    return _Normaliser().visit(tree)


def ast_hash(source: str) -> str:
    return hashlib.sha256(ast.dump(normalised_tree(source), annotate_fields=False).encode()).hexdigest()[:16]


def tokens(source: str) -> list[str]:
    out = []
    for node in ast.walk(normalised_tree(source)):
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


def operator_sequence(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return []
    attrs: dict[str, list[str]] = {}
    forward = None
    for fn in model.body:
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

    def visit(node: ast.AST) -> None:
        # children first: evaluation order of nested calls
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                ops.extend(attrs.get(f.attr, []))
                return
            name = _call_name(f)
            if name and name not in SHAPE_OPS:
                ops.append(_canon(name))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOPS:
            ops.append(BINOPS[type(node.op)])

    for stmt in forward.body:
        visit(stmt)
    return ops


def sequence_similarity(a: list[str], b: list[str]) -> float:
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


# -- the benchmark index -------------------------------------------------------------------------------

class DecontamConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    minhash_threshold: float = Field(0.8, description="reject at or above this estimated Jaccard similarity")
    ops_threshold: float = Field(0.9, description="reject at or above this operator-sequence similarity")


class Nearest(BaseModel):
    """The benchmark task closest to a candidate and how close it is on each measure."""

    name: str = ""
    minhash: float = 0.0
    ops: float = 0.0
    ast_equal: bool = False

    @property
    def score(self) -> float:
        return 1.0 if self.ast_equal else max(self.minhash, self.ops)


@dataclass(frozen=True)
class _Entry:
    name: str
    ast_hash: str
    ops: list[str]
    signature: np.ndarray


class BenchmarkIndex:
    """Every KernelBench-format `.py` under a folder (other Python files are skipped and counted)."""

    def __init__(self, entries: list[_Entry], skipped: int = 0):
        self.entries = entries
        self.skipped = skipped
        self._sigs = np.stack([e.signature for e in entries]) if entries else np.zeros((0, N_PERM), np.int64)
        self._hashes = {e.ast_hash: e.name for e in entries}

    @classmethod
    def from_dir(cls, root: str | Path) -> "BenchmarkIndex":
        root = Path(root)
        if not root.is_dir():
            raise TaskError(f"{root}: benchmark directory not found")
        entries, skipped = [], 0
        for path in sorted(root.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
                validate_reference_source(text, str(path))
            except (OSError, UnicodeDecodeError, TaskError):
                skipped += 1
                continue
            entries.append(cls.entry(str(path.relative_to(root)), text))
        return cls(entries, skipped)

    @staticmethod
    def entry(name: str, source: str) -> _Entry:
        return _Entry(name=name, ast_hash=ast_hash(source), ops=operator_sequence(source), signature=minhash(source))

    def __len__(self) -> int:
        return len(self.entries)

    def nearest(self, source: str, cfg: DecontamConfig | None = None) -> Nearest:
        """The closest benchmark task; among those over a threshold of `cfg`, the closest of them."""
        if not self.entries:
            return Nearest()
        h = ast_hash(source)
        if h in self._hashes:
            return Nearest(name=self._hashes[h], minhash=1.0, ops=1.0, ast_equal=True)
        sig = minhash(source)
        mh = (self._sigs == sig[None, :]).mean(axis=1)
        ops = operator_sequence(source)
        seq = np.array([sequence_similarity(ops, e.ops) for e in self.entries])
        score = np.maximum(mh, seq)
        if cfg is not None:
            over = (mh >= cfg.minhash_threshold) | (seq >= cfg.ops_threshold)
            if over.any():
                score = np.where(over, score + 1.0, score)
        i = int(score.argmax())
        return Nearest(name=self.entries[i].name, minhash=float(mh[i]), ops=float(seq[i]))


def contamination(near: Nearest, cfg: DecontamConfig) -> str | None:
    """The reason a candidate counts as a copy of `near` (from `nearest(source, cfg)`), or None."""
    if near.ast_equal:
        return f"same normalised AST as benchmark task {near.name}"
    if near.minhash >= cfg.minhash_threshold:
        return f"MinHash similarity {near.minhash:.2f} >= {cfg.minhash_threshold:g} to benchmark task {near.name}"
    if near.ops >= cfg.ops_threshold:
        return f"operator-sequence similarity {near.ops:.2f} >= {cfg.ops_threshold:g} to benchmark task {near.name}"
    return None
