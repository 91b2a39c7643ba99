"""A scripted model behind a loopback OpenAI-compatible HTTP server (stdlib only).

Tests drive the agent through the real `openai` client: each POST /v1/chat/completions takes the
next step of a script. A step is a reply (`tool(...)`, `tools(...)`, `say(...)`, `http_error(...)`)
or a function of the request body returning one, so a script can check what the agent sent (the
last observation, the tools offered) before answering. A failed check is recorded in `errors` and
answered with HTTP 400, which ends the run with an error.
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = dict | Callable[[dict], dict]

# The smallest task the agent's tests solve (ReLU on 64 floats): quick to judge on the CPU backend.
RELU_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""


def tool(name: str, **arguments: Any) -> dict:
    return {"tool_calls": [(name, json.dumps(arguments))]}


def tools(*calls: tuple[str, dict]) -> dict:
    return {"tool_calls": [(name, json.dumps(args)) for name, args in calls]}


def raw_tool(name: str, raw_arguments: str) -> dict:
    return {"tool_calls": [(name, raw_arguments)]}


def say(content: str, finish_reason: str = "stop") -> dict:
    return {"content": content, "finish_reason": finish_reason}


def http_error(status: int, message: str) -> dict:
    return {"status": status, "message": message}


def last_observation(request: dict) -> str:
    """The newest tool result in a request (native tool message or text-mode tool_response)."""
    for msg in reversed(request["messages"]):
        if msg["role"] == "tool" or (msg["role"] == "user" and "<tool_response" in (msg.get("content") or "")):
            return msg["content"]
    return ""


class ScriptedModel:
    def __init__(self, script: list[Step] | None = None, *, default: Step | None = None,
                 reject_tools: bool = False, usage: bool = True):
        self.script = list(script or [])
        self.default = default           # the step used once the script is exhausted (None: fail)
        self.reject_tools = reject_tools  # answer like vLLM started without a tool-call parser
        self.usage = usage
        self.requests: list[dict] = []   # chat completion request bodies
        self.model_lists = 0              # GET /v1/models
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._n = 0
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    model.model_lists += 1
                    self._send(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model",
                                                                 "created": 0, "owned_by": "tests"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                status, payload = model.answer(body)
                self._send(status, payload)

            def _send(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedModel":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(body)
            if self.reject_tools and body.get("tools"):
                return 400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice and '
                                                  "--tool-call-parser to be set", "type": "BadRequestError"}}
            if self._n < len(self.script):
                step = self.script[self._n]
            elif self.default is not None:
                step = self.default
            else:
                self.errors.append(f"script exhausted at request {len(self.requests)}")
                return 400, {"error": {"message": "script exhausted"}}
            self._n += 1
            try:
                reply = step(body) if callable(step) else step
            except Exception:
                self.errors.append(traceback.format_exc())
                return 400, {"error": {"message": "scripted check failed"}}
        if "status" in reply:
            return reply["status"], {"error": {"message": reply["message"]}}
        message: dict = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = [{"id": f"call_{len(self.requests)}_{i}", "type": "function",
                                      "function": {"name": name, "arguments": args}}
                                     for i, (name, args) in enumerate(reply["tool_calls"])]
        prompt = len(json.dumps(body["messages"])) // 4
        completion = len(json.dumps(message)) // 4
        out = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
               "model": body.get("model", "scripted-model"),
               "choices": [{"index": 0, "message": message,
                            "finish_reason": reply.get("finish_reason") or ("tool_calls" if reply.get("tool_calls")
                                                                            else "stop")}]}
        if self.usage:
            out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                            "total_tokens": prompt + completion}
        return 200, out
