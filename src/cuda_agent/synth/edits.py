"""Decontamination against edits (`cuda-agent synth decontam`): how many near-copies of benchmark tasks the synth filter catches.

Applies a battery of meaning-preserving edits to every task of a benchmark folder (KernelBench
layout, or a flat folder such as the leaderboard's `docs/assets/problems/`), one edit kind at a
time, and asks the synth pipeline's decontamination (`BenchmarkIndex.nearest` + `contamination`,
the candidate traced in a child process as the synth worker traces it) whether each edited task
is a copy of the benchmark. Reports the catch rate per edit kind, then the false-positive rate on
distinct tasks (fused chains written for this benchmark, plus `--distinct FILE`: a synth export's
`tasks.jsonl`, whose tasks passed decontamination by construction only if they were filtered
against the same folder). Also runs 8 planted near-copies written by hand.

    cuda-agent synth decontam --bench /path/to/problems [--level 1 --level 2 ...] [--edit rename ...]
                              [--no-trace] [--json out.json]

Edits (each returns None where it does not apply; those are counted as not applicable):
  rename      every user-chosen name (locals, arguments, attributes, helpers) renamed
  resize      module-level integer sizes >= 8 doubled
  reorder     get_inputs/get_init_inputs and constants moved above the class
  torch_to_F  `torch.relu(...)` -> `F.relu(...)` and the other way round, where both exist
  noop        `x = x * 1.0` inserted at the start of forward
  alias       the class renamed `DenseStack`, then `Model = DenseStack`
  subclass    the class renamed `Original`, then `class Model(Original): pass`
  helper      forward's body moved to a module-level function that forward calls
  const_noop  an unused module constant and `x = x.contiguous()` in forward
  silu        `x * torch.sigmoid(x)` <-> `F.silu(x)` (where either appears)
  all         rename + reorder + alias + helper + noop + silu together
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import torch
import torch.nn.functional as F_mod

KEEP = {"torch", "nn", "F", "math", "Model", "forward", "__init__", "get_inputs", "get_init_inputs", "self",
        "super", "functional"} | set(dir(builtins))


# -- edits -------------------------------------------------------------------------------------------

class _Renamer(ast.NodeTransformer):
    def __init__(self, imported: set[str]):
        self.keep = KEEP | imported

    def _r(self, name: str) -> str:
        return name if name in self.keep or name.startswith("__") else f"{name}_r"

    def visit_Name(self, node):
        node.id = self._r(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._r(node.arg)
        return node

    def visit_FunctionDef(self, node):
        node.name = self._r(node.name)
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node):
        node.name = self._r(node.name)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._r(node.attr)
        return node

    def visit_keyword(self, node):
        self.generic_visit(node)   # keyword names belong to the callee
        return node


def _imported(tree: ast.Module) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def _user_classes(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def rename(src: str) -> str | None:
    tree = ast.parse(src)
    r = _Renamer(_imported(tree))
    tree = r.visit(tree)
    # keyword arguments of the file's own classes and functions follow their parameters' new names
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in own:
            for kw in call.keywords:
                if kw.arg:
                    kw.arg = r._r(kw.arg)
    return ast.unparse(tree)


def resize(src: str) -> str | None:
    tree = ast.parse(src)
    changed = False
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and type(node.value.value) is int and node.value.value >= 8:
            node.value.value *= 2
            changed = True
    return ast.unparse(tree) if changed else None


def reorder(src: str) -> str | None:
    tree = ast.parse(src)
    first = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    consts = [n for n in tree.body if isinstance(n, ast.Assign)]
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    rest = [n for n in tree.body if n not in first and n not in consts and n not in funcs]
    tree.body = first + consts + list(reversed(funcs)) + rest
    return ast.unparse(tree)


def torch_to_F(src: str) -> str | None:
    count = 0

    def swap(m: re.Match) -> str:
        nonlocal count
        mod, name = m.group(1), m.group(2)
        if mod == "torch" and hasattr(F_mod, name):
            count += 1
            return f"F.{name}("
        if mod == "F" and hasattr(torch, name):
            count += 1
            return f"torch.{name}("
        return m.group(0)

    out = re.sub(r"\b(torch|F)\.([a-z_0-9]+)\(", swap, src)
    if not count:
        return None
    if "import torch.nn.functional as F" not in out:
        out = "import torch.nn.functional as F\n" + out
    return out


def _forward(tree: ast.Module) -> tuple[ast.ClassDef, ast.FunctionDef] | None:
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "Model":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward" and len(fn.args.args) > 1:
                    return cls, fn
    return None


def _insert_in_forward(src: str, line: str) -> str | None:
    tree = ast.parse(src)
    found = _forward(tree)
    if found is None:
        return None
    _, fn = found
    x = fn.args.args[1].arg
    body = fn.body
    at = 1 if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) else 0
    fn.body = body[:at] + ast.parse(line.format(x=x)).body + body[at:]
    return ast.unparse(tree)


def noop(src: str) -> str | None:
    return _insert_in_forward(src, "{x} = {x} * 1.0")


def const_noop(src: str) -> str | None:
    out = _insert_in_forward(src, "{x} = {x}.contiguous()")
    return None if out is None else out + "\n\nUNUSED_SCALE = 0.125\n"


def _rename_class(src: str, new: str) -> str:
    return re.sub(r"\bModel\b", new, src)


def alias(src: str) -> str | None:
    return _rename_class(src, "DenseStack") + "\n\nModel = DenseStack\n"


def subclass(src: str) -> str | None:
    return _rename_class(src, "Original") + "\n\nclass Model(Original):\n    pass\n"


def helper(src: str) -> str | None:
    tree = ast.parse(src)
    found = _forward(tree)
    if found is None:
        return None
    _, fn = found
    args = [a.arg for a in fn.args.args]
    impl = ast.FunctionDef(name="_forward_impl", args=fn.args, body=fn.body, decorator_list=[], returns=None,
                           type_params=[])
    call = ast.parse(f"return _forward_impl({', '.join(args)})").body
    fn.body = call
    tree.body.append(impl)
    return ast.unparse(ast.fix_missing_locations(tree))


SILU_OUT = re.compile(r"\b(\w+) \* torch\.sigmoid\(\1\)|torch\.sigmoid\((\w+)\) \* \2\b")
SILU_IN = re.compile(r"\b(?:F|torch\.nn\.functional)\.silu\((\w+)\)")


def silu(src: str) -> str | None:
    if SILU_OUT.search(src):
        out = SILU_OUT.sub(lambda m: f"F.silu({m.group(1) or m.group(2)})", src)
        return out if "import torch.nn.functional as F" in out else "import torch.nn.functional as F\n" + out
    if SILU_IN.search(src):
        return SILU_IN.sub(lambda m: f"{m.group(1)} * torch.sigmoid({m.group(1)})", src)
    return None


def all_edits(src: str) -> str | None:
    out = src
    for edit in (silu, noop, helper, reorder, rename, alias):
        out = edit(out) or out
    return out


EDITS = {"rename": rename, "resize": resize, "reorder": reorder, "torch_to_F": torch_to_F, "noop": noop,
         "alias": alias, "subclass": subclass, "helper": helper, "const_noop": const_noop, "silu": silu,
         "all": all_edits}


# -- planted near-copies and distinct tasks -------------------------------------------------------------

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _task(init: str, fwd: str, inputs: str, params: str = "") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + "".join(f"        {ln}\n" for ln in (init.splitlines() or ["pass"]))
            + f"\n    def forward(self, x{params}):\n" + "".join(f"        {ln}\n" for ln in fwd.splitlines())
            + f"\n\ndef get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n")


# fused chains of our own: no benchmark task runs these operators in this order
DISTINCT = {
    "layernorm_tanh_cumsum": _task("self.ln = nn.LayerNorm(256)", "return torch.cumsum(torch.tanh(self.ln(x)), dim=-1)",
                                   "torch.randn(32, 64, 256)"),
    "cosine_sim_softplus_rowmax": _task("self.w = nn.Parameter(torch.randn(1, 512))",
                                        "s = F.cosine_similarity(x, self.w, dim=-1)\nreturn F.softplus(s).unsqueeze(-1) * x.amax(dim=-1, keepdim=True)",
                                        "torch.randn(128, 512)"),
    "pixel_shuffle_instnorm_sigmoid": _task("self.n = nn.InstanceNorm2d(4)",
                                            "return torch.sigmoid(self.n(F.pixel_shuffle(x, 2)))",
                                            "torch.randn(16, 16, 32, 32)"),
    "atan2_residual_logcumsumexp": _task("", "return torch.logcumsumexp(torch.atan2(x, y) + x, dim=1)",
                                         "torch.randn(64, 1024), torch.randn(64, 1024)", ", y"),
    "rmsnorm_glu_clamp": _task("self.n = nn.RMSNorm(512)", "return torch.clamp(F.glu(self.n(x), dim=-1), -0.5, 0.5)",
                               "torch.randn(64, 512)"),
    "avgpool1d_erf_var": _task("", "h = torch.erf(F.avg_pool1d(x, 3, 1, 1))\nreturn h - h.var(dim=-1, keepdim=True)",
                               "torch.randn(32, 16, 256)"),
    "grouped_linear_hardshrink_norm": _task("self.a = nn.Linear(128, 128)\nself.b = nn.Linear(128, 64)",
                                            "h = F.hardshrink(self.a(x), 0.3)\nreturn F.normalize(self.b(h) * h[:, :64], dim=-1)",
                                            "torch.randn(256, 128)"),
    "unfold_bilinear_logsigmoid": _task("self.bl = nn.Bilinear(32, 32, 16)",
                                        "return F.logsigmoid(self.bl(x, torch.flip(x, dims=[-1])))",
                                        "torch.randn(512, 32)"),
}


def _file(problems: Path, name: str) -> str:
    return (problems / name).read_text()


def planted(problems: Path) -> dict[str, tuple[str, str]]:
    """8 near-copies written by hand: (benchmark file they copy, source). Each is skipped where its
    original is not in the folder."""
    out = {}
    specs = [
        ("l2_p59.py", lambda s: silu(rename(s))),                               # synthesiser-style rewrite
        ("l3_p1.py", lambda s: alias(rename(s))),                               # Model = DenseStack
        ("l1_p19.py", lambda s: noop(s)),                                       # x * 1.0 in a 1-op task
        ("l2_p1.py", lambda s: subclass(reorder(s))),
        ("l2_p12.py", lambda s: helper(const_noop(s) or s)),
        ("l1_p23.py", lambda s: torch_to_F(resize(s) or s) or s),
        ("l2_p40.py", lambda s: rename(noop(s) or s)),
        ("l3_p11.py", lambda s: all_edits(s)),
    ]
    for name, edit in specs:
        if (problems / name).exists():
            out[f"planted:{name}"] = (name, edit(_file(problems, name)))
    return out
