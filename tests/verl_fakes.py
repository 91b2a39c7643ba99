"""Helpers of the verl tests (tests/test_train_verl_*.py), which run in verl's own environment
(`.venv-verl`, see .ci/run): verl's config composed by Hydra as `verl.trainer.main_ppo` composes it,
a token server that replays scripted replies, and `CudaAgentLoop` run once inside an event loop
(as verl's own CPU tests drive agent loops)."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from cuda_agent.tasks import Task

# the hermes tool calls of the scripted episodes
LIST = '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>'
WRITE_GOOD = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "model_new.py", "content": "# GOOD\\n"}}\n'
              '</tool_call>')
VERIFY = '<tool_call>\n{"name": "verify", "arguments": {}}\n</tool_call>'
SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


def need_verl():
    """Skip (with the reason) where verl's agent loop cannot be imported: it lives in its own
    environment, since verl 0.9.1 pins transformers <5.11."""
    pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                        reason="verl is not installed here (CI runs these tests in .venv-verl)")


def verl_config_dir() -> str:
    import verl.trainer.main_ppo as main_ppo

    return str(Path(main_ppo.__file__).parent / "config")


def compose(config_name: str, overrides: list[str]):
    """verl's config as its entry point composes it (same config folder, same overrides)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def script_overrides(script: Path, module: str) -> list[str]:
    """The `key=value` overrides a stage script passes to `python3 -m <module>` (or torchrun -m)."""
    line = next(x for x in script.read_text().replace("\\\n", " ").splitlines() if f" {module} " in x)
    words = shlex.split(line, comments=True)
    at = words.index(module)
    out = []
    for w in words[at + 1:]:
        if w in ("&&", ";", "||") or "=" not in w or w.startswith("-"):
            break
        out.append(w)
    if not out:
        raise AssertionError(f"{script.name}: no overrides after {module}")
    return out


class ScriptedServer:
    """verl's server manager, replaying token replies: `replies` are texts (EOS appended), or an
    exception to raise on that turn. Every request is kept."""

    def __init__(self, tokenizer, replies: list):
        self.tok, self.replies, self.requests = tokenizer, list(replies), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
        reply = self.replies.pop(0) if self.replies else "nothing more"
        if isinstance(reply, BaseException):
            raise reply
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


def run_loop(config, tokenizer, server, task: Task, gate, *, mode: str = "agentic"):
    """One `CudaAgentLoop.run` with `gate` as the judge, as verl's worker awaits it."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from cuda_agent.train import verl_loop

    verl_loop.CudaAgentLoop.gate_factory = staticmethod(lambda cfg: gate)
    verl_loop.CudaAgentLoop._gates = {}

    async def main():
        loop = verl_loop.CudaAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server,
                                       tokenizer=tokenizer, processor=None, dataset_cls=None,
                                       data_config=DictConfigWrap(OmegaConf.create({})))
        return await loop.run({"temperature": 1.0}, extra_info={"task": task.model_dump_json(), "mode": mode},
                              raw_prompt=[])

    try:
        return asyncio.run(main())
    finally:
        verl_loop.CudaAgentLoop.gate_factory = None
        verl_loop.CudaAgentLoop._gates = {}
