"""Seed operators from `transformers` building blocks (only when transformers imports).

A synthesized task must run without transformers, so each block's source is inlined: the class
body is taken with `inspect.getsource`, its decorators dropped (hub-kernel hooks), and probed in a
namespace holding only torch, nn, F and math, plus two small shims: `ACT2FN` (activation name ->
torch module) and, for blocks built from a config object, a subclass taking plain sizes.
What is covered: the activation registry (`ACT2CLS`), RMSNorm/LayerNorm variants, rotary
position embeddings (`rotate_half` + `apply_rotary_pos_emb`) and gated MLP blocks of common
decoder families. Not covered: attention classes (they depend on cache objects, masks and the
attention-function registry); `nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and
`F.scaled_dot_product_attention` come from the torch crawl instead.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterable

from cuda_agent import pysource

from .seeds import ArgSpec, CrawlReport, SeedOp, _skip

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "t5", "mixtral", "cohere",
            "granite", "starcoder2", "gpt_neox", "falcon")
ACT_SHIM = '''ACT2FN = {"silu": nn.SiLU(), "swish": nn.SiLU(), "gelu": nn.GELU(), "relu": nn.ReLU(),
          "gelu_new": nn.GELU(approximate="tanh"), "gelu_pytorch_tanh": nn.GELU(approximate="tanh")}'''
CONFIG_DEFAULTS = {"hidden_act": "silu", "hidden_activation": "gelu_pytorch_tanh", "mlp_bias": False,
                   "pretraining_tp": 1, "dense_act_fn": "relu", "is_gated_act": True, "d_model": None,
                   "d_ff": None, "dropout_rate": 0.0, "activation_function": "gelu_new", "bias": False}


def _source_without_decorators(obj) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None
    tree = pysource.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            node.decorator_list = []
        if isinstance(node, ast.FunctionDef):   # annotations name types a task file does not import
            node.returns = None
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg,
                      node.args.kwarg]:
                if a is not None:
                    a.annotation = None
    return ast.unparse(tree)


def _prov(qualname: str) -> dict[str, str]:
    import torch
    import transformers

    return {"source": "transformers", "qualname": qualname, "transformers": transformers.__version__,
            "torch": torch.__version__}


def transformers_specs(report: CrawlReport) -> Iterable[SeedOp]:
    try:
        from transformers import activations
    except Exception:  # optional dependency: without it the catalog is torch-only
        return
    for key, entry in sorted(activations.ACT2CLS.items()):
        cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
        if not cls.__module__.startswith("transformers"):
            continue   # torch classes are already crawled from torch.nn
        report.tried += 1
        helper = _source_without_decorators(cls)
        if helper is None:
            _skip(report, "transformers: no source")
            continue
        args = tuple(ArgSpec(name=k, value=v, keyword=True) for k, v in kwargs.items())
        yield SeedOp(name=f"hf.act.{key}", kind="module", target=cls.__name__, args=args, helper_source=helper,
                     provenance=_prov(f"{cls.__module__}.{cls.__qualname__} (ACT2CLS[{key!r}])"))
    for family in FAMILIES:
        try:
            mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except Exception:  # families differ between transformers versions
            continue
        for name, obj in sorted(vars(mod).items()):
            if not isinstance(obj, type) or obj.__module__ != mod.__name__:
                continue
            if name.endswith(("RMSNorm", "LayerNorm")):
                spec = _norm_spec(obj, report)
            elif name.endswith("MLP") or name.endswith("DenseGatedActDense"):
                spec = _mlp_spec(obj, report)
            else:
                continue
            if spec is not None:
                yield spec
        rot = getattr(mod, "apply_rotary_pos_emb", None)
        half = getattr(mod, "rotate_half", None)
        if rot is not None and half is not None:
            report.tried += 1
            spec = _rotary_spec(family, half, rot)
            if spec is not None:
                yield spec


def _norm_spec(cls, report: CrawlReport) -> SeedOp | None:
    report.tried += 1
    helper = _source_without_decorators(cls)
    if helper is None:
        return None
    params = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
              if p.default is inspect.Parameter.empty]
    if len(params) != 1:
        _skip(report, "transformers: norm needs more than a size")
        return None
    return SeedOp(name=f"hf.{cls.__name__}", kind="module", target=cls.__name__,
                  args=(ArgSpec(name=params[0].name, from_dim=-1),), helper_source=helper,
                  provenance=_prov(f"{cls.__module__}.{cls.__qualname__}"))


def _mlp_spec(cls, report: CrawlReport) -> SeedOp | None:
    report.tried += 1
    helper = _source_without_decorators(cls)
    if helper is None:
        return None
    params = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
              if p.default is inspect.Parameter.empty]
    if params != ["config"]:
        _skip(report, "transformers: MLP constructor is not (config)")
        return None
    fields = sorted(set(re.findall(r"config\.(\w+)", helper)))
    size_fields = {"hidden_size": "hidden_size", "d_model": "hidden_size", "n_embd": "hidden_size",
                   "intermediate_size": "intermediate_size", "d_ff": "intermediate_size"}
    assigns = []
    for f in fields:
        if f in size_fields:
            assigns.append(f"{f}={size_fields[f]}")
        elif f in CONFIG_DEFAULTS and CONFIG_DEFAULTS[f] is not None:
            assigns.append(f"{f}={CONFIG_DEFAULTS[f]!r}")
        else:
            _skip(report, "transformers: MLP reads a config field without a default")
            return None
    wrapper = (f"class {cls.__name__}Block({cls.__name__}):\n"
               f"    def __init__(self, hidden_size, intermediate_size):\n"
               f"        super().__init__(types.SimpleNamespace({', '.join(assigns)}))\n")
    helper = f"import types\n{ACT_SHIM}\n\n\n{helper}\n\n\n{wrapper}"
    return SeedOp(name=f"hf.{cls.__name__}", kind="module", target=f"{cls.__name__}Block",
                  args=(ArgSpec(name="hidden_size", from_dim=-1),
                        ArgSpec(name="intermediate_size", choices=(128, 256, 512))),
                  helper_source=helper, provenance=_prov(f"{cls.__module__}.{cls.__qualname__}"))


def _rotary_spec(family: str, half, rot) -> SeedOp | None:
    parts = [_source_without_decorators(half), _source_without_decorators(rot)]
    if None in parts:
        return None
    wrapper = '''class RotaryEmbedding(nn.Module):
    """Applies rotary position embeddings over the second-to-last (sequence) dimension."""

    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        t = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)
        emb = torch.outer(t, self.inv_freq)
        emb = torch.cat((emb, emb), dim=-1)
        return apply_rotary_pos_emb(x, x, emb.cos(), emb.sin(), unsqueeze_dim=0)[0]
'''
    helper = "\n\n\n".join([*parts, wrapper])
    return SeedOp(name=f"hf.{family}.rotary", kind="module", target="RotaryEmbedding",
                  args=(ArgSpec(name="head_dim", from_dim=-1),), helper_source=helper,
                  provenance=_prov(f"{rot.__module__}.apply_rotary_pos_emb"))
