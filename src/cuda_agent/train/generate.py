"""Rollouts on one GPU: batched sampling with per-session KV caches, with plain transformers.

`HFPolicy` is the `TokenPolicy` of the one-GPU path. Many episode threads call `generate` at once;
each call is a request to one scheduler thread, which owns the model while it generates:

    admit     pending requests are gathered for up to `batch_wait_s` (or until `max_batch` are
              waiting); each is prefilled on its own, in chunks of `prefill_chunk` tokens, from the
              longest common prefix of its prompt and its session's cached tokens (only new tokens
              are computed), logits at the last position only (`logits_to_keep=1`)
    decode    every active request (row) advances one token per step in one padded batch: the KV
              cache of all rows is one left-padded slab per layer, preallocated with headroom so a
              step writes in place (no per-step concatenation), an attention mask hides the padding,
              and each row has its own position ids
    sample    on the device: fp32 log-softmax of (logits restricted to `allowed`) / temperature, a
              device-side generator seeded from `seed`; one host sync per step for the whole batch
              (the sampled ids and their log-probabilities)
    leave     a row that samples EOS (unless `ignore_eos`) or reaches its `max_new_tokens` is
              answered; its own KV is copied out into its session's cache for the next turn, and its
              slab row stays (computed, unread) until a joining request takes it (its KV copied in,
              right-aligned at the fill) or the batch is rebuilt (no free row for a join, a history
              longer than the fill, the slab full): leaving and most joins copy only their own KV

On a GPU the scheduler holds the GPU's judge lock (`cuda_agent.judge.devlock`, the lock every CUDA
judge of the machine takes) shared for each admission and decode step: a judge's timed call holds it
alone, so on the one-GPU path no candidate is timed while the policy computes on the same GPU (its
kernels would take the GPU's time slices and the judge would read an honest kernel several times
slower). Generation waits for a timed call, at most one step's time; `GenStats.judge_wait_s` says
how long in all.

The log-probability returned for each token is that of the distribution it was sampled from, which
is what `train.hf.token_logprobs` recomputes: logits from the model's lm_head in the model's dtype,
then fp32, `allowed` restriction, temperature, log-softmax (no top-k/top-p).

Session caches hold the KV of every token of the history but the last sampled one, keyed by the
session id. A later call with a history that diverges from the cache keeps the longest common
prefix and prefills the rest. They are released by `end_session`, by `clear()` (call it after the
weights change: a cache computed by old weights is stale) and, least recently used first, when the
idle caches and the active rows together exceed `max_cache_tokens`; an evicted session prefills its
whole history again on its next turn.

What is not handled: one scheduler means one request's prefill holds up the decode steps of the
others (prefills are not batched or interleaved); attention runs over the padded slab, so rows of
very different lengths waste attention work; models FastDecoder does not cover decode through
transformers' modules, bound by Python and launch overhead (on a GPU, FastDecoder's steps replay from
a CUDA graph of the batch slab, captured again whenever the slab is rebuilt); sampling order across
threads is not reproducible (which request gets which random draws depends on arrival order), only
the per-token log-probabilities are exact.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from cuda_agent.judge.devlock import DeviceLock, gpu_lock_of
from cuda_agent.rollout.tokens import Generation
from .fastdecode import FastDecoder, GraphedStep

KV = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys, values [batch, kv_heads, tokens, head_dim]


class _SlabLayer(DynamicLayer):
    """A cache layer over a preallocated buffer: `update` writes the new keys/values in place after
    the filled part and exposes views of the filled part as `keys`/`values`, so every inherited
    method (sequence length, mask sizes) sees an ordinary dynamic layer. The buffer is allocated at
    the first update when none is given (a prefill from scratch)."""

    def __init__(self, capacity: int, keys_buf: torch.Tensor | None = None,
                 values_buf: torch.Tensor | None = None, fill: int = 0):
        super().__init__()
        self._capacity = capacity
        self._kb, self._vb = keys_buf, values_buf
        if keys_buf is not None:
            self._expose(fill)

    def _expose(self, n: int) -> None:
        self.keys = self._kb[..., :n, :]
        self.values = self._vb[..., :n, :]
        self.device, self.dtype = self._kb.device, self._kb.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self._kb is None:
            self._kb = key_states.new_zeros((*key_states.shape[:2], self._capacity, key_states.shape[-1]))
            self._vb = value_states.new_zeros((*value_states.shape[:2], self._capacity, value_states.shape[-1]))
            n = 0
        else:
            n = self.keys.shape[-2]
        m = key_states.shape[-2]
        if n + m > self._kb.shape[-2]:
            raise RuntimeError(f"KV slab overflow ({n} + {m} > {self._kb.shape[-2]}): the scheduler sized it wrong")
        self._kb[..., n:n + m, :].copy_(key_states)
        self._vb[..., n:n + m, :].copy_(value_states)
        self._expose(n + m)
        return self.keys, self.values


def _cache(layers: list[_SlabLayer]) -> DynamicCache:
    # Built empty and given our layers: DynamicCache(...)'s constructor arguments differ across 5.x.
    cache = DynamicCache()
    cache.layers = list(layers)
    return cache


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class GenStats:
    """Counters since the policy was made: what was computed, what was reused, where time went."""

    requests: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0          # tokens run through the model in prefills
    reused_tokens: int = 0           # prompt tokens served from a session cache instead
    decode_steps: int = 0
    repacks: int = 0                 # batch rebuilds (a join with no free slab row, or the slab grew)
    placed: int = 0                  # joins put into an answered row's slab row, with no rebuild
    graph_captures: int = 0          # decode steps captured as CUDA graphs (one per slab built)
    evictions: int = 0               # session caches dropped for the memory cap
    prefill_s: float = 0.0
    decode_s: float = 0.0
    judge_wait_s: float = 0.0        # waiting for judges' timed calls on this GPU (its device lock)

    def record(self) -> dict:
        return asdict(self)


@dataclass
class _Request:
    prompt: list[int]
    max_new: int
    temperature: float
    session: str | None
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


@dataclass
class _Row:
    """A request being decoded. `n` tokens of `req.prompt + out[:-1]` are in the KV cache; `out[-1]`
    was sampled and is fed at the next step."""

    req: _Request
    n: int
    out: list[int]
    logprobs: list[float]
    kv: KV | None = None       # its own KV until it is packed into the batch slab
    slot: int = -1             # its row in the batch slab once packed
    # answered: its KV went to its session, but its slab row stays (computed, unread) until the
    # next repack, so that a row leaving costs no copy of the whole batch
    left: bool = False


@dataclass
class _Cached:
    tokens: list[int]
    kv: KV

    @property
    def size(self) -> int:
        return len(self.tokens)


class _Sessions:
    """Idle sessions' KV caches, least recently used first."""

    def __init__(self):
        self._items: OrderedDict[str, _Cached] = OrderedDict()
        self.tokens = 0

    def take(self, sid: str) -> _Cached | None:
        item = self._items.pop(sid, None)
        if item is not None:
            self.tokens -= item.size
        return item

    def put(self, sid: str, item: _Cached) -> None:
        self.take(sid)
        self._items[sid] = item
        self.tokens += item.size

    def evict_oldest(self) -> bool:
        if not self._items:
            return False
        _, item = self._items.popitem(last=False)
        self.tokens -= item.size
        return True

    def clear(self) -> None:
        self._items.clear()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._items)


def _forward_cache_kwarg(model) -> str:
    """The name under which this transformers version's forward takes the cache: `cache` from 5.2x
    (`past_key_values` is deprecated there, with a warning per call), `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_DECODE_ATTENTION = "cuda_agent_decode_sdpa"


def _decode_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                 **kwargs):
    """transformers' sdpa, except for one query token per row with grouped KV heads: there the query
    heads of each KV group stand in for query positions ([B, heads, 1, D] -> [B, kv_heads, group, D]),
    so attention reads the cached KV heads as they are. transformers before ~5.2x repeats every KV
    head once per query head whenever a mask is given (the padded batch always has one), which at
    32 rows x 8k tokens writes and reads tens of GB per decode step."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    groups = getattr(module, "num_key_value_groups", 1)
    b, heads, q_len, dim = query.shape
    mask_ok = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1
                                         and attention_mask.shape[2] == 1)
    if q_len != 1 or groups <= 1 or key.shape[1] * groups != heads or not mask_ok or dropout:
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                               scaling=scaling, is_causal=is_causal, **kwargs)
    packed = query.reshape(b, key.shape[1], groups, dim)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def _register_decode_attention() -> bool:
    """Register `_decode_sdpa` (with sdpa's mask builder) under its own name; False where this
    transformers has no attention registry (generation then runs on the model's own attention)."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        AttentionInterface.register(_DECODE_ATTENTION, _decode_sdpa)
        AttentionMaskInterface.register(_DECODE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        return True
    except Exception:   # an older or newer registry API: keep the model's attention
        return False


def _default_cache_tokens(config, device: torch.device, dtype: torch.dtype) -> int:
    """A third of the GPU's memory worth of KV tokens (the rest: weights, activations, the
    trainer's state); on the CPU, 2**20 tokens."""
    if device.type != "cuda":
        return 1 << 20
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * heads * head_dim * torch.finfo(dtype).bits // 8
    return max(4096, torch.cuda.get_device_properties(device).total_memory // 3 // per_token)


_HEADROOM = 512   # decode steps a batch slab holds before it is regrown (a regrowth copies the batch KV once)


class _Engine:
    """The scheduler: one thread that owns the model while requests are in flight. Everything below
    `_run` runs on that thread; `submit`, `end_session`, `clear` and `close` are called by others and
    touch shared state only under `_cond`."""

    def __init__(self, model, eos_id: int, *, seed: int, device, allowed: list[int] | None, max_batch: int,
                 batch_wait_s: float, max_cache_tokens: int | None, prefill_chunk: int, ignore_eos: bool,
                 fast_decode: bool = True, cuda_graphs: bool = True, device_lock: Path | None = None):
        if max_batch < 1 or prefill_chunk < 1 or batch_wait_s < 0:
            raise ValueError("max_batch and prefill_chunk must be >= 1 and batch_wait_s >= 0")
        self.model = model
        self.device = torch.device(device)
        self.eos_id = eos_id
        self.ignore_eos = ignore_eos
        self.max_batch, self.batch_wait_s, self.prefill_chunk = max_batch, batch_wait_s, prefill_chunk
        embed = model.get_input_embeddings()
        self.vocab = embed.num_embeddings
        self.layers = model.config.num_hidden_layers
        self.max_cache_tokens = max_cache_tokens or _default_cache_tokens(model.config, self.device, embed.weight.dtype)
        self._cache_kw = _forward_cache_kwarg(model)
        if allowed is not None:
            bad = [i for i in allowed if not 0 <= i < self.vocab]
            if not allowed or bad:
                raise ValueError(f"allowed ids must be a non-empty list in [0, {self.vocab}); bad: {bad[:5]}")
        self.allowed = allowed
        self._bias: torch.Tensor | None = None
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.stats = GenStats()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._sessions = _Sessions()
        self._in_flight: set[str] = set()
        self._ended: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._was_training: bool | None = None   # the model's mode before generation; None while idle
        self._limbo: list[_Request] = []          # finished, out of the batch, not yet answered
        self._base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._swap_attention = (getattr(self._base.config, "_attn_implementation", None) == "sdpa"
                                and hasattr(self._base, "set_attn_implementation") and _register_decode_attention())
        self._fast_wanted = fast_decode and FastDecoder.supports(model)
        self._fast: FastDecoder | None = None   # built at the first decode step, dropped by clear()
        self._graphs = cuda_graphs and self._fast_wanted and self.device.type == "cuda"
        self._device_lock = DeviceLock(device_lock) if device_lock is not None else None
        self._reset_batch()

    # -- called by other threads ------------------------------------------------------------------

    def submit(self, req: _Request) -> Generation:
        with self._cond:
            if self._closed:
                raise RuntimeError("the policy is closed")
            if req.session is not None:
                self._in_flight.add(req.session)
                self._ended.discard(req.session)
            self._pending.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hf-policy-scheduler", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        thread = self._thread
        while not req.done.wait(0.5):
            if not thread.is_alive() and not req.done.is_set():
                raise RuntimeError("the generation thread is gone (policy closed or crashed)")
        if req.error is not None:
            raise RuntimeError(f"generation failed: {req.error!r}") from req.error
        return req.result

    def end_session(self, sid: str) -> None:
        with self._cond:
            self._sessions.take(sid)
            if sid in self._in_flight:
                self._ended.add(sid)

    def clear(self) -> None:
        with self._cond:
            self._sessions.clear()
            self._fast = None   # its stacked weights are copies: stale once the weights change

    def close(self, wait: bool = True) -> None:
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for req in pending:
            self._fail(req, RuntimeError("the policy was closed before this request ran"))
        thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=120)

    # -- the scheduler thread ---------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                admit = self._wait_for_work()
                if admit is None:
                    break
                try:
                    with self._judges_allow():
                        if admit:
                            self._admit(admit)
                        if self._live:
                            self._step()   # ends on a host sync: its kernels are done within the hold
                except Exception as exc:   # a failed batch fails its requests, not the scheduler
                    self._fail_batch(admit, exc)
        self._fail_batch([], RuntimeError("the policy was closed while this request ran"))
        with self._cond:
            self._sessions.clear()

    @contextlib.contextmanager
    def _judges_allow(self):
        """The GPU's judge lock held shared for one step (module docstring), the wait counted."""
        if self._device_lock is None:
            yield
            return
        t0 = time.monotonic()
        with self._device_lock.hold(exclusive=False):
            self.stats.judge_wait_s += time.monotonic() - t0
            yield

    def _wait_for_work(self) -> list[_Request] | None:
        """Requests to admit now ([] to just decode the active rows); None once closed. Admission
        waits up to `batch_wait_s` after the oldest pending request so that requests arriving
        together are prefilled and join the batch together (each join repacks the batch)."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                free = self.max_batch - len(self._live)
                if self._pending and free > 0:
                    waited = time.monotonic() - self._pending[0].arrived
                    if len(self._pending) >= free or waited >= self.batch_wait_s:
                        take, self._pending = self._pending[:free], self._pending[free:]
                        return take
                    if not self._live:
                        self._cond.wait(self.batch_wait_s - waited)
                        continue
                if self._live:
                    return []
                self._cond.wait()

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, cache: DynamicCache):
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                          logits_to_keep=1, **{self._cache_kw: cache})

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled ids [B] and their log-probabilities [B], on the device (the trainer's recipe:
        fp32 logits, `allowed` restriction, temperature, log-softmax)."""
        x = logits.float()
        if self.allowed is not None:
            if self._bias is None or self._bias.shape[0] != x.shape[-1]:
                self._bias = torch.full((x.shape[-1],), float("-inf"), device=x.device)
                self._bias[torch.tensor(self.allowed, device=x.device)] = 0.0
            x = x + self._bias
        logp = F.log_softmax(x / temps, dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=self._gen)
        return tok[:, 0], logp.gather(1, tok)[:, 0]

    @staticmethod
    def _host(tok: torch.Tensor, lp: torch.Tensor) -> list[tuple[int, float]]:
        # One device->host copy for the whole batch (ids are exact in float64).
        return [(int(t), l) for t, l in torch.stack([tok.double(), lp.double()], 1).cpu().tolist()]

    def _done(self, row: _Row) -> str | None:
        if not self.ignore_eos and row.out[-1] == self.eos_id:
            return "stop"
        return "length" if len(row.out) >= row.req.max_new else None

    def _prefill(self, req: _Request) -> tuple[KV, torch.Tensor]:
        """The request's KV over its whole prompt (reusing its session's common prefix) and the
        logits [1, V] at the prompt's last position."""
        cached = None
        if req.session is not None:
            with self._cond:
                cached = self._sessions.take(req.session)
        total = len(req.prompt)
        keep = min(common_prefix(cached.tokens, req.prompt), total - 1) if cached else 0
        if keep > 0:
            layers = []
            for ck, cv in cached.kv:
                kb = ck.new_empty((1, ck.shape[1], total, ck.shape[3]))
                vb = cv.new_empty((1, cv.shape[1], total, cv.shape[3]))
                kb[..., :keep, :].copy_(ck[..., :keep, :])
                vb[..., :keep, :].copy_(cv[..., :keep, :])
                layers.append(_SlabLayer(total, kb, vb, keep))
        else:
            layers = [_SlabLayer(total) for _ in range(self.layers)]
        del cached
        cache = _cache(layers)
        ids = torch.tensor(req.prompt, device=self.device)
        for s in range(keep, total, self.prefill_chunk):
            e = min(total, s + self.prefill_chunk)
            out = self._forward(ids[None, s:e], torch.arange(s, e, device=self.device)[None], None, cache)
        self.stats.prefill_tokens += total - keep
        self.stats.reused_tokens += keep
        return [(layer._kb, layer._vb) for layer in layers], out.logits[:, -1]

    def _admit(self, reqs: list[_Request]) -> None:
        with self._cond:
            if self._was_training is None:
                self._was_training = self.model.training
                self.model.eval()
                self._set_attention(_DECODE_ATTENTION)
        t0 = time.monotonic()
        rows, logits = [], []
        for req in reqs:
            kv, last = self._prefill(req)
            rows.append(_Row(req=req, n=len(req.prompt), out=[], logprobs=[], kv=kv))
            logits.append(last)
        temps = torch.tensor([[r.req.temperature] for r in rows], device=self.device)
        tok, lp = self._sample(torch.cat(logits), temps)
        finished: list[tuple[_Row, str]] = []
        joining: list[_Row] = []
        for row, (t, l) in zip(rows, self._host(tok, lp)):
            row.out.append(t)
            row.logprobs.append(l)
            end = self._done(row)
            (joining.append(row) if end is None else finished.append((row, end)))
        self.stats.requests += len(reqs)
        self.stats.generated_tokens += len(reqs)
        if joining and not self._place(joining):
            self._repack(self._live + joining)
        self.stats.prefill_s += time.monotonic() - t0
        self._finish(finished)

    def _step(self) -> None:
        t0 = time.monotonic()
        if self._fill + 1 > self._capacity:
            self._repack(self._live)
        if self._fast_wanted and self._fast is None:
            self._fast = FastDecoder(self.model)
        if self._fast is not None:
            logits = self._fast_step()
            for s in self._slabs:
                s._expose(self._fill + 1)
        else:
            mask = (torch.arange(self._fill + 1, device=self.device)[None] >= self._start[:, None]).long()
            logits = self._forward(self._last[:, None], self._pos[:, None], mask, self._cache_obj).logits[:, -1]
        tok, lp = self._sample(logits, self._temps)
        self._last = tok
        self._pos += 1
        self._fill += 1
        finished: list[tuple[_Row, str]] = []
        live = 0
        for row, (t, l) in zip(self._rows, self._host(tok, lp)):
            if row.left:
                continue
            live += 1
            row.n += 1
            row.out.append(t)
            row.logprobs.append(l)
            end = self._done(row)
            if end is not None:
                finished.append((row, end))
        self.stats.decode_steps += 1
        self.stats.generated_tokens += live
        if finished:
            self._limbo = [r.req for r, _ in finished]   # failed too if copying them out fails
            for row, _ in finished:   # its own KV copied out; its slab row stays until the next repack
                row.kv = self._row_kv(row, clone=True)
                row.left = True
            if not self._live:   # the whole batch answered: its slab goes now
                self._reset_batch()
        self.stats.decode_s += time.monotonic() - t0
        self._finish(finished)

    def _fast_step(self) -> torch.Tensor:
        """One decode step through FastDecoder: replayed from a CUDA graph of the current slab where
        graphs are on (captured again after each rebuild of the slab), else eagerly."""
        slabs = [(s._kb, s._vb) for s in self._slabs]
        if self._graphs:
            graph = self._graph
            if graph is not None and graph.decoder is self._fast and graph.key == GraphedStep.key_of(slabs):
                return graph(self._last, self._pos, self._fill, self._start)
            self._graph = None   # the old slab's graph and its memory go before the new capture
            try:
                graph = GraphedStep(self._fast, slabs)
                logits = graph.capture(self._last, self._pos, self._fill, self._start)
            except Exception as exc:   # a capture this torch or GPU refuses, or a replay that differs
                self._graphs = False
                warnings.warn(f"decode steps run without CUDA graphs from now on: {exc!r}", stacklevel=2)
            else:
                self._graph = graph
                self.stats.graph_captures += 1
                return logits
        return self._fast.step(self._last, self._pos, slabs, self._fill, self._start)

    def _place(self, joining: list[_Row]) -> bool:
        """Put joining rows into the slab rows of answered ones, without rebuilding the batch: each
        row's KV is copied right-aligned at the slab's fill into a free row. Possible when there are
        enough free rows and every joining history fits before the fill; False otherwise (the
        caller repacks)."""
        free = [b for b, r in enumerate(self._rows) if r.left]
        if not self._slabs or len(free) < len(joining) or any(r.n > self._fill for r in joining):
            return False
        fill = self._fill
        for b, row in zip(free, joining):
            for layer, (k, v) in zip(self._slabs, row.kv):
                layer._kb[b, :, fill - row.n:fill].copy_(k[0])
                layer._vb[b, :, fill - row.n:fill].copy_(v[0])
            self._start[b], self._pos[b], self._last[b] = fill - row.n, row.n, row.out[-1]
            self._temps[b, 0] = row.req.temperature
            row.slot, row.kv = b, None
            self._rows[b] = row
        self.stats.placed += len(joining)
        return True

    @property
    def _live(self) -> list[_Row]:
        """The rows still decoding (the batch may hold answered rows until its next repack)."""
        return [r for r in self._rows if not r.left]

    def _row_kv(self, row: _Row, *, clone: bool) -> KV:
        """The row's KV over its `n` cached tokens: its own tensors, or its part of the batch slab."""
        if row.kv is not None:
            return row.kv
        lo, hi = self._fill - row.n, self._fill
        pick = [(s._kb[row.slot:row.slot + 1, :, lo:hi], s._vb[row.slot:row.slot + 1, :, lo:hi]) for s in self._slabs]
        return [(k.clone(), v.clone()) for k, v in pick] if clone else pick

    def _repack(self, rows: list[_Row]) -> None:
        """Rebuild the batch slab for `rows`: those already in the slab first (as one gather per
        layer), then joining rows (their own KV); right-aligned at the longest row, padding trimmed,
        with room for up to `_HEADROOM` more decode steps."""
        if not rows:
            self._reset_batch()
            return
        old = [r for r in rows if r.kv is None]
        new = rows[len(old):]
        if any(r.kv is None for r in new):
            raise RuntimeError("repack: rows already in the batch must come first")
        fill = max(r.n for r in rows)
        room = max(r.req.max_new - len(r.out) for r in rows)
        cap = fill + max(1, min(room, _HEADROOM))
        idx = torch.tensor([r.slot for r in old], device=self.device) if old else None
        width = min(fill, self._fill)
        layers = []
        for i in range(self.layers):
            bufs = []
            for j in (0, 1):
                like = (self._slabs[i]._kb if old else new[0].kv[i][0]) if j == 0 else \
                       (self._slabs[i]._vb if old else new[0].kv[i][1])
                buf = like.new_zeros((len(rows), like.shape[1], cap, like.shape[3]))
                if old:
                    src = self._slabs[i]._kb if j == 0 else self._slabs[i]._vb
                    buf[:len(old), :, fill - width:fill].copy_(src[:, :, self._fill - width:self._fill].index_select(0, idx))
                for b, r in enumerate(new, start=len(old)):
                    buf[b, :, fill - r.n:fill].copy_(r.kv[i][j][0])
                bufs.append(buf)
            layers.append(_SlabLayer(cap, bufs[0], bufs[1], fill))
        self._slabs, self._cache_obj = layers, _cache(layers)
        self._fill, self._capacity, self._rows = fill, cap, list(rows)
        for b, r in enumerate(rows):
            r.slot, r.kv = b, None
        dev = self.device
        self._start = torch.tensor([fill - r.n for r in rows], device=dev)
        self._pos = torch.tensor([r.n for r in rows], device=dev)
        self._last = torch.tensor([r.out[-1] for r in rows], device=dev)
        self._temps = torch.tensor([[r.req.temperature] for r in rows], device=dev)
        self.stats.repacks += 1

    def _reset_batch(self) -> None:
        self._graph: GraphedStep | None = None   # captured over the slab that goes here
        self._rows: list[_Row] = []
        self._slabs: list[_SlabLayer] = []
        self._cache_obj: DynamicCache | None = None
        self._fill = self._capacity = 0
        self._start = self._pos = self._last = self._temps = None

    def _finish(self, finished: list[tuple[_Row, str]]) -> None:
        """Store the finished rows' caches (then evict down to the cap), restore the model's mode if
        nothing is left to do, and only then wake their callers (so a trainer that starts right
        after the last reply finds the model as it left it)."""
        if not finished:
            return
        with self._cond:
            for row, _ in finished:
                sid = row.req.session
                if sid is not None:
                    self._in_flight.discard(sid)
                    if sid in self._ended:
                        self._ended.discard(sid)
                    else:
                        tokens = row.req.prompt + row.out[:-1]
                        if row.kv[0][0].shape[-2] == len(tokens):
                            self._sessions.put(sid, _Cached(tokens, row.kv))
                        else:   # a scheduler bug; the reply is right, only the cache is not kept
                            warnings.warn(f"session {sid}: cache of {row.kv[0][0].shape[-2]} tokens for "
                                          f"{len(tokens)}; not kept", stacklevel=2)
                row.kv = None
            active = sum(r.n for r in self._live)
            while self._sessions.tokens + active > self.max_cache_tokens and self._sessions.evict_oldest():
                self.stats.evictions += 1
            self._restore_mode_if_idle()
        for row, end in finished:
            row.req.result = Generation(token_ids=row.out, logprobs=row.logprobs, finish=end)
            row.req.done.set()
        self._limbo = []

    def _restore_mode_if_idle(self) -> None:
        # Called under _cond.
        if not self._live and not self._pending and self._was_training is not None:
            self.model.train(self._was_training)
            self._was_training = None
            self._set_attention("sdpa")

    def _set_attention(self, name: str) -> None:
        """Switch the model between its sdpa (training, outside generation) and `_decode_sdpa`."""
        if not self._swap_attention:
            return
        try:
            self._base.set_attn_implementation(name)
        except Exception as exc:   # this transformers refuses the switch: generate with plain sdpa
            self._swap_attention = False
            warnings.warn(f"generation keeps transformers' sdpa attention ({exc!r})", stacklevel=2)
            self._base.set_attn_implementation("sdpa")

    def _fail_batch(self, admitted: list[_Request] | None, exc: BaseException) -> None:
        victims = {id(r.req): r.req for r in self._live}
        victims.update({id(q): q for q in [*(admitted or []), *self._limbo] if not q.done.is_set()})
        self._limbo = []
        self._reset_batch()
        with self._cond:
            for q in victims.values():
                if q.session is not None:
                    self._in_flight.discard(q.session)
            self._restore_mode_if_idle()
        for q in victims.values():
            self._fail(q, exc)

    @staticmethod
    def _fail(req: _Request, exc: BaseException) -> None:
        req.error = exc
        req.done.set()


class HFPolicy:
    """`TokenPolicy` over a transformers causal LM on one device; see the module docstring.

    `max_batch` rows decode together; `batch_wait_s` is how long admission waits to gather requests
    arriving together; `max_cache_tokens` caps the KV tokens kept (idle sessions are evicted, least
    recently used first; default: a third of the GPU's memory, 2**20 tokens on the CPU);
    `prefill_chunk` bounds a prefill's activation memory; `ignore_eos` (benchmarks only) never stops
    on EOS, so every reply is `max_new_tokens` long; `fast_decode` runs decode steps through
    `fastdecode.FastDecoder` where it covers the model (plain Qwen2: ~4x fewer kernels a step);
    `cuda_graphs` replays those steps from a CUDA graph of each batch slab (on a GPU with FastDecoder
    only; a capture that fails or replays other logits turns it off with a warning); `device_lock`
    is the lock held shared for each step ("auto": on a GPU, the one every judge of the machine on
    that GPU takes, so no judge times a call while the policy computes there; None: none; or a lock
    file's path). Call `close()` when done (or use it as a context
    manager); a forgotten close is caught when the policy is garbage-collected, and the scheduler is a
    daemon thread, so it never holds the process open."""

    def __init__(self, model, eos_id: int, *, seed: int = 0, device: str | torch.device = "cpu",
                 allowed: list[int] | None = None, max_batch: int = 32, batch_wait_s: float = 0.02,
                 max_cache_tokens: int | None = None, prefill_chunk: int = 2048, ignore_eos: bool = False,
                 fast_decode: bool = True, cuda_graphs: bool = True,
                 device_lock: Path | str | Literal["auto"] | None = "auto"):
        self.model = model
        self.eos_id = eos_id
        self.allowed = allowed
        self.device = torch.device(device)
        if device_lock == "auto":   # the lock every judge of the machine takes on this GPU; none off it
            device_lock = None if self.device.type != "cuda" else gpu_lock_of(
                torch.cuda.current_device() if self.device.index is None else self.device.index)
        self._engine = _Engine(model, eos_id, seed=seed, device=self.device, allowed=allowed, max_batch=max_batch,
                               batch_wait_s=batch_wait_s, max_cache_tokens=max_cache_tokens,
                               prefill_chunk=prefill_chunk, ignore_eos=ignore_eos, fast_decode=fast_decode,
                               cuda_graphs=cuda_graphs, device_lock=None if device_lock is None else Path(device_lock))
        # Closes the engine when this object is collected; holds no reference to self.
        self._finalizer = weakref.finalize(self, _Engine.close, self._engine, False)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:
        """Sample up to `max_new_tokens` after `prompt_ids` (the whole history of `session`, if
        given). Blocks until this reply is done; safe to call from many threads at once."""
        vocab = self._engine.vocab
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: generation needs at least one token")
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt_ids must be ints in [0, {vocab})")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, not {max_new_tokens!r}")
        if not (temperature > 0 and temperature < float("inf")):
            raise ValueError(f"temperature must be a positive finite number, not {temperature!r}")
        if session is not None and not isinstance(session, str):
            raise ValueError(f"session must be a string id or None, not {type(session).__name__}")
        if max_new_tokens == 0:
            return Generation(token_ids=[], logprobs=[], finish="length")
        return self._engine.submit(_Request(prompt=list(prompt_ids), max_new=max_new_tokens,
                                            temperature=float(temperature), session=session))

    def end_session(self, session: str) -> None:
        """Release the session's KV cache (the episode is over)."""
        self._engine.end_session(session)

    def clear(self) -> None:
        """Drop every session's KV cache: call it after the weights change."""
        self._engine.clear()

    @property
    def stats(self) -> GenStats:
        return self._engine.stats

    def close(self) -> None:
        """Stop the scheduler (requests still waiting fail) and release every cache."""
        self._finalizer.detach()
        self._engine.close(wait=True)

    def __enter__(self) -> HFPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
