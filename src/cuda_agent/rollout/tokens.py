"""The token front: a policy that sees and emits token ids (training), never text tokenised again.

    prompt_ids        the chat template over the system prompt, the task and the tool schemas
    response_ids      every token after the prompt: the model's turns and the observations between them
    response_mask     1 on the model's tokens, 0 on observation tokens (tool results, the chat
                      template's turn markers around them): losses and GAE use 1-tokens only
    response_logprobs the sampling log-probability of each model token (0.0 where the mask is 0)

Each turn the policy generates from all tokens so far; its reply is decoded once, its hermes
`<tool_call>` blocks are parsed (a malformed block is an observation that says what is wrong), and
the observations the engine hands back are rendered by the tokenizer's chat template as the text
between the model's turn and the next generation prompt, so the model's tokens are never
duplicated or re-tokenised. Observations are rendered only when the next turn is generated: an
episode, however it ends, ends on a model token (verl puts the reward on the last response token
and GAE drops rewards on mask-0 tokens).

Budgets: `context_tokens` bounds prompt + response, `response_tokens` (optional; verl's
`response_length`) bounds the response alone, observations included, so a caller never cuts an
episode afterwards; `turn_tokens` bounds one model turn. An observation that does not fit with
room for one more model token ends the episode as context_exhausted.

The policy protocol: `generate(prompt_ids, max_new_tokens, temperature, session=None)` with
`session` the episode's id on every turn of an episode (a policy may keep a KV cache per session),
and optionally `end_session(session)`, called once when the episode ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel

from cuda_agent.llm import TOOL_BLOCK, ToolCall, parse_text_tool_calls

from .env import Reset
from .front import ModelTurn, Usage
from .outcome import InternalError, Truncation, truncate


class Generation(BaseModel):
    """One model turn: the sampled token ids and their log-probabilities."""

    token_ids: list[int]
    logprobs: list[float]
    finish: Literal["stop", "length"]


class TokenPolicy(Protocol):
    """What an episode needs of a model: tokens in, tokens and logprobs out. The turn's stop token
    (EOS) is included in the returned ids. A policy may also define `end_session(session)`."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation: ...


# ---------------------------------------------------------------------------------------------
# Rendering with the tokenizer's chat template

_SENTINEL = "\u2063ASSISTANT-TURN-7f3c\u2063"


class ChatRenderer:
    """Token ids of a conversation's pieces through a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token or ""
        text = self.tok.apply_chat_template(self._base(), tokenize=False)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not render assistant content verbatim")
        self._prefix = text
        self.close = text[at + len(_SENTINEL):]   # what ends an assistant turn, e.g. "<|im_end|>\n"

    @staticmethod
    def _base() -> list[dict]:
        return [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _SENTINEL}]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        text = self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def observation_ids(self, new_messages: list[dict], turn_closed: bool) -> list[int]:
        """Tokens between the end of the model's turn and the next generation prompt: the rest of
        the turn's closing (all of it when the turn was cut at the token limit), the new
        tool/user messages and the generation prompt."""
        full = self.tok.apply_chat_template(self._base() + new_messages, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError("the chat template renders earlier turns differently once later ones follow")
        close = self.close
        if turn_closed and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text):]
        return self.encode(close + full[len(self._prefix):])


@dataclass
class Tokens:
    """An episode's token sequence as it grows."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def model(self, gen: Generation) -> None:
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs

    def observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.ids)


def assistant_message(text: str, calls: list[ToolCall]) -> dict:
    """The canonical assistant message (as the chat front keeps it): well-formed calls structured,
    the prose without the hermes blocks; a malformed block stays in the text as written."""
    good = [c for c in calls if not c.error]
    if not good or len(good) != len(calls):
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": TOOL_BLOCK.sub("", text).strip(),
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                           for c in good]}


@dataclass(frozen=True)
class TokenLimits:
    context_tokens: int = 131_072          # prompt + response
    turn_tokens: int = 8192                # one model turn
    temperature: float = 1.0
    response_tokens: int | None = None     # response alone (observations included); None: no own bound


class TokenFront:
    """A `front.ModelFront` over a token policy (see the module docstring)."""

    def __init__(self, policy: TokenPolicy, renderer: ChatRenderer, limits: TokenLimits = TokenLimits(), *,
                 session: str | None = None):
        if limits.response_tokens is not None and limits.response_tokens < 1:
            raise ValueError(f"response_tokens must be at least 1, got {limits.response_tokens}")
        self.policy, self.renderer, self.limits, self.session = policy, renderer, limits, session
        self.tools: list[dict] = []
        self.messages: list[dict] = []
        self.replies = 0
        self.tokens = Tokens(prompt=[])
        self._pending: list[dict] = []      # observations not yet rendered
        self._closed = True                 # the last model turn ended with EOS

    # ------------------------------------------------------------------------------ the protocol
    def begin(self, start: Reset, messages: list[dict]) -> None:
        self.open(messages, start.tools)

    def open(self, messages: list[dict], tools: list[dict] | None) -> None:
        """Start from `messages` (the single-turn warm-up episode offers no tools)."""
        self.tools = list(tools or [])
        self.messages = list(messages)
        self.tokens = Tokens(prompt=self.renderer.prompt_ids(self.messages, self.tools or None))

    def room(self) -> int:
        """Tokens the episode may still add under both budgets."""
        lim, t = self.limits, self.tokens
        left = lim.context_tokens - t.total
        if lim.response_tokens is not None:
            left = min(left, lim.response_tokens - len(t.ids))
        return left

    def reply(self, turn: int) -> ModelTurn:
        if self._pending:
            obs = self.renderer.observation_ids(self._pending, self._closed)
            if len(obs) >= self.room():   # no room for the observation and a reply: the budget ends it here
                raise truncate(Truncation.CONTEXT_EXHAUSTED, f"~{self.tokens.total + len(obs)} tokens needed, "
                                                             f"{self._budget_text()} available")
            self.tokens.observation(obs)
            self._pending = []
        room = self.room()
        if room <= 0:
            raise truncate(Truncation.CONTEXT_EXHAUSTED, f"{self._budget_text()} used")
        max_new = min(self.limits.turn_tokens, room)
        gen = self.policy.generate(self.tokens.prompt + self.tokens.ids, max_new, self.limits.temperature,
                                   session=self.session)
        if len(gen.token_ids) > max_new or len(gen.logprobs) != len(gen.token_ids):
            raise InternalError(f"the policy returned {len(gen.token_ids)} tokens and {len(gen.logprobs)} logprobs "
                                f"for a turn of at most {max_new} tokens")
        self.replies += 1
        self.tokens.model(gen)
        self._closed = gen.finish == "stop" and bool(gen.token_ids) and gen.token_ids[-1] == self.renderer.eos_id
        text = self.renderer.decode(gen.token_ids[:-1] if self._closed else gen.token_ids)
        calls = parse_text_tool_calls(text) if self.tools else []
        self.messages.append(assistant_message(text, calls))
        return ModelTurn(text=text, calls=calls, cut=gen.finish == "length")

    def observe(self, message: dict, turn: int) -> None:
        self.messages.append(message)
        self._pending.append(message)

    def annotate(self, text: str, turn: int, *, reason: str) -> None:
        last = self._pending[-1]   # observe() appends to both lists: it is messages[-1] too
        new = {**last, "content": last["content"] + text}
        self._pending[-1] = self.messages[-1] = new

    def usage(self) -> Usage:
        t = self.tokens
        return Usage(len(t.prompt), sum(t.mask), t.total, self.limits.context_tokens)

    def end(self) -> None:
        """Release the policy's session (its KV cache), if it keeps sessions."""
        end_session = getattr(self.policy, "end_session", None)
        if end_session is not None and self.session is not None:
            end_session(self.session)

    def _budget_text(self) -> str:
        lim = self.limits
        extra = f" ({lim.response_tokens} response tokens)" if lim.response_tokens is not None else ""
        return f"{lim.context_tokens} tokens{extra}"
