"""The cluster path: CUDA Agent episodes as a verl agent loop, registered as `cuda_agent`.

verl's rollout workers instantiate one `CudaAgentLoop` per sample (a data row whose `agent_name`
is `cuda_agent`) and await `run(sampling_params, **row)`. The loop runs this project's episode
(the episode engine with the token front, `episode.run_agentic_episode`, or the single-turn
warm-up episode when the row says so) in a worker thread, with a token policy that forwards each
turn to verl's server manager (`server_manager.generate(request_id, prompt_ids=...,
sampling_params=...)`, token-in/token-out, the episode's id as one sticky request id so the
engine keeps its prefix cache) on the event loop. The tools run in a fresh workspace, scoring with
the run's `reward` settings; the judge behind them is the node's judge pool
(`cuda_agent.rollout.ray_judge`: a `JudgeActor` per node, shared by every rollout of that node,
reached through `RayEvaluator`). The episode is bounded by verl's `response_length`
(`EpisodeConfig.response_tokens`), so nothing is cut afterwards and it ends on a model token,
where verl puts `reward_score`: the judge's milestone reward (verl's reward stage is skipped). The
output carries the episode's tokens, `response_mask` (0 on observation tokens) and the engine's
logprobs.

Settings come from a `cuda_agent` table in verl's config (`+cuda_agent.episode.max_turns=150`,
`+cuda_agent.judge.device=cuda`, ...; see `verl_config.py`): `episode` (EpisodeConfig), `judge`
(JudgeConfig), `reward` (RewardConfig), `pool` (PoolConfig), `workdir`, `episodes_dir` (an absolute
folder every node can write, checked at start), `judge_gpus` (GPUs per node Ray reserves for the
judge; 0: it shares the node's) and `concurrency` (episodes one rollout worker runs at once: the
size of the loop's own thread pool; the default pool would cap it at min(32, cores + 4)).

Import this module only where verl is installed (the `train` extra or verl's own environment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from cuda_agent.agent.tools import Toolbox
from cuda_agent.agent.workspace import create_workspace
from cuda_agent.judge import JudgeConfig
from cuda_agent.reward import RewardConfig
from cuda_agent.rollout.ray_judge import RayEvaluator, judge_actor
from cuda_agent.tasks import Task


from .episode import (ChatRenderer, EpisodeConfig, EpisodeRecord, Generation,
                      run_agentic_episode, run_single_turn_episode)

log = logging.getLogger(__name__)


def check_episodes_dir(path: str | os.PathLike) -> Path:
    """The shared episodes folder, made if missing: absolute (every node and the later stages read
    the same path) and writable, else ValueError before any episode runs."""
    folder = Path(path)
    if not folder.is_absolute():
        raise ValueError(f"cuda_agent.episodes_dir must be an absolute path on storage every node shares, "
                         f"got {str(path)!r}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cuda_agent.episodes_dir {folder} is not writable here: {exc}") from exc
    return folder


def _plain(node) -> dict:
    """A verl (OmegaConf) table as a plain dict; absent: {}."""
    if node is None:
        return {}
    try:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    except ImportError:
        return dict(node)


class ServerPolicy:
    """A `TokenPolicy` over verl's async server manager, called from the episode's thread: each turn
    is scheduled on the agent loop's event loop and awaited there. The temperature and the other
    sampling settings are verl's (`sampling_params`); `max_tokens` is the turn's budget. The
    episode's `session` is the request id verl routes by (sticky: one engine, its prefix cache)."""

    def __init__(self, server_manager, sampling_params: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 eos_id: int, request_id: str):
        self.server_manager, self.sampling_params, self.loop = server_manager, dict(sampling_params), loop
        self.eos_id, self.request_id = eos_id, request_id
        self.logprobs_missing = False

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 session: str | None = None) -> Generation:
        params = {**self.sampling_params, "max_tokens": max_new_tokens}
        future = asyncio.run_coroutine_threadsafe(
            self.server_manager.generate(session or self.request_id, prompt_ids=list(prompt_ids),
                                         sampling_params=params), self.loop)
        out = future.result()
        ids = list(out.token_ids)[:max_new_tokens]
        logprobs = list(out.log_probs)[: len(ids)] if getattr(out, "log_probs", None) else None
        if logprobs is None:
            self.logprobs_missing = True
            logprobs = [0.0] * len(ids)
        finish = "stop" if (ids and ids[-1] == self.eos_id) or len(ids) < max_new_tokens else "length"
        return Generation(token_ids=ids, logprobs=logprobs, finish=finish)


@register("cuda_agent")
class CudaAgentLoop(AgentLoopBase):
    """One CUDA Agent episode per data row (verl instantiates the class per sample)."""

    # tests (and custom deployments) may set a factory (JudgeConfig -> Evaluator); default: the
    # node's JudgeActor through Ray
    gate_factory = None
    _gates: dict[str, Any] = {}
    # one thread per episode in flight, shared by the worker's loops (verl makes one per sample)
    _executor: ThreadPoolExecutor | None = None
    _executor_size = 0
    _lock = threading.Lock()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = _plain(self.config.get("cuda_agent") if hasattr(self.config, "get") else None)
        episode = EpisodeConfig(**settings.get("episode", {}))
        self.judge_config = JudgeConfig(**settings.get("judge", {}))
        self.reward_config = RewardConfig(**settings.get("reward", {}))
        self.pool_settings = settings.get("pool", {})
        self.workdir = Path(settings.get("workdir") or tempfile.gettempdir()) / "cuda-agent-verl"
        # every episode is also appended here (one file per process), the input of rft and critic
        self.episodes_dir = check_episodes_dir(settings["episodes_dir"]) if settings.get("episodes_dir") else None
        self.judge_gpus = int(settings.get("judge_gpus", 0))
        self.concurrency = int(settings.get("concurrency", 64))
        if self.concurrency < 1 or self.judge_gpus < 0:
            raise ValueError(f"cuda_agent.concurrency must be >= 1 and judge_gpus >= 0, got {self.concurrency} "
                             f"and {self.judge_gpus}")
        rollout = self.config.actor_rollout_ref.rollout
        self.response_length = int(rollout.response_length)
        # the episode itself stays within verl's response_length: nothing is cut afterwards, so it
        # ends on a model token, where verl places the reward
        bound = min(self.response_length, episode.response_tokens or self.response_length)
        self.episode_config = episode.model_copy(update={"response_tokens": bound})

    def _gate(self):
        key = self.judge_config.model_dump_json()
        gate = CudaAgentLoop._gates.get(key)
        if gate is None:
            if CudaAgentLoop.gate_factory is not None:
                gate = CudaAgentLoop.gate_factory(self.judge_config)
            else:
                gate = RayEvaluator(judge_actor(self.judge_config.model_dump(mode="json"), self.pool_settings,
                                                gpus=self.judge_gpus), self.judge_config)
            CudaAgentLoop._gates[key] = gate
        return gate

    def _pool(self) -> ThreadPoolExecutor:
        """The episodes' threads: `concurrency` of them (grown, never shrunk, if a later loop asks more)."""
        cls = CudaAgentLoop
        with cls._lock:
            if cls._executor is None or cls._executor_size < self.concurrency:
                old = cls._executor
                cls._executor = ThreadPoolExecutor(max_workers=self.concurrency,
                                                   thread_name_prefix="cuda-agent-episode")
                cls._executor_size = self.concurrency
                if old is not None:
                    old.shutdown(wait=False)   # its running episodes finish; new ones go to the larger pool
            return cls._executor

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        task = Task.model_validate_json(extra["task"])
        mode = extra.get("mode", "agentic")
        loop = asyncio.get_running_loop()
        episode_id = uuid.uuid4().hex
        policy = ServerPolicy(self.server_manager, sampling_params, loop, self.tokenizer.eos_token_id, episode_id)
        renderer = ChatRenderer(self.tokenizer)
        gate = self._gate()
        episode = await loop.run_in_executor(self._pool(), self._episode, task, mode, gate, policy, renderer,
                                             episode_id)
        # asked of the node's judge actor once (a Ray call): off the event loop
        shared = await loop.run_in_executor(self._pool(), lambda: getattr(gate, "gpu_shared", None))
        if self.episodes_dir is not None:
            with (self.episodes_dir / f"{socket.gethostname()}-{os.getpid()}.jsonl").open("a") as fh:
                fh.write(episode.model_dump_json() + "\n")
        if len(episode.response_ids) > self.response_length:   # the episode's own bound makes this a bug
            raise RuntimeError(f"episode {episode.id}: {len(episode.response_ids)} response tokens, "
                               f"over response_length {self.response_length}")
        return AgentLoopOutput(
            prompt_ids=episode.prompt_ids, response_ids=episode.response_ids,
            response_mask=episode.response_mask,
            response_logprobs=None if policy.logprobs_missing else episode.response_logprobs,
            reward_score=episode.reward, num_turns=len(episode.messages),
            metrics=AgentLoopMetrics(generate_sequences=episode.generate_s, tool_calls=episode.tool_s + episode.judge_s),
            extra_fields={"reward_extra_info": {"reward_reason": episode.reward_reason,
                                                "termination": episode.termination, "turns": episode.turns,
                                                "correct": episode.correct, "judge_s": episode.judge_s,
                                                "hacking": episode.hacking,
                                                "judge_gpu_shared": shared}})

    def _episode(self, task: Task, mode: str, gate, policy: ServerPolicy, renderer: ChatRenderer, episode_id: str):
        if mode == "single_turn":
            return run_single_turn_episode(task, gate, policy, renderer, self.episode_config, self.reward_config,
                                           episode_id=episode_id)
        ws = self.workdir / episode_id
        create_workspace(task, ws, gate.device)
        box = Toolbox(task, ws, gate, reward=self.reward_config)   # the reward shown is the reward trained on
        try:
            return self._agentic(task, box, policy, renderer, episode_id)
        finally:
            box.close()
            from .rollout import remove_workspace

            remove_workspace(ws)

    def _agentic(self, task: Task, box: Toolbox, policy: ServerPolicy, renderer: ChatRenderer,
                 episode_id: str) -> EpisodeRecord:
        """The agentic episode, with an error other than a judge that cannot work kept as data
        (`keep_errors`): one failed generation request or bug must not fail verl's whole step."""
        ep = run_agentic_episode(task, box, policy, renderer, self.episode_config, episode_id=episode_id,
                                 keep_errors=True)
        if ep.termination == "error":
            log.warning("episode %s (%s) ended in an error, kept with reward %s: %s", episode_id, task.name,
                        ep.reward, ep.outcome.get("message", ""))
        return ep

