"""Composition: chain up to 5 seed operators into one KernelBench-format `Model`.

The programmatic composer needs no model. For a seed it draws the number of ops, the first op and
its input shape, then grows the chain one op at a time: a candidate op is instantiated on the
`meta` device and run on a meta tensor of the current shape (shape inference by torch itself,
no allocation), and kept only if that works. Rank changes are bridged by glue (`flatten(-2)`,
`unsqueeze(1)`); ops with a second tensor take an earlier value of the same shape (a residual),
a learnable parameter broadcast over the batch, or a new input. Every input's first dimension is
the module constant `BATCH`, which the runtime filter rescales; the whole chain is re-inferred
with twice the batch so that rescaling cannot break it. Each seed is probed once per rank for jumps,
poles and overflow (hazards.py): it is fed through the first operand guard that makes it safe
(`abs() + 1`, `sigmoid() + 0.5`, `tanh() * 0.9`) or not composed at all (ceil, remainder, sign).

The LLM composer shows a model the class sources of sampled seeds and asks for one module; its
output is only a candidate and goes through the same static and execution filters.
"""

from __future__ import annotations

import math
import os
import random
import re
import warnings
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.tasks import TaskError, validate_reference_source

from .hazards import GUARDS, SeedHazard, seed_hazard
from .seeds import SeedOp, base_namespace

BATCH_RE = re.compile(r"^BATCH = (\d+)[ \t]*$", re.MULTILINE)


class ComposeError(ValueError):
    """No valid composition for this seed (the pipeline records it and moves on)."""


class Composition(BaseModel):
    """A candidate task: the module source plus what made it."""

    model_config = ConfigDict(frozen=True)

    name: str
    source: str
    ops: tuple[str, ...]
    seed: int
    composer: Literal["programmatic", "llm"]
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shape: tuple[int, ...] = ()


class ComposeConfig(BaseModel):
    """Settings of the programmatic composer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_ops: int = Field(5, ge=1, le=5, description="most seed operators in one task")
    min_ops: int = Field(1, ge=1, le=5, description="fewest seed operators in one task")
    profile: Literal["cuda", "cpu"] = Field("cuda", description="starting shape sizes: GPU-sized or CPU-sized")
    max_numel: int = Field(1 << 26, description="largest tensor (elements) anywhere in the chain")
    allow_train_eval_mismatch: bool = Field(
        False, description="also draw seeds whose output differs between train and eval (BatchNorm); "
                           "the train/eval filter rejects them anyway")
    residual_prob: float = Field(0.5, description="binary ops: chance of reusing an earlier same-shape value")
    attempts: int = Field(40, description="candidate ops tried per step before giving up on the step")
    hazard_guards: bool = Field(
        True, description="probe each seed for jumps, poles and overflow on a sweep of values (hazards.py) and "
                          "feed it through the first operand guard that makes it safe, or leave it out; off: "
                          "only seeds undefined on real inputs get abs() + 1 (the composer before round three)")


# starting sizes per input rank (without the batch dimension), and batch sizes
SIZES = {
    "cuda": {2: [(f,) for f in (512, 1024, 2048, 4096, 8192)],
             3: [(t, d) for t in (64, 128, 256, 512) for d in (64, 128, 256, 512)],
             4: [(c, h, h) for c in (3, 8, 16, 32, 64) for h in (16, 32, 64, 128)],
             5: [(c, d, h, h) for c in (3, 8, 16) for d in (8, 16) for h in (16, 32, 64)]},
    "cpu": {2: [(f,) for f in (64, 128, 256, 512)],
            3: [(t, d) for t in (16, 32, 64) for d in (32, 64, 128)],
            4: [(c, h, h) for c in (3, 8, 16) for h in (8, 16, 32)],
            5: [(c, d, h, h) for c in (3, 8) for d in (4, 8) for h in (8, 16)]},
}
BATCHES = {"cuda": (8, 16, 32, 64), "cpu": (2, 4, 8)}


@dataclass
class _Value:
    var: str
    shape: tuple[int, ...]


@dataclass
class _Plan:
    """The chain as built so far, in the form the source is rendered from."""

    batch: int
    inputs: list[tuple[int, ...]] = field(default_factory=list)          # per-input shape incl. batch
    params: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    init_lines: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)   # replayable (kind, ...) for batch-scaling check


def _meta(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _infer(seed: SeedOp, values: list, args: list[torch.Tensor], ns: dict) -> torch.Tensor | None:
    """Output of `seed` on meta tensors, or None if it does not accept them."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            call = seed.build(values, ns)
            out = call(*args)
        if seed.output_index is not None:
            out = out[seed.output_index]
    except Exception:  # shape inference by execution: a refusal is the answer
        return None
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        return None
    return out


class ProgrammaticComposer:
    """Deterministic for (catalog, config, seed): the same seed gives the same source."""

    def __init__(self, seeds: list[SeedOp], config: ComposeConfig | None = None):
        self.config = config or ComposeConfig()
        self.seeds = [s for s in seeds if s.ranks and (s.train_eval_same or self.config.allow_train_eval_mismatch)]
        if not self.seeds:
            raise ComposeError("empty seed catalog")
        self.by_rank = {r: [s for s in self.seeds if r in s.ranks] for r in (2, 3, 4, 5)}
        self._ns: dict[str, dict] = {}
        self._hazards: dict[tuple[str, int], SeedHazard] = {}

    def hazard(self, seed: SeedOp, rank: int) -> SeedHazard:
        """How `seed` is fed at input rank `rank` (probed once per seed and rank; see hazards.py).
        Without hazard_guards: abs() + 1 for seeds undefined on real inputs, else nothing."""
        if not self.config.hazard_guards:
            return SeedHazard(guard="abs1" if seed.domain == "positive" else "none")
        key = (seed.name, rank)
        if key not in self._hazards:
            self._hazards[key] = seed_hazard(seed, rank, self._namespace(seed))
        return self._hazards[key]

    def refused(self) -> dict[str, str]:
        """The seeds (name@rank) probed so far that no guard makes safe, with what they did unguarded."""
        return {f"{n}@{r}": h.reason for (n, r), h in sorted(self._hazards.items()) if not h.usable}

    def _namespace(self, seed: SeedOp) -> dict:
        if seed.helper_source not in self._ns:
            self._ns[seed.helper_source] = base_namespace(seed.helper_source)
        return self._ns[seed.helper_source]

    def compose(self, seed: int) -> Composition:
        rng = random.Random(f"synth-compose:{seed}")  # str seeds hash stably across processes
        cfg = self.config
        for _ in range(8):
            try:
                return self._attempt(rng, seed)
            except ComposeError:
                continue
        raise ComposeError(f"seed {seed}: no composition of {cfg.min_ops}-{cfg.max_ops} ops found")

    def _attempt(self, rng: random.Random, seed: int) -> Composition:
        cfg = self.config
        sizes = list(range(cfg.min_ops, cfg.max_ops + 1))
        n_ops = rng.choices(sizes, weights=[1 if n == 1 else 3 for n in sizes])[0]
        first = rng.choice(self.seeds)
        rank = rng.choice(first.ranks)
        plan = _Plan(batch=rng.choice(BATCHES[cfg.profile]))
        shape = (plan.batch, *rng.choice(SIZES[cfg.profile][rank]))
        if math.prod(shape) > cfg.max_numel:
            raise ComposeError("input too large")
        plan.inputs.append(shape)
        plan.steps.append(("input", 0))
        values: list[_Value] = [_Value("x0", shape)]
        cur = values[0]
        for i in range(n_ops):
            pick = first if i == 0 else None
            got = self._step(rng, plan, cur, values, i, pick)
            if got is None:
                if i >= cfg.min_ops:
                    break
                raise ComposeError("chain cannot grow")
            cur = got
            values.append(cur)
            if len(cur.shape) < 2:
                break           # reduced to one value per sample: nothing composes after it
        if len(plan.ops) < cfg.min_ops:
            raise ComposeError("too few ops")
        if not self._replay_scaled(plan):
            raise ComposeError("chain does not survive a batch change")
        source = render(plan, cur.var, seed, "programmatic")
        return Composition(name=task_name(plan.ops), source=source, ops=tuple(plan.ops), seed=seed,
                           composer="programmatic", input_shapes=tuple(plan.inputs), output_shape=cur.shape)

    def _step(self, rng, plan: _Plan, cur: _Value, values: list[_Value], i: int,
              pick: SeedOp | None) -> _Value | None:
        cfg = self.config
        for attempt in range(cfg.attempts):
            seed = pick if (pick is not None and attempt == 0) else None
            rank = len(cur.shape)
            if seed is None:
                pool = self.by_rank.get(rank) or []
                seed = rng.choice(pool) if pool and rng.random() < 0.85 else rng.choice(self.seeds)
            glue, shape = _glue(cur.shape, seed.ranks, rng)
            if glue is None:
                continue
            hazard = self.hazard(seed, len(shape))
            if not hazard.usable:
                continue        # jumps or poles on every guarded range: not composed
            values_ = seed.resolve(shape, rng)
            ns = self._namespace(seed)
            operands = self._operands(rng, plan, seed, shape, values, i, cur)
            # parameters are inferred as what they are, tensors that require grad: an op that refuses
            # one (a loss whose target is not differentiable) fails here, not in the task
            metas = [_meta(s).requires_grad_(e.startswith("@param")) for e, s in operands]
            out = _infer(seed, values_, metas, ns)
            if out is None or out.numel() > cfg.max_numel or out.numel() == 0:
                continue
            if out.dim() == 0 or out.shape[0] != plan.batch:
                continue        # the batch stays in dimension 0 (rescaling); scalars are degenerate tasks
            return self._commit(plan, seed, values_, glue, cur, operands, i, tuple(out.shape), hazard.guard)
        return None

    def _operands(self, rng, plan: _Plan, seed: SeedOp, shape, values: list[_Value], i: int, cur: _Value):
        """(expression, shape) of each tensor argument; the first is the current value after glue."""
        ops = [("@cur", shape)]
        for k in range(1, seed.arity):
            if seed.arity == 3:        # attention: query = key = value (self-attention)
                ops.append(("@cur", shape))
                continue
            same = [v for v in values if v.shape == shape and v.var != cur.var]
            r = rng.random()
            if same and r < self.config.residual_prob:
                ops.append((rng.choice(same).var, shape))
            elif r < 0.8 and len(shape) >= 2 and seed.shape_preserving:
                ops.append((f"@param{i}_{k}", (1, *shape[1:])))
            else:
                ops.append((f"@input{i}_{k}", shape))
        return ops

    def _commit(self, plan: _Plan, seed: SeedOp, vals: list, glue: str, cur: _Value, operands, i: int,
                out_shape: tuple[int, ...], guard: str = "none") -> _Value:
        src = cur.var
        if glue:
            plan.body.append(f"h{i} = {glue.format(src)}")
            src = f"h{i}"
        names = []
        for expr, shape in operands:
            if expr == "@cur":
                names.append(src)
            elif expr.startswith("@param"):
                pname = f"w{i}"
                plan.params.append((pname, shape[1:]))
                plan.init_lines.append(f"self.{pname} = nn.Parameter(torch.randn({shape[1:]!r}))")
                names.append(f"self.{pname}")
            elif expr.startswith("@input"):
                names.append(f"x{len(plan.inputs)}")
                plan.inputs.append(shape)
            else:
                names.append(expr)
        if guard != "none":
            # every tensor operand through the guard (hazards.py): values the op is safe on
            fixed: dict[str, str] = {}   # an operand used twice (addcdiv(v, v, v)) is guarded once
            for n in names:
                if n not in fixed:
                    fixed[n] = f"p{i}_{len(fixed)}"
                    plan.body.append(f"{fixed[n]} = {GUARDS[guard].format(n)}")
            names = [fixed[n] for n in names]
        init = seed.init_line(f"op{i}", vals)
        if init:
            plan.init_lines.append(init)
        if seed.helper_source and seed.helper_source not in plan.helpers:
            plan.helpers.append(seed.helper_source)
        plan.body.append(f"v{i} = {seed.call_expr(f'op{i}', names, vals)}")
        plan.ops.append(seed.name)
        plan.steps.append(("op", seed, glue, [e for e, _ in operands], vals, [s for _, s in operands], out_shape))
        return _Value(f"v{i}", out_shape)

    def _replay_scaled(self, plan: _Plan) -> bool:
        """Re-run shape inference with twice the batch; constructor values and parameter shapes stay
        as chosen (the source fixes them), and every value must keep its shape with only the batch
        scaled: an op whose output grows in another dimension with the batch (`cdist` of the batch
        against itself is batch-by-batch) mixes samples and would break any later parameter."""
        scale = 2
        env: dict[str, torch.Tensor] = {}
        inputs = [_meta((s[0] * scale, *s[1:])) for s in plan.inputs]
        env["x0"] = inputs[0]
        cur = inputs[0]
        n_inputs = 1
        i = 0
        for step in plan.steps[1:]:
            _, seed, glue, exprs, vals, shapes, out_shape = step
            x = cur
            try:
                if glue:
                    x = eval(glue.format("_x"), {"_x": cur})
                args = []
                for e, shape in zip(exprs, shapes):
                    if e == "@cur":
                        args.append(x)
                    elif e.startswith("@param"):
                        args.append(_meta(shape).requires_grad_())
                    elif e.startswith("@input"):
                        args.append(inputs[n_inputs])
                        n_inputs += 1
                    else:
                        args.append(env[e])
            except Exception:  # glue refused the scaled shape
                return False
            out = _infer(seed, vals, args, self._namespace(seed))
            if out is None or tuple(out.shape) != (out_shape[0] * scale, *out_shape[1:]):
                return False
            env[f"v{i}"] = out
            cur = out
            i += 1
        return True


def _glue(shape: tuple[int, ...], ranks: tuple[int, ...], rng: random.Random) -> tuple[str | None, tuple]:
    """An expression template taking the current value to a rank the op accepts ('' if none needed)."""
    rank = len(shape)
    if rank in ranks:
        return "", shape
    lower = [r for r in ranks if r < rank]
    higher = [r for r in ranks if r > rank]
    if lower and rank - max(lower) <= 2:
        target = max(lower)
        s = list(shape)
        while len(s) > target:
            s[-2:] = [s[-2] * s[-1]]
        expr = "{}.flatten(-2)" if rank - target == 1 else "{}.flatten(-3)"
        return expr, tuple(s)
    if higher and min(higher) - rank == 1:
        return "{}.unsqueeze(1)", (shape[0], 1, *shape[1:])
    return None, shape


# Default initialisations that are constants (norm weights of ones, biases of zeros, PReLU's 0.25)
# would let a kernel hard-code them; every task's constructor gives them random values instead.
RANDOMISE_PARAMS = [
    "# parameters that start constant (norm weights, zero biases) get random values: a kernel must read them",
    "with torch.no_grad():",
    "    for p in self.parameters():",
    "        if p.numel() == 1 or bool((p == p.reshape(-1)[0]).all()):",
    "            p.add_(torch.randn_like(p) * 0.1)",
]


def task_name(ops) -> str:
    return "_".join(o.rsplit(".", 1)[-1] for o in ops) or "Empty"


def render(plan: _Plan, out_var: str, seed: int, composer: str) -> str:
    ins = [f"x{i}" for i in range(len(plan.inputs))]
    chain = " -> ".join(plan.ops)
    lines = [f"# Synthesized by cuda-agent synth: {composer} composer, seed {seed}, torch {torch.__version__}",
             f"# ops: {chain}",
             "import math", "import torch", "import torch.nn as nn", "import torch.nn.functional as F", "",
             f"BATCH = {plan.batch}", ""]
    for helper in plan.helpers:
        lines += ["", helper.rstrip(), ""]
    lines += ["", "class Model(nn.Module):", f'    """{chain}"""', "", "    def __init__(self):",
              "        super().__init__()"]
    lines += [f"        {ln}" for ln in plan.init_lines]
    if any(step[0] == "op" and step[1].has_params for step in plan.steps):
        lines += [f"        {ln}" for ln in RANDOMISE_PARAMS]
    lines += ["", f"    def forward(self, {', '.join(ins)}):"]
    lines += [f"        {ln}" for ln in plan.body]
    lines += [f"        return {out_var}", "", "", "def get_inputs():"]
    shapes = ", ".join("torch.randn(" + ", ".join(["BATCH", *map(str, s[1:])]) + ")" for s in plan.inputs)
    lines += [f"    return [{shapes}]", "", "", "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)


def set_batch(source: str, batch: int) -> str | None:
    """The source with its `BATCH = N` constant replaced; None if it has none."""
    if not BATCH_RE.search(source):
        return None
    return BATCH_RE.sub(f"BATCH = {int(batch)}", source, count=1)


def get_batch(source: str) -> int | None:
    m = BATCH_RE.search(source)
    return int(m.group(1)) if m else None


# -- the LLM composer -------------------------------------------------------------------------------

class LLMConfig(BaseModel):
    """An OpenAI-compatible endpoint. The key is read from the environment variable named here,
    never stored in a config file or a run record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(default_factory=lambda: os.environ.get("CUDA_AGENT_LLM_BASE_URL", "http://127.0.0.1:8000/v1"))
    model: str = Field(default_factory=lambda: os.environ.get("CUDA_AGENT_LLM_MODEL", "default"))
    api_key_env: str = "CUDA_AGENT_LLM_API_KEY"
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout_s: float = 120.0
    max_retries: int = 1

    def client_settings(self):
        """The shared model client's settings (`cuda_agent.llm.ModelConfig`) for this endpoint."""
        from cuda_agent.llm import ModelConfig

        return ModelConfig(base_url=self.base_url, model=self.model, api_key=os.environ.get(self.api_key_env) or "none",
                           tool_mode="native", temperature=self.temperature, max_tokens=self.max_tokens,
                           timeout_s=self.timeout_s, max_retries=self.max_retries)


def chat_client(cfg: LLMConfig):
    """The project's one model client (`cuda_agent.llm.ChatClient`, as the agent uses) for `cfg`."""
    from cuda_agent.llm import ChatClient

    try:
        return ChatClient(cfg.client_settings())
    except ImportError:
        raise ComposeError("the LLM composer needs the 'openai' package (pip install openai)") from None


def chat(cfg: LLMConfig, messages: list[dict[str, str]], seed: int | None = None, *, client=None) -> str:
    """One chat completion through the shared client (`client`, else a new one for `cfg`)."""
    client = client or chat_client(cfg)
    return client.complete(messages, [], seed=seed).content


PROMPT = """You write PyTorch reference modules for a CUDA kernel benchmark (KernelBench format).
Fuse the following {n} seed operators, in an order and with glue of your choice, into ONE module.

Rules:
- Define `class Model(nn.Module)` with `__init__` and `forward`, `get_inputs()` returning a list of
  input tensors, and `get_init_inputs()` returning the constructor arguments (may be empty).
- Put the batch size in a module constant `BATCH = <int>` and use it as the first dimension of
  every input; never hard-code it elsewhere.
- No randomness in forward (no dropout, no torch.rand*), identical output in train and eval mode,
  every parameter and input must influence the output, and the output must not be constant.
- Import only torch, torch.nn as nn, torch.nn.functional as F and math.
Answer with a single ```python code block and nothing else.

Seed operators:
{seeds}
"""


def extract_code(text: str) -> str:
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, flags=re.DOTALL)
    if blocks:
        return max(blocks, key=len).strip() + "\n"
    return text.strip() + "\n"


class LLMComposer:
    """Samples seeds deterministically per seed number and asks the model to fuse them."""

    def __init__(self, seeds: list[SeedOp], llm: LLMConfig, config: ComposeConfig | None = None, chat_fn=None):
        """`chat_fn(llm, messages, seed=...) -> text`: default, the shared model client (one per composer)."""
        self.seeds = [s for s in seeds if s.class_source and s.train_eval_same]
        self.llm, self.config = llm, config or ComposeConfig()
        self._client = None
        self.chat_fn = chat_fn or self._chat

    def _chat(self, llm: LLMConfig, messages: list[dict[str, str]], seed: int | None = None) -> str:
        if self._client is None:
            self._client = chat_client(llm)
        return chat(llm, messages, seed, client=self._client)

    def compose(self, seed: int) -> Composition:
        rng = random.Random(f"synth-llm:{seed}")
        k = rng.randint(max(2, self.config.min_ops), self.config.max_ops)
        picked = rng.sample(self.seeds, k)
        listing = "\n".join(f"### {s.name}\n```python\n{s.class_source}```\n" for s in picked)
        messages = [{"role": "user", "content": PROMPT.format(n=k, seeds=listing)}]
        try:
            text = self.chat_fn(self.llm, messages, seed=seed)
        except ComposeError:
            raise
        except Exception as exc:  # provider errors are a failed candidate, not a crash
            raise ComposeError(f"LLM request failed: {type(exc).__name__}: {exc}") from None
        code = extract_code(text)
        try:
            validate_reference_source(code, f"llm seed {seed}")  # parses it: a syntax error is a TaskError
        except TaskError as exc:
            raise ComposeError(f"LLM output is not a KernelBench module: {exc}") from None
        ops = tuple(s.name for s in picked)
        header = f"# Synthesized by cuda-agent synth: llm composer ({self.llm.model}), seed {seed}\n# ops: {' -> '.join(ops)}\n"
        return Composition(name=task_name(ops), source=header + code, ops=ops, seed=seed, composer="llm")


