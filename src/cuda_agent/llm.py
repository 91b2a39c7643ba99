"""The model client: OpenAI-compatible chat completions (vLLM, SGLang, hosted APIs) via `openai`.

The one client of the project: the agent's loop and the synthesis LLM composer both talk to
models through `ChatClient`. A server that cannot give a reply raises `ProviderError` (after the
client's own retries), the typed error of this boundary.

Two ways of calling tools:
- ``native``: the server's function calling (`tools=` in the request, `tool_calls` in the reply);
- ``text``: for models or servers without it, tools are described in the system prompt and called
  with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in the reply text; the
  results go back as ``<tool_response>`` blocks in a user message.
``auto`` starts native and switches to text for good if the server refuses tool calling. Either
way, a reply whose text carries ``<tool_call>`` blocks and no native calls is parsed as text.

The conversation the loop keeps is canonical (assistant messages with `tool_calls`, `tool`
messages with results); `ChatClient` renders it for the wire in the mode in use.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class ModelConfig(BaseModel):
    """Where the model is served and how to call it. Unset fields come from the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 "
                                                   "(env OPENAI_BASE_URL; default: the OpenAI API)")
    model: str | None = Field(None, description="model name (env CUDA_AGENT_MODEL; default: the first model "
                                                "the server lists)")
    api_key: SecretStr | None = Field(None, description="env OPENAI_API_KEY; local servers accept any value")
    tool_mode: Literal["auto", "native", "text"] = Field("auto", description="how tools are called")
    temperature: float | None = Field(None, description="sampling temperature (server default if unset)")
    top_p: float | None = None
    max_tokens: int | None = Field(8192, description="longest reply, in tokens")
    timeout_s: float = Field(600.0, description="limit on one request")
    max_retries: int = Field(5, ge=0, description="retries of a request after connection errors, timeouts, "
                                                  "rate limits and 5xx responses")
    retry_base_s: float = Field(2.0, description="first back-off; doubles per retry, with jitter")
    retry_max_s: float = Field(60.0, description="longest back-off")
    check: bool = Field(True, description="before a run, ask the server for its model list once, so a server "
                                          "that is down, refuses the key or lacks the model fails at once; off for "
                                          "a server whose list is incomplete or absent")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="extra request fields, e.g. "
                                       "{'chat_template_kwargs': {'enable_thinking': false}} for vLLM")

    @classmethod
    def from_env(cls, **overrides) -> "ModelConfig":
        values = {"base_url": os.environ.get("OPENAI_BASE_URL"), "model": os.environ.get("CUDA_AGENT_MODEL"),
                  "api_key": os.environ.get("OPENAI_API_KEY")}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**{k: v for k, v in values.items() if v is not None})

    def public(self) -> dict:
        """The settings without the key, for trajectories and summaries."""
        return self.model_dump(mode="json", exclude={"api_key"})


class ProviderError(RuntimeError):
    """The model server could not give a reply (after retries), or refused the request.

    `retryable`: a later attempt of the whole rollout may succeed (the server comes back, the
    rate limit passes, the key is fixed); nothing about the rollout itself was wrong."""

    kind = "provider"

    @property
    def retryable(self) -> bool:
        return True


class ContextLengthError(ProviderError):
    """The server refused the request because the conversation is longer than the model's context.
    The same conversation is refused again: the loop ends the run as truncated, not as an error."""

    @property
    def retryable(self) -> bool:
        return False


@dataclass
class ToolCall:
    id: str
    name: str
    raw_arguments: str
    arguments: dict | None = None   # None when raw_arguments did not parse
    error: str | None = None        # why the call is malformed


@dataclass
class ModelReply:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_estimated: bool = False    # the server sent no usage; counts are estimated from characters
    latency_s: float = 0.0
    attempts: int = 1
    text_mode: bool | None = None    # tools were described in the prompt (None: not known, e.g. a replay)

    def message(self) -> dict:
        """The canonical assistant message for the conversation."""
        msg: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.raw_arguments}}
                                 for c in self.tool_calls]
        return msg


class ModelClient(Protocol):
    """What the agent needs of a model: a reply to a conversation, and its settings to record."""

    def complete(self, messages: list[dict], tools: list[dict]) -> ModelReply:
        """The next reply; raises ProviderError (ContextLengthError for a conversation too long)."""
        ...

    def describe(self) -> dict | None:
        """The client's settings for trajectories (never a key), or None."""
        ...


# ---------------------------------------------------------------------------------------------
# Tool calls as text

TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_arguments(raw: str | dict | None) -> tuple[dict | None, str | None]:
    if isinstance(raw, dict):
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    try:
        value = json.loads(raw, strict=False)  # raw newlines inside strings are a common slip
    except (json.JSONDecodeError, TypeError) as exc:
        return None, f"arguments are not valid JSON ({exc})"
    if value is None:  # some servers send null for a tool without parameters
        return {}, None
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, not {type(value).__name__}"
    return value, None


def parse_text_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` block of a reply."""
    calls = []
    for m in TOOL_BLOCK.finditer(text or ""):
        body = m.group(1).strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        cid = f"call_{uuid.uuid4().hex[:12]}"
        try:
            obj = json.loads(body, strict=False)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(cid, "", body, error=f"the <tool_call> block is not valid JSON ({exc})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall(cid, "", body, error='a <tool_call> block needs {"name": ..., "arguments": {...}}'))
            continue
        raw = obj.get("arguments", obj.get("parameters", {}))
        args, err = parse_arguments(raw)
        calls.append(ToolCall(cid, obj["name"], raw if isinstance(raw, str) else json.dumps(raw), args, err))
    return calls


def text_tools_prompt(tools: list[dict]) -> str:
    specs = "\n".join(json.dumps(t["function"]) for t in tools)
    return ("\n\n# Tools\n\nYou act by calling tools. To call one, write a block like this in your reply:\n"
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "model.py"}}\n</tool_call>\n'
            "The block holds one JSON object (escape newlines and quotes inside strings). You may call "
            "several tools in one reply; their results come back in <tool_response> blocks.\n"
            f"Available tools (JSON Schema of each one's arguments):\n<tools>\n{specs}\n</tools>")


def render_text_mode(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The canonical conversation for a server without tool calling."""
    out: list[dict] = []
    for msg in messages:
        role = msg["role"]
        if role == "system":
            out.append({"role": "system", "content": msg["content"] + text_tools_prompt(tools)})
        elif role == "assistant":
            content = msg.get("content") or ""
            calls = msg.get("tool_calls") or []
            if calls and "<tool_call>" not in content:  # made natively before a switch to text mode
                content += "".join(f'\n<tool_call>\n{{"name": {json.dumps(c["function"]["name"])}, '
                                   f'"arguments": {c["function"]["arguments"] or "{}"}}}\n</tool_call>'
                                   for c in calls)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = f'<tool_response name="{msg.get("name", "")}">\n{msg["content"]}\n</tool_response>'
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": role, "content": msg["content"]})
    for msg in out:
        msg.pop("_tool", None)
    return out


def render_native(messages: list[dict]) -> list[dict]:
    out = []
    for msg in messages:
        if msg["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": msg["tool_call_id"], "content": msg["content"]})
        elif msg["role"] == "assistant":
            out.append({k: msg[k] for k in ("role", "content", "tool_calls") if k in msg})
        else:
            out.append({"role": msg["role"], "content": msg["content"]})
    return out


def estimate_tokens(messages: list[dict]) -> int:
    """A rough count (about 3.5 characters a token for code and English) where the server gives none."""
    return int(sum(len(json.dumps(m)) for m in messages) / 3.5) + 1


# ---------------------------------------------------------------------------------------------
# The client

_CONTEXT_ERROR = re.compile(r"context length|context window|maximum context|context_length_exceeded|"
                            r"too many tokens|prompt is too long|input is too long|reduce the length", re.I)
_TOOLS_UNSUPPORTED = re.compile(r"tool.choice|tool.call|support\w* (for )?tools|tools? (is |are )?not supported|"
                                r"function.call", re.I)


class ChatClient:
    """An OpenAI-compatible chat client with retries, back-off, time limits and token accounting."""

    def __init__(self, config: ModelConfig, *, sleep=time.sleep):
        import openai

        self.config = config
        self._openai = openai
        key = config.api_key.get_secret_value() if config.api_key else ("EMPTY" if config.base_url else None)
        if key is None:
            raise ProviderError("no model server: pass --base-url (OPENAI_BASE_URL) for a local server, or an API "
                             "key (--api-key, OPENAI_API_KEY) for the OpenAI API")
        self._client = openai.OpenAI(base_url=config.base_url, api_key=key, timeout=config.timeout_s,
                                     max_retries=0)  # retries are ours: counted, logged, backed off
        self.text_mode = config.tool_mode == "text"
        self._model = config.model
        self._sleep = sleep

    @property
    def model(self) -> str:
        if self._model is None:
            models = self._call(lambda: self._client.models.list())[0]
            ids = [m.id for m in models.data]
            if not ids:
                raise ProviderError(f"the server at {self.config.base_url} lists no models; pass --model")
            self._model = ids[0]
        return self._model

    def describe(self) -> dict:
        return self.config.public()

    def check(self, timeout_s: float = 10.0) -> str:
        """One request to the server before any work starts (its model list, no retries, a short
        limit): a dead or misconfigured server then costs seconds and one clear line, not each
        task's full retry schedule. Returns the model the run will use.

        Raises ProviderError when the server cannot be reached, refuses the key, or does not serve
        the named model. A server without a model list (404, 405) passes when a model is named:
        its reply proves it is up."""
        o = self._openai
        where = self.config.base_url or "the OpenAI API"
        try:
            models = self._client.with_options(timeout=timeout_s, max_retries=0).models.list()
        except (o.APIConnectionError, o.APITimeoutError) as exc:  # APITimeoutError is a connection error
            kind = "no answer within %gs" % timeout_s if isinstance(exc, o.APITimeoutError) else "cannot connect"
            raise ProviderError(f"model server at {where}: {kind} ({_root_cause(exc)}); is it running? "
                                "(--base-url, OPENAI_BASE_URL)") from None
        except o.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise ProviderError(f"model server at {where} refused the API key ({exc.status_code}: "
                                    f"{_error_text(exc)}); pass --api-key or OPENAI_API_KEY") from None
            if self._model is not None and exc.status_code in (404, 405):
                return self._model
            hint = "; name the model (--model)" if self._model is None and exc.status_code in (404, 405) else ""
            raise ProviderError(f"model server at {where} answered {exc.status_code} to its model list: "
                                f"{_error_text(exc)}{hint}") from None
        ids = [m.id for m in models.data]
        if self._model is None:
            if not ids:
                raise ProviderError(f"the server at {where} lists no models; pass --model")
            self._model = ids[0]
        elif ids and self._model not in ids:
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            raise ProviderError(f"model server at {where} does not serve {self._model!r}; it lists: {shown} "
                                "(--model, CUDA_AGENT_MODEL; -c model.check=false skips this check)")
        return self._model

    def complete(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> ModelReply:
        """`seed`: the request's sampling seed, for servers that honour one (reproducible synthesis)."""
        while True:
            wire = render_text_mode(messages, tools) if self.text_mode else render_native(messages)
            body: dict[str, Any] = {"model": self.model, "messages": wire}
            if not self.text_mode and tools:
                body["tools"] = tools
            for key in ("temperature", "top_p", "max_tokens"):
                if getattr(self.config, key) is not None:
                    body[key] = getattr(self.config, key)
            if self.config.extra_body:
                body["extra_body"] = dict(self.config.extra_body)
            if seed is not None:
                body["seed"] = seed
            t0 = time.monotonic()
            try:
                response, attempts = self._call(lambda: self._client.chat.completions.create(**body))
            except self._openai.BadRequestError as exc:
                text = _error_text(exc)
                if _CONTEXT_ERROR.search(text):
                    raise ContextLengthError(text) from None
                if not self.text_mode and self.config.tool_mode == "auto" and _TOOLS_UNSUPPORTED.search(text):
                    self.text_mode = True  # this server does no tool calling: describe tools in text
                    continue
                raise ProviderError(f"the server refused the request: {text}") from None
            return self._reply(response, attempts, time.monotonic() - t0, wire)

    def _call(self, fn):
        """fn() with retries on transient failures; (result, attempts)."""
        o = self._openai
        transient = (o.APITimeoutError, o.APIConnectionError, o.RateLimitError, o.InternalServerError)
        for attempt in range(self.config.max_retries + 1):
            try:
                return fn(), attempt + 1
            except o.BadRequestError:
                raise
            except o.APIStatusError as exc:
                if not isinstance(exc, transient) and exc.status_code not in (408, 409) and exc.status_code < 500:
                    raise ProviderError(f"the server answered {exc.status_code}: {_error_text(exc)}") from None
                last = exc
            except transient as exc:
                last = exc
            if attempt < self.config.max_retries:
                delay = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** attempt)
                self._sleep(delay * (0.5 + random.random() / 2))
        detail, cause = _error_text(last), _root_cause(last)
        raise ProviderError(f"no reply after {self.config.max_retries + 1} attempts: {type(last).__name__}: "
                            f"{detail}" + (f" ({cause})" if cause != detail else ""))

    def _reply(self, response, attempts: int, latency_s: float, wire: list[dict]) -> ModelReply:
        if not response.choices:
            raise ProviderError("the server returned no choices")
        choice = response.choices[0]
        msg = choice.message
        content = msg.content or ""
        calls = []
        for tc in msg.tool_calls or []:
            fn = getattr(tc, "function", None)
            name = getattr(fn, "name", "") or ""
            raw = getattr(fn, "arguments", "") or ""
            args, err = parse_arguments(raw)
            calls.append(ToolCall(tc.id or f"call_{uuid.uuid4().hex[:12]}", name, raw, args, err))
        if not calls and "<tool_call>" in content:
            calls = parse_text_tool_calls(content)
        extra = getattr(msg, "model_extra", None) or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        usage = response.usage
        if usage is not None and usage.prompt_tokens is not None:
            prompt, completion, estimated = usage.prompt_tokens, usage.completion_tokens or 0, False
        else:
            prompt = estimate_tokens(wire)
            completion, estimated = estimate_tokens([{"c": content}]), True
        return ModelReply(content=content, tool_calls=calls, reasoning=reasoning if isinstance(reasoning, str) else None,
                          finish_reason=choice.finish_reason, prompt_tokens=prompt, completion_tokens=completion,
                          usage_estimated=estimated, latency_s=latency_s, attempts=attempts,
                          text_mode=self.text_mode)


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's text ("[Errno 111] Connection refused"): the client's own message for a
    failed connection says only "Connection error."."""
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__
    return str(seen) or type(seen).__name__


def _error_text(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:2000]
        return json.dumps(body)[:2000]
    return str(exc)[:2000]
