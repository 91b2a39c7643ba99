"""The seed-operator catalog: operators crawled from torch (and transformers when installed).

Every seed is found by probing, not listed by hand: a constructor or function signature from
torch's own registries (`torch.nn` classes, `torch.overrides.get_testing_overrides()` for
functional and tensor ops, `op_db` sample inputs where the testing package imports) is filled
from a table of parameter-name rules, then run on small inputs of ranks 2-5. A seed is kept only
if, on at least one rank, it returns one finite float32 tensor, differs from its input, depends
on its input, leaves the RNG untouched, gives the same result twice and still runs when the batch
doubles. The record keeps how to build it (`SeedOp`), the ranks it accepted, and provenance.

What is not covered: ops whose inputs are integer (embedding indices), complex or boolean; ops
whose second tensor must have a different shape from the first (matmul of non-square shapes);
ops whose parameters no rule names (they are counted in `CrawlReport.skipped`).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .seeds import ArgSpec, CrawlReport, SeedOp, _skip, base_namespace  # noqa: F401 (the catalog's records)
from .worker import random_ops

PROBE_SHAPES: dict[int, tuple[int, ...]] = {2: (4, 64), 3: (4, 16, 32), 4: (2, 16, 12, 12), 5: (2, 8, 6, 6, 6)}
MAX_GROWTH = 64   # an op may not make its output more than this many times larger than its input


# -- parameter-name rules -------------------------------------------------------------------------

TENSOR_NAMES = {"input", "self", "x", "a", "A", "tensor", "query", "key", "other", "target", "tensor1",
                "tensor2", "input1", "input2", "x1", "x2", "y", "end", "mat2", "exponent"}


def rule_for(param: str, params: set[str], kind: str) -> ArgSpec | None:
    """The argument rule for a parameter name; None if no rule names it."""
    if param == "value" and "key" in params:
        return ArgSpec(name=param, tensor=True)
    if param in TENSOR_NAMES and kind == "function":
        return ArgSpec(name=param, tensor=True)
    fixed: dict[str, ArgSpec] = {
        "in_features": ArgSpec(name=param, from_dim=-1),
        "in1_features": ArgSpec(name=param, from_dim=-1),
        "in2_features": ArgSpec(name=param, from_dim=-1),
        "out_features": ArgSpec(name=param, choices=(64, 128, 256, 512)),
        "num_features": ArgSpec(name=param, from_dim=1),
        "num_channels": ArgSpec(name=param, from_dim=1),
        "in_channels": ArgSpec(name=param, from_dim=1),
        "out_channels": ArgSpec(name=param, choices=(16, 32, 64)),
        "normalized_shape": ArgSpec(name=param, from_dim=-1, as_tuple=kind == "function"),
        "embed_dim": ArgSpec(name=param, from_dim=-1),
        "d_model": ArgSpec(name=param, from_dim=-1),
        "input_size": ArgSpec(name=param, from_dim=-1),
        "hidden_size": ArgSpec(name=param, choices=(32, 64, 128)),
        "num_groups": ArgSpec(name=param, choices=(2, 4, 8, 1), divides_dim=1),
        "num_heads": ArgSpec(name=param, choices=(2, 4, 8, 1), divides_dim=-1),
        "nhead": ArgSpec(name=param, choices=(2, 4, 8, 1), divides_dim=-1),
        "kernel_size": ArgSpec(name=param, choices=(3, 2) if kind == "module" else (2, 3)),
        "output_size": ArgSpec(name=param, choices=(2, 4, 1)),
        "dim": ArgSpec(name=param, value=-1),
        "upscale_factor": ArgSpec(name=param, value=2),
        "downscale_factor": ArgSpec(name=param, value=2),
        "padding": ArgSpec(name=param, value=1),
        "pad": ArgSpec(name=param, value=(1, 1)),
        "value": ArgSpec(name=param, value=0.5),
        "threshold": ArgSpec(name=param, value=0.1),
        "size": ArgSpec(name=param, value=3),
        "groups": ArgSpec(name=param, value=2),
        "lambd": ArgSpec(name=param, value=0.5),
        "start_dim": ArgSpec(name=param, value=1),
        "dims": ArgSpec(name=param, value=(-1,)),
        "k": ArgSpec(name=param, value=4),
        "repeats": ArgSpec(name=param, value=2),
        "norm_type": ArgSpec(name=param, value=2.0),
    }
    return fixed.get(param)


# class-specific keyword arguments: constructor choices that make the module usable or
# deterministic as an operator (dropout off inside layers, batch-first sequences)
CLASS_KWARGS: dict[str, dict[str, Any]] = {
    "Upsample": {"scale_factor": 2.0, "mode": "nearest"},
    "UpsamplingNearest2d": {"scale_factor": 2.0},
    "UpsamplingBilinear2d": {"scale_factor": 2.0},
    "MultiheadAttention": {"batch_first": True},
    "TransformerEncoderLayer": {"dropout": 0.0, "batch_first": True},
    "TransformerDecoderLayer": {"dropout": 0.0, "batch_first": True},
    "RNN": {"batch_first": True}, "LSTM": {"batch_first": True}, "GRU": {"batch_first": True},
    "Softmax": {"dim": -1}, "Softmin": {"dim": -1}, "LogSoftmax": {"dim": -1},
}
# losses keep one value per element: a scalar output is degenerate for the judge (any constant
# passes its tolerance) and ends every chain
LOSS_KWARGS: dict[str, Any] = {"reduction": "none"}
SKIP_CLASSES = {"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
                "Container", "Identity", "Transformer", "TransformerEncoder", "TransformerDecoder", "RNNBase",
                "RNNCellBase", "Buffer", "Parameter", "UninitializedParameter", "UninitializedBuffer"}
# function names that are allocation, bookkeeping or trivially aliasing rather than computation
SKIP_FUNCTION_PREFIXES = ("_", "is_", "can_", "result_type", "promote_types", "empty", "zeros", "ones", "full",
                          "rand", "normal", "poisson", "bernoulli", "multinomial", "detach", "clone", "alias",
                          "numel", "nonzero", "where", "unique", "split", "chunk", "unbind", "tensor_split",
                          "broadcast", "meshgrid", "atleast", "equal", "allclose", "isclose", "resize",
                          "as_strided", "set_", "sym_", "quantize", "dequantize", "fake_quantize", "q_",
                          "sparse", "to_sparse", "native_", "fbgemm", "mkldnn", "cudnn", "miopen", "segment",
                          "histogram", "bincount", "combinations", "cartesian_prod", "block_diag", "stft",
                          "istft", "embedding", "ctc_", "pdist", "kron", "vander", "tril_indices",
                          "triu_indices", "constant_pad_nd", "lobpcg", "pca_lowrank", "svd_lowrank")
PROBE_SLOW_S = 0.25   # an op this slow on the tiny probe inputs is a solver, not an operator


# -- probing --------------------------------------------------------------------------------------

class _Reject(Exception):
    pass


def _inputs(shape: tuple[int, ...], arity: int, domain: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(shape, generator=g) for _ in range(arity)]
    return [x.abs() + 1.0 for x in xs] if domain == "positive" else xs


def _pick(out: Any, index: int | None) -> Any:
    if index is not None:
        return out[index]
    return out


def _run(call: Callable, xs: list[torch.Tensor], index: int | None) -> torch.Tensor:
    with torch.no_grad():
        out = _pick(call(*xs), index)
    if not isinstance(out, torch.Tensor):
        raise _Reject(f"returns {type(out).__name__}, not a tensor")
    return out


def _tuple_index(call: Callable, xs: list[torch.Tensor]) -> int | None:
    with torch.no_grad():
        out = call(*xs)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return 0
    return None


def probe(seed: SeedOp, rank: int) -> SeedOp:
    """Run `seed` on a probe input of `rank`; return it with what was learned, or raise _Reject."""
    shape = PROBE_SHAPES[rank]
    ns = base_namespace(seed.helper_source)
    last = "no domain worked"
    for domain in ("real", "positive"):
        try:
            values = seed.resolve(shape, None)
            torch.manual_seed(0)
            call = seed.build(values, ns)
            xs = _inputs(shape, seed.arity, domain, 1)
            index = _tuple_index(call, xs) if seed.output_index is None else seed.output_index
            state = torch.get_rng_state()
            t0 = time.perf_counter()
            out = _run(call, xs, index)
            if time.perf_counter() - t0 > PROBE_SLOW_S:
                raise _Reject("too slow on probe inputs")
            if random_ops(call, xs):
                raise _Reject("random: runs ops tagged nondeterministic_seeded")
            if not torch.equal(state, torch.get_rng_state()):
                raise _Reject("random: consumes the RNG")
            if out.dtype != torch.float32 or out.numel() == 0:
                raise _Reject(f"output dtype {out.dtype} or empty")
            if out.numel() > MAX_GROWTH * xs[0].numel():
                raise _Reject("output far larger than its input")
            if not bool(torch.isfinite(out).all()):
                raise _Reject("non-finite output")
            if out.shape == xs[0].shape and torch.equal(out, xs[0]):
                raise _Reject("identity on its input")
            again = _run(call, xs, index)
            if again.shape != out.shape or not torch.equal(again, out):
                raise _Reject("random: two runs differ")
            other = _run(call, _inputs(shape, seed.arity, domain, 2), index)
            if other.shape == out.shape and torch.equal(other, out):
                raise _Reject("input-independent output")
            big = (shape[0] * 2, *shape[1:])
            torch.manual_seed(0)
            call2 = seed.build(seed.resolve(big, None), ns)
            _run(call2, _inputs(big, seed.arity, domain, 3), index)
            train_eval_same = True
            has_params = False
            if isinstance(call, nn.Module):
                has_params = any(True for _ in call.parameters())
                call.eval()
                train_eval_same = torch.equal(_run(call, xs, index), out)
            return seed.model_copy(update=dict(
                output_index=index, domain=domain, ranks=(rank,), has_params=has_params,
                train_eval_same=train_eval_same, shape_preserving=tuple(out.shape) == tuple(xs[0].shape)))
        except _Reject as exc:
            last = str(exc)
            if last.startswith("random") or "identity" in last or "independent" in last:
                break
        except Exception as exc:  # the probe is how we learn what an op accepts
            last = f"{type(exc).__name__}"
    raise _Reject(last)


def probe_all_ranks(seed: SeedOp, ranks: Iterable[int]) -> SeedOp:
    found: SeedOp | None = None
    ok: list[int] = []
    last = ""
    for rank in ranks:
        try:
            got = probe(seed, rank)
        except _Reject as exc:
            last = str(exc)
            if last.startswith("random"):
                break
            continue
        ok.append(rank)
        if found is None or (found.domain == "positive" and got.domain == "real"):
            found = got
    if found is None:
        raise _Reject(last or "no rank accepted")
    src = class_source(found.model_copy(update={"ranks": tuple(ok)}))
    return found.model_copy(update={"ranks": tuple(ok), "class_source": src})


def class_source(seed: SeedOp) -> str:
    """The seed alone as a KernelBench module (class Model with __init__/forward, input constructors)."""
    rank = seed.ranks[0]
    shape = PROBE_SHAPES[rank]
    values = seed.resolve(shape, None)
    ins = [f"x{i}" for i in range(seed.arity)]
    init = seed.init_line("op", values)
    lines = ["import math", "import torch", "import torch.nn as nn", "import torch.nn.functional as F", ""]
    if seed.helper_source:
        lines += [seed.helper_source.rstrip(), "", ""]
    prov = ", ".join(f"{k}={v}" for k, v in sorted(seed.provenance.items()))
    lines += ["class Model(nn.Module):", f'    """Seed operator {seed.name} ({prov})."""', "",
              "    def __init__(self):", "        super().__init__()"]
    if init:
        lines.append(f"        {init}")
    lines += ["", f"    def forward(self, {', '.join(ins)}):"]
    if seed.domain == "positive":
        lines += [f"        {v} = {v}.abs() + 1.0" for v in ins]
    lines += [f"        return {seed.call_expr('op', ins, values)}", "", "",
              "def get_inputs():", f"    return [{', '.join(f'torch.randn{shape}' for _ in ins)}]", "", "",
              "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)


# -- crawlers -------------------------------------------------------------------------------------

def _prov(source: str, qualname: str, **extra: str) -> dict[str, str]:
    return {"source": source, "qualname": qualname, "torch": torch.__version__, **extra}


def _forward_arity(cls: type) -> int:
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    req = [p for p in params if p.default is inspect.Parameter.empty
           and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params) and not req:
        return 1
    return len(req)


def nn_module_specs(report: CrawlReport) -> Iterable[SeedOp]:
    """Every public `torch.nn` module class whose constructor the rules can fill."""
    for name in sorted(dir(nn)):
        cls = getattr(nn, name)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)) or name.startswith("_"):
            continue
        report.tried += 1
        if name in SKIP_CLASSES or name.startswith("Lazy") or "Quant" in name:
            _skip(report, "container, lazy or identity class")
            continue
        try:
            sig = inspect.signature(cls.__init__)
            arity = _forward_arity(cls)
        except (TypeError, ValueError):
            _skip(report, "no signature")
            continue
        if not 1 <= arity <= 3:
            _skip(report, f"forward takes {arity} tensors")
            continue
        params = [p for p in list(sig.parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        names = {p.name for p in params}
        args: list[ArgSpec] = []
        unresolved = None
        for p in params:
            if p.default is not inspect.Parameter.empty:
                continue
            rule = rule_for(p.name, names, "module")
            if rule is None:
                unresolved = p.name
                break
            args.append(rule)
        if unresolved:
            _skip(report, "constructor parameter without a rule")
            continue
        for k, v in {**LOSS_KWARGS, **CLASS_KWARGS.get(name, {})}.items():
            if k in names:
                args.append(ArgSpec(name=k, value=v, keyword=True))
        yield SeedOp(name=f"nn.{name}", kind="module", target=f"nn.{name}", args=tuple(args), arity=arity,
                     provenance=_prov("torch.nn", f"{cls.__module__}.{cls.__qualname__}"))


def _function_namespaces() -> list[tuple[Any, str, str]]:
    return [(torch, "torch", "torch"), (F, "F", "torch.nn.functional"), (torch.special, "torch.special", "torch.special"),
            (torch.linalg, "torch.linalg", "torch.linalg"), (torch.fft, "torch.fft", "torch.fft")]


def function_specs(report: CrawlReport) -> Iterable[SeedOp]:
    """Functional and tensor ops from `torch.overrides.get_testing_overrides()` (torch's registry of
    every overridable function with a Python signature)."""
    overrides = torch.overrides.get_testing_overrides()
    seen: set[str] = set()
    for module, prefix, modname in _function_namespaces():
        for fn, lam in overrides.items():
            name = getattr(fn, "__name__", "")
            if not name or getattr(module, name, None) is not fn or f"{prefix}.{name}" in seen:
                continue
            seen.add(f"{prefix}.{name}")
            report.tried += 1
            if name.endswith("_") or name.startswith(SKIP_FUNCTION_PREFIXES) or "dropout" in name \
                    or name.endswith("_like") or "backward" in name:
                _skip(report, "allocation, random, in-place or bookkeeping function")
                continue
            spec = _function_spec(fn, lam, prefix, modname, name)
            if spec is None:
                _skip(report, "function parameter without a rule")
                continue
            yield spec


def _function_spec(fn, lam, prefix: str, modname: str, name: str) -> SeedOp | None:
    try:
        params = [p for p in inspect.signature(lam).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    names = {p.name for p in params}
    args: list[ArgSpec] = []
    for i, p in enumerate(params):
        required = p.default is inspect.Parameter.empty
        if i == 0:
            args.append(ArgSpec(name=p.name, tensor=True))
            continue
        if not required:
            if p.name == "dim" and all(a.name != "dim" for a in args):
                args.append(ArgSpec(name="dim", value=-1, keyword=True))
            elif p.name in LOSS_KWARGS:
                args.append(ArgSpec(name=p.name, value=LOSS_KWARGS[p.name], keyword=True))
            continue
        rule = rule_for(p.name, names, "function")
        if rule is None:
            return None
        args.append(rule)
    arity = sum(a.tensor for a in args)
    if arity > 3:
        return None
    return SeedOp(name=f"{prefix}.{name}", kind="function", target=f"{prefix}.{name}", args=tuple(args),
                  arity=arity, provenance=_prov(modname, f"{modname}.{name}", registry="torch.overrides"))


def op_db_specs(report: CrawlReport, known: set[str]) -> Iterable[SeedOp]:
    """Extra call forms from torch's OpInfo database (`op_db` sample inputs), when importable.

    `torch.testing._internal` needs the `expecttest` package; without it this yields nothing.
    Only samples whose extra arguments are Python scalars or tuples are used (tensors of other
    shapes would not fit the composer's same-shape convention).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # optional registry: a missing test dependency only means fewer call forms
        return
    for info in op_db:
        fn = info.op
        name = getattr(fn, "__name__", "")
        prefix = next((p for m, p, _ in _function_namespaces() if name and getattr(m, name, None) is fn), None)
        if prefix is None or info.variant_test_name or name.endswith("_") or "dropout" in name:
            continue
        key = f"{prefix}.{name}"
        if key in known or name.startswith(SKIP_FUNCTION_PREFIXES):
            continue
        try:
            samples = info.sample_inputs("cpu", torch.float32, requires_grad=False)
            sample = next(s for s in samples if isinstance(s.input, torch.Tensor) and s.input.dim() >= 2
                          and all(isinstance(a, (int, float, bool, tuple)) for a in s.args)
                          and all(isinstance(v, (int, float, bool, str, tuple)) for v in s.kwargs.values()))
        except StopIteration:
            continue
        except Exception:  # some OpInfo sample generators need CUDA or optional packages
            continue
        report.tried += 1
        args = [ArgSpec(name="input", tensor=True)]
        args += [ArgSpec(name=f"arg{i}", value=a) for i, a in enumerate(sample.args)]
        args += [ArgSpec(name=k, value=v, keyword=True) for k, v in sample.kwargs.items()]
        known.add(key)
        yield SeedOp(name=key, kind="function", target=key, args=tuple(args), arity=1,
                     provenance=_prov("torch.op_db", f"op_db:{info.name}", registry="op_db"))


def crawl(*, include_transformers: bool = True, use_op_db: bool = True,
          ranks: tuple[int, ...] = (2, 3, 4, 5)) -> tuple[list[SeedOp], CrawlReport]:
    """Crawl every source and probe each candidate seed. Deterministic for a torch version."""
    report = CrawlReport()
    seeds: list[SeedOp] = []
    names: set[str] = set()

    def consider(specs: Iterable[SeedOp]) -> None:
        for spec in specs:
            if spec.name in names:
                continue
            try:
                seed = probe_all_ranks(spec, ranks)
            except _Reject as exc:
                _skip(report, f"probe: {_reason_class(str(exc))}")
                continue
            names.add(seed.name)
            seeds.append(seed)
            src = seed.provenance.get("source", "")
            report.sources[src] = report.sources.get(src, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            consider(nn_module_specs(report))
            consider(function_specs(report))
            if use_op_db:
                consider(op_db_specs(report, set(names)))
            if include_transformers:
                from .hf import transformers_specs

                consider(transformers_specs(report))
        finally:
            torch.set_num_threads(threads)
    seeds = dedupe(seeds, report)
    report.kept = len(seeds)
    return seeds, report


def behaviour_fingerprint(seed: SeedOp) -> str:
    """A hash of what `seed` computes: its outputs on two fixed input sets at every rank it accepts
    (weights drawn under a fixed seed), quantised so that two implementations of one formula that
    round differently in the last bits still agree. The second set holds large values and ties
    (randn * 8, rounded): ReLU and ReLU6, or a minimum and a mode, agree on plain randn inputs.
    Equal fingerprints: the same operator."""
    import hashlib

    h = hashlib.sha256(f"{seed.arity}|{seed.domain}|{seed.ranks}|{seed.output_index}".encode())
    ns = base_namespace(seed.helper_source)
    for rank in seed.ranks:
        shape = PROBE_SHAPES[rank]
        plain = _inputs(shape, seed.arity, seed.domain, 1)
        wide = [torch.round(x * 8) for x in _inputs(shape, seed.arity, "real", 2)]
        if seed.domain == "positive":
            wide = [x.abs() + 1.0 for x in wide]
        for k, xs in enumerate((plain, wide)):
            try:
                torch.manual_seed(0)
                call = seed.build(seed.resolve(shape, None), ns)
                out = torch.nan_to_num(_run(call, xs, seed.output_index).double(), nan=7.0, posinf=9.0, neginf=-9.0)
            except Exception as exc:  # noqa: BLE001 - refused on these inputs: that is part of its behaviour
                h.update(f"{rank}.{k}:error:{type(exc).__name__}".encode())
                continue
            scale = float(out.abs().max()) or 1.0
            q = torch.round(out / scale * 2**12).to(torch.int64)
            h.update(f"{rank}.{k}:{tuple(out.shape)}:{scale:.4g}:".encode())
            h.update(q.numpy().tobytes())
    return h.hexdigest()[:20]


def dedupe(seeds: list[SeedOp], report: CrawlReport | None = None) -> list[SeedOp]:
    """Identical seeds (the same fingerprint: aliases such as `torch.abs`/`torch.absolute`, one
    RMSNorm copied into many model families) merged into the first one crawled; the others' names
    and qualnames stay in its provenance (`same_as`, `same_as_qualnames`)."""
    first: dict[str, int] = {}
    kept: list[SeedOp] = []
    merged: dict[int, list[SeedOp]] = {}
    for seed in seeds:
        fp = behaviour_fingerprint(seed)
        if fp in first:
            merged.setdefault(first[fp], []).append(seed)
            continue
        first[fp] = len(kept)
        kept.append(seed)
    for i, same in merged.items():
        prov = dict(kept[i].provenance)
        prov["same_as"] = ", ".join(s.name for s in same)
        prov["same_as_qualnames"] = ", ".join(s.provenance.get("qualname", s.name) for s in same)
        kept[i] = kept[i].model_copy(update={"provenance": prov})
    if report is not None:
        report.merged = len(seeds) - len(kept)
    return kept


def _reason_class(message: str) -> str:
    for key in ("random", "identity", "input-independent", "non-finite", "dtype", "tensor", "larger"):
        if key in message:
            return key
    return "does not run on probe inputs"


# -- the catalog file -----------------------------------------------------------------------------

def write_catalog(path: str | Path, seeds: list[SeedOp]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for seed in seeds:
            fh.write(seed.model_dump_json() + "\n")
    tmp.replace(path)


def read_catalog(path: str | Path) -> list[SeedOp]:
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(SeedOp.model_validate_json(line))
    return out


def load_or_crawl(path: str | Path, timeout_s: float = 1800.0) -> list[SeedOp]:
    """Read the catalog at `path`, crawling into it first if it does not exist.

    The crawl runs in a child process: probing calls hundreds of torch functions, and importing
    torch's testing registry (`op_db`) changes global torch flags (it freezes the cuDNN/TF32
    settings the judge sets), so none of it may happen in the pipeline's own process.
    """
    path = Path(path)
    if not path.exists():
        proc = subprocess.run([sys.executable, "-m", "cuda_agent.synth.catalog", str(path)], capture_output=True,
                              text=True, timeout=timeout_s)
        if proc.returncode != 0 or not path.exists():
            raise RuntimeError(f"seed-operator crawl failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return read_catalog(path)


def main(argv: list[str]) -> int:
    """python -m cuda_agent.synth.catalog OUT.jsonl [--no-transformers] [--no-op-db]"""
    if not argv or argv[0].startswith("-"):
        print(main.__doc__, file=sys.stderr)
        return 2
    seeds, report = crawl(include_transformers="--no-transformers" not in argv, use_op_db="--no-op-db" not in argv)
    write_catalog(argv[0], seeds)
    print(report.model_dump_json(indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
