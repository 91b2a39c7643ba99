"""The records of the seed-operator catalog: how a seed is built and called (`SeedOp`, `ArgSpec`),
what a crawl dropped (`CrawlReport`), and the namespace seeds are evaluated in.

Kept apart from the crawl (`catalog`) so that the crawl's optional sources (`hf`) and the composer
use them without importing the crawl, and no module of the package imports one that imports it back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator


class ArgSpec(BaseModel):
    """How one argument is chosen for a given input shape. Exactly one way applies:
    a tensor input, a dimension of the input, one of `choices` (the composer's RNG picks; the
    crawl probes the first), or the literal `value`."""

    model_config = ConfigDict(frozen=True)

    name: str
    tensor: bool = False
    from_dim: int | None = None
    choices: tuple[Any, ...] = ()
    divides_dim: int | None = None     # keep only choices that divide shape[divides_dim]
    value: Any = None
    as_tuple: bool = False             # wrap the resolved value as a 1-tuple
    keyword: bool = False

    @field_validator("value", "choices", mode="after")
    @classmethod
    def _tuples(cls, v: Any) -> Any:
        """JSON has no tuples: read lists back as tuples so a catalog file renders the same code."""
        return _as_tuple(v)

    def resolve(self, shape: tuple[int, ...], rng: random.Random | None) -> Any:
        if self.from_dim is not None:
            v: Any = int(shape[self.from_dim])
        elif self.choices:
            opts = list(self.choices)
            if self.divides_dim is not None:
                opts = [c for c in opts if shape[self.divides_dim] % c == 0] or [1]
            v = opts[0] if rng is None else rng.choice(opts)
        else:
            v = self.value
        return (v,) if self.as_tuple else v


def _as_tuple(v: Any) -> Any:
    return tuple(_as_tuple(x) for x in v) if isinstance(v, (list, tuple)) else v


class SeedOp(BaseModel):
    """One seed operator: how to build and call it, what it accepts, where it came from."""

    model_config = ConfigDict(frozen=True)

    name: str                           # "nn.Conv2d", "F.gelu", "torch.tanh", "hf.LlamaRMSNorm"
    kind: Literal["module", "function"]
    target: str                         # the expression called: class or function
    args: tuple[ArgSpec, ...] = ()      # module: constructor args; function: every call arg in order
    arity: int = 1                      # tensor inputs
    output_index: int | None = None     # the op returns a tuple: take this element
    ranks: tuple[int, ...] = ()         # input ranks it accepted
    domain: Literal["real", "positive"] = "real"   # positive: inputs pass through abs()+1 first
    helper_source: str = ""             # source the target needs inlined (transformers blocks)
    shape_preserving: bool = False
    has_params: bool = False
    train_eval_same: bool = True
    provenance: dict[str, str] = Field(default_factory=dict)
    class_source: str = ""              # the seed alone as a KernelBench module

    # -- rendering (shared by the catalog's class sources and the composer) -----------------
    def resolve(self, shape: tuple[int, ...], rng: random.Random | None) -> list[Any]:
        return [None if a.tensor else a.resolve(shape, rng) for a in self.args]

    def init_line(self, attr: str, values: list[Any]) -> str | None:
        if self.kind != "module":
            return None
        return f"self.{attr} = {self.target}({_render_args(self.args, values, [])})"

    def call_expr(self, attr: str, in_vars: list[str], values: list[Any]) -> str:
        if self.kind == "module":
            expr = f"self.{attr}({', '.join(in_vars)})"
        else:
            expr = f"{self.target}({_render_args(self.args, values, in_vars)})"
        return expr if self.output_index is None else f"{expr}[{self.output_index}]"

    def build(self, values: list[Any], namespace: dict | None = None) -> Callable:
        """A callable (module or closure) for `values`; used by probes and shape inference."""
        ns = namespace if namespace is not None else base_namespace(self.helper_source)
        if self.kind == "module":
            return eval(f"{self.target}({_render_args(self.args, values, [])})", ns)
        names = [f"_t{i}" for i in range(self.arity)]
        fn = eval(f"lambda {', '.join(names)}: {self.call_expr('', names, values)}", ns)
        return fn


def _render_args(args: Iterable[ArgSpec], values: list[Any], tensors: list[str]) -> str:
    parts, it = [], iter(tensors)
    for spec, v in zip(args, values):
        text = next(it) if spec.tensor else repr(v)
        parts.append(f"{spec.name}={text}" if spec.keyword else text)
    return ", ".join(parts)


def base_namespace(helper_source: str = "") -> dict:
    ns: dict = {"torch": torch, "nn": nn, "F": F, "math": math}
    if helper_source:
        # dont_inherit: this module's `from __future__ import annotations` must not leak into
        # the helper, or it would run here and fail inside a task file
        exec(compile(helper_source, "<seed helper>", "exec", dont_inherit=True), ns)
    return ns


class CrawlReport(BaseModel):
    """What a crawl tried and why it dropped what it dropped (reason -> count)."""

    tried: int = 0
    kept: int = 0
    skipped: dict[str, int] = Field(default_factory=dict)
    sources: dict[str, int] = Field(default_factory=dict)   # provenance source -> seeds kept (before merging)
    merged: int = 0             # seeds identical in behaviour to an earlier one, merged into it


def _skip(report: CrawlReport, reason: str) -> None:
    report.skipped[reason] = report.skipped.get(reason, 0) + 1
