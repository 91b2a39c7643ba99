"""`TokenPolicy` over an inference server: vLLM's OpenAI-compatible completions, or SGLang's native
`/generate`.

The prompt goes as token ids and the reply comes back as token ids with the log-probability of each,
never as text to tokenise again. The server does its own batching and prefix caching, so `session`
is accepted and ignored and `end_session` does nothing.

    api="openai"   POST {base_url}/completions (base_url ends in /v1): `prompt` a list of ids,
                   `max_tokens`, `temperature`, `top_p` 1, `logprobs` 1, and vLLM's
                   `return_tokens_as_token_ids` (tokens come back as "token_id:N") and
                   `return_token_ids` (newer vLLM: `choices[0].token_ids`); `allowed` goes as vLLM's
                   `allowed_token_ids`. The sampled tokens' `token_logprobs` are returned.
    api="sglang"   POST {base_url}/generate (base_url is the server root): `input_ids`,
                   `sampling_params` {max_new_tokens, temperature, top_p 1, skip_special_tokens
                   false}, `return_logprob` true; ids and log-probabilities are read from
                   `meta_info.output_token_logprobs` ([logprob, id, text] triples). SGLang's OpenAI
                   endpoint returns token strings only, hence the native one.

What the trainer needs and the server must be told: log-probabilities of the *sampling*
distribution (after temperature). vLLM returns the raw model's by default: start it with
`--logprobs-mode processed_logprobs`. The rollout/trainer gap (`rollout_logprob_gap` in the PPO
metrics) shows a mismatch. A reply that ends on EOS holds the EOS id only if the server returns it
among the generated ids (vLLM's token_ids do; not checked here against every server version), and
`finish` is the server's word ("stop" or "length"; anything else is an error).
"""

from __future__ import annotations

from typing import Literal

import httpx

from cuda_agent.rollout.tokens import Generation

Api = Literal["openai", "sglang"]


class ServerPolicyError(RuntimeError):
    """The server could not be reached, refused the request, or answered without token ids or
    log-probabilities."""


class CompletionsPolicy:
    """Many episode threads may call `generate` at once (one pooled HTTP client, thread-safe)."""

    def __init__(self, base_url: str, model: str = "", *, api: Api = "openai", allowed: list[int] | None = None,
                 api_key: str | None = None, timeout_s: float = 900.0, max_connections: int = 256):
        if api not in ("openai", "sglang"):
            raise ValueError(f"api must be 'openai' or 'sglang', not {api!r}")
        if api == "sglang" and allowed is not None:
            raise ValueError("allowed ids need vLLM's allowed_token_ids (api='openai'); SGLang's /generate has none")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api = api
        self.allowed = allowed
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers,
                                    limits=httpx.Limits(max_connections=max_connections,
                                                        max_keepalive_connections=max_connections))

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: generation needs at least one token")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, not {max_new_tokens!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, not {temperature!r}")
        if max_new_tokens == 0:
            return Generation(token_ids=[], logprobs=[], finish="length")
        if self.api == "openai":
            body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": max_new_tokens,
                    "temperature": temperature, "top_p": 1.0, "n": 1, "logprobs": 1,
                    "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False}
            if self.allowed is not None:
                body["allowed_token_ids"] = list(self.allowed)
            return parse_openai(self._post("/completions", body))
        body = {"input_ids": list(prompt_ids), "return_logprob": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": 1.0,
                                    "skip_special_tokens": False}}
        return parse_sglang(self._post("/generate", body))

    def end_session(self, session: str) -> None:
        """Nothing to release: the server's prefix cache manages itself."""

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, body: dict) -> dict:
        url = self.base_url + path
        try:
            resp = self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise ServerPolicyError(f"POST {url} failed: {exc!r}") from exc
        if resp.status_code != 200:
            raise ServerPolicyError(f"POST {url}: HTTP {resp.status_code}: {resp.text[:500]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerPolicyError(f"POST {url}: the answer is not JSON: {resp.text[:200]!r}") from exc


def _finish(reason) -> Literal["stop", "length"]:
    if reason in ("stop", "length"):
        return reason
    raise ServerPolicyError(f"unexpected finish reason {reason!r} (expected 'stop' or 'length')")


def _token_id(token) -> int:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            pass
    raise ServerPolicyError(f"the server returned the token {token!r}, not its id: a vLLM server needs "
                            "return_tokens_as_token_ids (vLLM >= 0.5) or return_token_ids")


def parse_openai(body: dict) -> Generation:
    """A completions answer (vLLM's extensions) as a Generation."""
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ServerPolicyError(f"no choices in the answer: {str(body)[:300]}") from None
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    if logprobs is None:
        raise ServerPolicyError("the server returned no logprobs (the request asks for logprobs=1)")
    ids = choice.get("token_ids")
    if ids is None:
        ids = [_token_id(t) for t in lp.get("tokens") or []]
    if len(ids) != len(logprobs) or any(x is None for x in logprobs):
        raise ServerPolicyError(f"{len(ids)} token ids but {len(logprobs)} logprobs (or some null) in the answer")
    return Generation(token_ids=[int(i) for i in ids], logprobs=[float(x) for x in logprobs],
                      finish=_finish(choice.get("finish_reason")))


def parse_sglang(body: dict) -> Generation:
    """An SGLang /generate answer as a Generation."""
    meta = body.get("meta_info") if isinstance(body, dict) else None
    triples = (meta or {}).get("output_token_logprobs")
    if triples is None:
        raise ServerPolicyError("the SGLang answer has no meta_info.output_token_logprobs (return_logprob was asked)")
    try:
        logprobs = [float(t[0]) for t in triples]
        ids = [int(t[1]) for t in triples]
    except (TypeError, ValueError, IndexError):
        raise ServerPolicyError(f"malformed output_token_logprobs: {str(triples)[:200]}") from None
    reason = meta.get("finish_reason")
    return Generation(token_ids=ids, logprobs=logprobs,
                      finish=_finish(reason.get("type") if isinstance(reason, dict) else reason))
