"""Composition: deterministic per seed, KernelBench format, runnable, rescalable; the LLM composer
speaks to an OpenAI-compatible endpoint (a loopback server replaying a scripted completion)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading

import pytest
import torch

from _synth_helpers import load_module, torch_catalog
from cuda_agent.synth.compose import (ComposeConfig, ComposeError, LLMComposer, LLMConfig, ProgrammaticComposer,
                                      get_batch, set_batch)
from cuda_agent.tasks import validate_reference_source


@pytest.fixture(scope="module")
def composer() -> ProgrammaticComposer:
    seeds, _ = torch_catalog()
    return ProgrammaticComposer(list(seeds), ComposeConfig(profile="cpu"))


def test_same_seed_same_task_and_seeds_differ(composer):
    a, b = composer.compose(7), composer.compose(7)
    assert a == b
    sources = {composer.compose(k).source for k in range(12)}
    assert len(sources) == 12


def test_composed_modules_run_and_survive_a_batch_change(composer):
    lengths = set()
    for k in range(40):
        comp = composer.compose(k)
        validate_reference_source(comp.source, comp.name)
        assert 1 <= len(comp.ops) <= 5
        lengths.add(len(comp.ops))
        for batch in (get_batch(comp.source), 2 * get_batch(comp.source) + 1):
            m = load_module(set_batch(comp.source, batch))
            torch.manual_seed(0)
            xs = m.get_inputs()
            assert all(x.shape[0] == batch for x in xs)
            out = m.Model(*m.get_init_inputs())(*xs)
            assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
            assert out.dim() >= 1 and out.shape[0] == batch, comp.source
    assert lengths >= {2, 3, 4}   # not only single ops


def test_composer_respects_max_ops():
    seeds, _ = torch_catalog()
    c = ProgrammaticComposer(list(seeds), ComposeConfig(profile="cpu", min_ops=2, max_ops=2))
    assert {len(c.compose(k).ops) for k in range(10)} == {2}


SCRIPTED = '''Here is the module.
```python
import torch
import torch.nn as nn

BATCH = 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def get_inputs():
    return [torch.randn(BATCH, 64)]


def get_init_inputs():
    return []
```
'''


class _Scripted(http.server.BaseHTTPRequestHandler):
    replies: list[str] = []
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        content = type(self).replies.pop(0)
        payload = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": content}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="openai not installed")
def test_llm_composer_against_a_loopback_openai_endpoint(monkeypatch):
    seeds, _ = torch_catalog()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _Scripted.replies = [SCRIPTED, "I cannot do that."]
        _Scripted.requests = []
        monkeypatch.setenv("SYNTH_TEST_KEY", "sk-test")
        llm = LLMConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="scripted",
                        api_key_env="SYNTH_TEST_KEY", timeout_s=10)
        composer = LLMComposer(list(seeds), llm)
        comp = composer.compose(3)
        assert comp.composer == "llm" and 2 <= len(comp.ops) <= 5
        validate_reference_source(comp.source, comp.name)
        m = load_module(comp.source)
        assert m.Model()(*m.get_inputs()).shape == (8, 32)
        req = _Scripted.requests[0]
        assert req["path"].endswith("/chat/completions") and req["body"]["model"] == "scripted"
        assert req["auth"] == "Bearer sk-test"
        prompt = req["body"]["messages"][0]["content"]
        assert all(op in prompt for op in comp.ops)      # the sampled seeds were shown to the model
        with pytest.raises(ComposeError, match="not a KernelBench module"):
            composer.compose(4)                          # prose without a module is a failed candidate
    finally:
        server.shutdown()
        server.server_close()


def test_an_op_whose_output_grows_with_the_batch_beyond_dim_0_is_not_composed():
    """`cdist` of a (BATCH, F) value against a (BATCH, F) input is BATCH x BATCH: it mixes samples and
    a later parameter shaped from that output would break when BATCH is rescaled."""
    seeds, _ = torch_catalog()
    cdist = next(s for s in seeds if s.name == "torch.cdist")
    tail = [s for s in seeds if s.name in ("nn.Linear", "torch.add", "nn.Tanh")]
    c = ProgrammaticComposer([cdist, *tail], ComposeConfig(profile="cpu", min_ops=2, max_ops=3, residual_prob=0.0))
    made = []
    for k in range(40):
        try:
            comp = c.compose(k)
        except ComposeError:
            continue
        made.append(comp)
        b = get_batch(comp.source)
        for batch in (b, 2 * b + 1):
            m = load_module(set_batch(comp.source, batch))
            out = m.Model(*m.get_init_inputs())(*m.get_inputs())
            assert out.shape[0] == batch and tuple(out.shape[1:]) == tuple(comp.output_shape[1:]), comp.source
    assert any("torch.cdist" in comp.ops for comp in made)   # cdist against a parameter row still composes


def test_constant_initial_parameters_are_randomised_in_the_source():
    seeds, _ = torch_catalog()
    norm = [s for s in seeds if s.name in ("nn.LayerNorm", "nn.PReLU")]
    c = ProgrammaticComposer(norm, ComposeConfig(profile="cpu", min_ops=1, max_ops=1))
    for k in range(4):
        comp = c.compose(k)
        m = load_module(comp.source)
        torch.manual_seed(0)
        model = m.Model(*m.get_init_inputs())
        for name, p in model.named_parameters():
            assert p.numel() == 1 or not bool((p == p.reshape(-1)[0]).all()), (name, comp.source)
            if p.numel() == 1:
                assert float(p.detach()) != 0.25, name   # PReLU's default
