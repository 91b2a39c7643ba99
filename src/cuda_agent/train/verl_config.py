"""Launch scripts for the stages on a verl cluster (`cuda-agent train verl-config`).

Writes, into one folder, a script per stage and a README.txt that lists them in order with what
each produces; each stage's output is the next stage's input, without hand work:

    prepare.sh   tasks -> OUT/data/single_turn and OUT/data/agentic (verl RL parquet)
    warmup.sh    single-turn PPO from the base model        -> OUT/hf/warmup-actor
    collect.sh   agentic episodes of the warmed-up actor    -> OUT/episodes/collect/*.jsonl
                 (verl's validation pass only: generation with the agent loop, no update)
    rft.sh       those episodes filtered, verl's SFT trainer -> OUT/hf/rft-actor
    critic.sh    critic warm-up inside verl, actor frozen   -> OUT/hf/critic
                 (`trainer.critic_warmup` = all its steps: verl's critic worker, sharded like the actor)
    ppo.sh       multi-turn agentic PPO                      -> OUT/hf/ppo-actor

verl saves sharded (FSDP) checkpoints; every training stage ends with verl's model merger
(`python3 -m verl.model_merger merge --backend fsdp`) on its last checkpoint, which makes the
Hugging Face folder the next stage loads. Every setting is an override on verl's command line, so
a person can read and change it; `cuda_agent.*` carries this project's settings to
`CudaAgentLoop` (verl_loop.py).

What the settings are for (CUDA Agent, section 3.3): the milestone reward from the judge on the
last model token, GAE (gamma = lambda = 1), clip-higher, the engine's logprobs with token-level
importance correction against the engine/trainer mismatch, Ulysses sequence parallelism for long
sequences, token limits per GPU of at least one whole episode (context / sequence parallel size).
Node topology: `judge_gpus_per_node` GPUs of each node are the judge's (Ray reserves them for the
judge actor), the rest train and roll out (`trainer.n_gpus_per_node`).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Stage = Literal["warmup", "collect", "critic", "ppo"]

MERGER = ["python3", "-m", "verl.model_merger", "merge", "--backend", "fsdp"]


class VerlLaunch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    base_model: str = Field(description="the model the warm-up starts from (Hugging Face folder, e.g. a 7B coder)")
    out: str = Field(description="absolute folder on storage every node shares: data, checkpoints, merged "
                                 "models, episodes")
    tasks: str = Field("suite", description="tasks prepare.sh converts (cuda-agent train prepare --tasks)")
    data: str = Field("", description="agentic RL parquet folder (default OUT/data/agentic, from prepare.sh)")
    warmup_data: str = Field("", description="single-turn RL parquet folder (default OUT/data/single_turn)")
    actor: str = Field("", description="PPO's and the critic stage's actor (default OUT/hf/rft-actor)")
    critic: str = Field("", description="PPO's critic (default OUT/hf/critic)")
    episodes_dir: str = Field("", description="absolute shared folder for episodes (default OUT/episodes)")
    nnodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    judge_gpus_per_node: int = Field(0, ge=0, description="GPUs per node reserved for the judge (0: it shares "
                                                          "the training's GPUs and its timings are noisy)")
    engine: Literal["vllm", "sglang"] = "vllm"
    prompt_length: int = Field(16_384, ge=256)
    response_length: int = Field(114_688, ge=256, description="prompt + response = the episode's context")
    max_turns: int = Field(150, ge=1)
    turn_tokens: int = Field(8192, ge=16)
    train_batch_size: int = Field(64, ge=1)
    rollouts_per_task: int = Field(1, ge=1)
    collect_rollouts: int = Field(4, ge=1, description="episodes per task in collect.sh (RFT data)")
    sp_size: int = Field(8, ge=1, description="Ulysses sequence parallel size (actor, critic, SFT)")
    tensor_parallel: int = Field(4, ge=1, description="rollout tensor parallel size")
    judge_device: Literal["cuda", "cpu"] = "cuda"
    agent_workers: int = Field(8, ge=1, description="verl's agent loop workers (rollout.agent.num_workers)")
    concurrency: int | None = Field(None, ge=1, description="episodes one agent loop worker runs at once "
                                    "(default: its share of a batch)")
    actor_lr: float = Field(1e-6, gt=0)
    critic_lr: float = Field(1e-5, gt=0)
    rft_lr: float = Field(1e-5, gt=0, description="SFT learning rate (fine-tuning a pretrained model)")
    rft_batch_size: int = Field(32, ge=1)
    rft_epochs: int = Field(2, ge=1)
    warmup_epochs: int = Field(1, ge=1)
    critic_steps: int = Field(20, ge=1, description="critic warm-up steps (actor frozen)")
    epochs: int = Field(100, ge=1, description="agentic PPO epochs")
    save_freq: int = Field(10, ge=1)
    loggers: list[str] = Field(["console"], description="verl trainer loggers (add wandb only with credentials)")
    val_before_train: bool = Field(False, description="run a validation pass before the first step")

    @model_validator(mode="after")
    def _consistent(self):
        if not Path(self.out).is_absolute():
            raise ValueError(f"out must be an absolute path on shared storage, got {self.out!r}")
        if self.episodes_dir and not Path(self.episodes_dir).is_absolute():
            raise ValueError(f"episodes_dir must be absolute (every node writes there), got {self.episodes_dir!r}")
        if self.judge_gpus_per_node >= self.gpus_per_node:
            raise ValueError(f"judge_gpus_per_node={self.judge_gpus_per_node} leaves no GPU of "
                             f"{self.gpus_per_node} for training")
        if self.judge_gpus_per_node and self.judge_device != "cuda":
            raise ValueError("judge_gpus_per_node needs judge_device=cuda")
        train = self.train_gpus
        for name, size, gpus in [("sp_size", self.sp_size, train), ("tensor_parallel", self.tensor_parallel, train),
                                 ("sp_size", self.sp_size, self.gpus_per_node)]:
            if gpus % size:
                raise ValueError(f"{name}={size} does not divide the {gpus} GPUs per node it runs on "
                                 f"(gpus_per_node={self.gpus_per_node}, judge_gpus_per_node="
                                 f"{self.judge_gpus_per_node})")
        return self

    @property
    def train_gpus(self) -> int:
        """GPUs per node for rollout and training."""
        return self.gpus_per_node - self.judge_gpus_per_node

    @property
    def context(self) -> int:
        return self.prompt_length + self.response_length

    @property
    def token_len_per_gpu(self) -> int:
        """Tokens per GPU per micro-batch: one whole episode over the sequence-parallel group."""
        return math.ceil(self.context / self.sp_size)

    @property
    def episode_concurrency(self) -> int:
        return self.concurrency or max(1, math.ceil(max(self.train_batch_size * self.rollouts_per_task,
                                                         self.train_batch_size * self.collect_rollouts)
                                                     / self.agent_workers))

    def path(self, *parts: str) -> str:
        return str(Path(self.out, *parts))

    def episodes(self, stage: str) -> str:
        return str(Path(self.episodes_dir or self.path("episodes"), stage))

    def data_dir(self, single_turn: bool) -> str:
        if single_turn:
            return self.warmup_data or self.path("data", "single_turn")
        return self.data or self.path("data", "agentic")

    def model_of(self, stage: Stage) -> str:
        """The actor each stage starts from: the previous stage's merged output."""
        return {"warmup": self.base_model, "collect": self.path("hf", "warmup-actor")}.get(
            stage, self.actor or self.path("hf", "rft-actor"))


# Presets: a node layout and the sizes that fit it; the user gives base_model and out.
PRESETS: dict[str, dict] = {
    # one node of 8 H100/H200, a 7B-class coder (e.g. Qwen2.5-Coder-7B-Instruct, 32k context) on vLLM:
    # 6 GPUs roll out (3 vLLM replicas of tensor parallel 2) and train (FSDP, Ulysses 2), 2 GPUs judge
    "one-node": {"nnodes": 1, "gpus_per_node": 8, "judge_gpus_per_node": 2, "engine": "vllm",
                 "prompt_length": 4096, "response_length": 28_672, "max_turns": 50, "turn_tokens": 4096,
                 "sp_size": 2, "tensor_parallel": 2, "train_batch_size": 48, "rollouts_per_task": 1,
                 "collect_rollouts": 4, "agent_workers": 6, "critic_steps": 20, "epochs": 20},
}


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if v is None:
        return "null"
    return str(v)


def cmd(head: list[str], overrides: dict) -> str:
    """`head` with one `key=value` override a line."""
    lines = [" ".join(shlex.quote(h) for h in head) + " \\"]
    items = list(overrides.items())
    for i, (k, v) in enumerate(items):
        lines.append(f"    {shlex.quote(f'{k}={_value(v)}')}" + (" \\" if i < len(items) - 1 else ""))
    return "\n".join(lines) + "\n"


def merge_cmd(checkpoints: str, part: str, target: str) -> str:
    """Shell lines merging the last checkpoint under `checkpoints` (its `part`: actor, critic, or
    "" where the trainer saves the model at the step folder's top, as the SFT trainer does)."""
    step_dir = f"{checkpoints}/global_step_${{STEP}}" + (f"/{part}" if part else "")
    return (f"STEP=$(cat {shlex.quote(checkpoints)}/latest_checkpointed_iteration.txt)\n"
            + " ".join(MERGER) + f' --local_dir "{step_dir}" --target_dir {shlex.quote(target)}\n')


def ppo_overrides(c: VerlLaunch, stage: Stage, loop_yaml: Path) -> dict:
    """`verl.trainer.main_ppo` overrides of a stage: warmup (single-turn PPO), collect (the
    validation pass only, over the training tasks), critic (PPO with the actor frozen: every step
    is a critic warm-up step) or ppo."""
    single = stage == "warmup"
    data = c.data_dir(single)
    model = c.model_of(stage)
    critic = {"warmup": c.base_model, "critic": model}.get(stage, c.critic or c.path("hf", "critic"))
    tokens = c.token_len_per_gpu
    o = {
        "algorithm.adv_estimator": "grpo" if stage == "collect" else "gae",   # collect trains nothing: no critic
        "algorithm.gamma": 1.0, "algorithm.lam": 1.0, "algorithm.use_kl_in_reward": False,
        "algorithm.rollout_correction.rollout_is": "token", "algorithm.rollout_correction.rollout_is_threshold": 2.0,
        "data.train_files": f"{data}/train.parquet",
        # collect: its "validation" pass runs over the training tasks
        "data.val_files": f"{data}/{'train' if stage == 'collect' else 'val'}.parquet",
        "data.max_prompt_length": c.prompt_length, "data.max_response_length": c.response_length,
        "data.train_batch_size": c.train_batch_size, "data.return_raw_chat": True,
        "data.filter_overlong_prompts": True, "data.truncation": "error",
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.actor.optim.lr": c.actor_lr,
        "actor_rollout_ref.actor.ppo_mini_batch_size": max(1, c.train_batch_size // 4),
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": tokens,
        "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": False,
        # the engine reads fsdp_config's; the top-level key is verl's deprecated spelling, kept equal
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": c.sp_size,
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": c.sp_size,
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
        "actor_rollout_ref.rollout.name": c.engine, "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": c.rollouts_per_task,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": c.tensor_parallel,
        "actor_rollout_ref.rollout.max_model_len": c.context,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.multi_turn.enable": not single,
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 1 if single else c.max_turns,
        "actor_rollout_ref.rollout.agent.num_workers": c.agent_workers,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "cuda_agent",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(loop_yaml),
    }
    if stage != "collect":
        o.update({
            "critic.model.path": critic, "critic.optim.lr": c.critic_lr, "critic.cliprange_value": 0.5,
            "critic.ulysses_sequence_parallel_size": c.sp_size, "critic.fsdp.ulysses_sequence_parallel_size": c.sp_size,
            "critic.use_dynamic_bsz": True,
            "critic.ppo_max_token_len_per_gpu": tokens, "critic.model.use_remove_padding": True,
            "critic.model.enable_gradient_checkpointing": True,
            "critic.fsdp.param_offload": True, "critic.fsdp.optimizer_offload": True,
        })
    o.update(_trainer(c, stage))
    o.update({
        "+cuda_agent.judge.device": c.judge_device,
        "+cuda_agent.judge_gpus": c.judge_gpus_per_node,
        "+cuda_agent.concurrency": c.episode_concurrency,
        "+cuda_agent.workdir": "/tmp",
        "+cuda_agent.episodes_dir": c.episodes(stage),
        "+cuda_agent.episode.max_turns": 1 if single else c.max_turns,
        "+cuda_agent.episode.context_tokens": c.context, "+cuda_agent.episode.turn_tokens": c.turn_tokens,
    })
    return o


def _trainer(c: VerlLaunch, stage: Stage) -> dict:
    t = {
        "trainer.nnodes": c.nnodes, "trainer.n_gpus_per_node": c.train_gpus,
        "trainer.logger": list(c.loggers), "trainer.project_name": "cuda-agent", "trainer.experiment_name": stage,
        "trainer.default_local_dir": c.path("checkpoints", stage),
        "trainer.val_before_train": c.val_before_train, "trainer.test_freq": -1,
        "trainer.save_freq": c.save_freq, "trainer.critic_warmup": 0,
    }
    if stage == "warmup":
        t["trainer.total_epochs"] = c.warmup_epochs
    elif stage == "collect":
        # one generation pass with the agent loop over the training tasks, sampled as in training
        t.update({"trainer.val_only": True, "trainer.val_before_train": True, "trainer.total_epochs": 1,
                  "actor_rollout_ref.rollout.val_kwargs.n": c.collect_rollouts,
                  "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
                  "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
                  "data.val_batch_size": c.train_batch_size})
    elif stage == "critic":
        # every step a critic warm-up step: verl updates the actor once critic_warmup <= the step
        # (counted from 1), so one more than the steps run keeps the RFT actor untouched
        t.update({"trainer.total_training_steps": c.critic_steps, "trainer.critic_warmup": c.critic_steps + 1,
                  "trainer.total_epochs": c.epochs, "trainer.save_freq": c.critic_steps})
    else:
        t["trainer.total_epochs"] = c.epochs
    return t


def sft_overrides(c: VerlLaunch) -> dict:
    """`verl.trainer.sft_trainer` overrides of the RFT stage (every GPU of a node: no judge runs)."""
    return {
        "data.train_files": c.path("rft-data", "rft.parquet"),
        "data.messages_key": "messages", "data.tools_key": "tools",
        "data.custom_cls.path": "pkg://cuda_agent.train.verl_sft", "data.custom_cls.name": "CudaAgentSFTDataset",
        "data.max_length": c.context, "data.truncation": "error", "data.pad_mode": "no_padding",
        # a whole episode fits one sequence-parallel group: max_token_len_per_gpu x sp >= max_length
        "data.use_dynamic_bsz": True, "data.max_token_len_per_gpu": c.token_len_per_gpu,
        "data.train_batch_size": c.rft_batch_size,
        "model.path": c.model_of("collect"), "model.use_remove_padding": True,
        "model.enable_gradient_checkpointing": True,
        "engine.ulysses_sequence_parallel_size": c.sp_size,
        "optim.lr": c.rft_lr,
        "trainer.default_local_dir": c.path("checkpoints", "rft"), "trainer.total_epochs": c.rft_epochs,
        "trainer.nnodes": c.nnodes, "trainer.n_gpus_per_node": c.gpus_per_node,
        "trainer.logger": list(c.loggers), "trainer.project_name": "cuda-agent", "trainer.experiment_name": "rft",
    }


def _check_dir(folder: str) -> str:
    """Shell lines failing the stage early when the shared episodes folder is not writable here."""
    q = shlex.quote(folder)
    return (f"mkdir -p {q} && test -w {q} || {{ echo \"episodes folder {folder} is not writable\" >&2; exit 1; }}\n")


def _stages(c: VerlLaunch, loop_yaml: Path) -> list[tuple[str, str, str, str]]:
    """(script, what it does, what it produces, body) of every stage, in the order they run."""
    ppo = ["python3", "-m", "verl.trainer.main_ppo"]
    sft = ["torchrun", f"--nnodes={c.nnodes}", f"--nproc_per_node={c.gpus_per_node}", "-m",
           "verl.trainer.sft_trainer"]
    q = shlex.quote
    prep = "".join(f"cuda-agent train prepare --tasks {q(c.tasks)} --mode {mode} --device {c.judge_device} "
                   f"--out {q(c.data_dir(mode == 'single_turn'))}\n" for mode in ("single_turn", "agentic"))
    rft_export = (f"cuda-agent train rft --export-only --out {q(c.path('rft-data'))} "
                  f"--episodes {q(c.episodes('collect'))}\n")
    return [
        ("prepare.sh", "the tasks as verl RL parquet, single-turn (warm-up) and agentic",
         f"{c.data_dir(True)}/{{train,val}}.parquet, {c.data_dir(False)}/{{train,val}}.parquet", prep),
        ("warmup.sh", "single-turn PPO warm-up from the base model (GAE critic trained online)",
         f"{c.path('hf', 'warmup-actor')} (merged), episodes in {c.episodes('warmup')}",
         _check_dir(c.episodes("warmup")) + cmd(ppo, ppo_overrides(c, "warmup", loop_yaml))
         + merge_cmd(c.path("checkpoints", "warmup"), "actor", c.path("hf", "warmup-actor"))),
        ("collect.sh", f"agentic episodes of the warmed-up actor, {c.collect_rollouts} per training task "
                       "(verl's validation pass only, no update)",
         f"{c.episodes('collect')}/*.jsonl", _check_dir(c.episodes("collect"))
         + cmd(ppo, ppo_overrides(c, "collect", loop_yaml))),
        ("rft.sh", "rejection fine-tuning: the collected episodes filtered, verl's SFT trainer on their own tokens",
         f"{c.path('rft-data', 'rft.parquet')}, {c.path('hf', 'rft-actor')} (merged)",
         rft_export + cmd(sft, sft_overrides(c)) + merge_cmd(c.path("checkpoints", "rft"), "",
                                                             c.path("hf", "rft-actor"))),
        ("critic.sh", f"critic pre-training inside verl: {c.critic_steps} PPO steps of agentic episodes of the "
                      "RFT actor, all critic warm-up steps (the actor is never updated)",
         f"{c.path('hf', 'critic')} (merged), episodes in {c.episodes('critic')}",
         _check_dir(c.episodes("critic")) + cmd(ppo, ppo_overrides(c, "critic", loop_yaml))
         + merge_cmd(c.path("checkpoints", "critic"), "critic", c.path("hf", "critic"))),
        ("ppo.sh", "multi-turn agentic PPO: the RFT actor, the pre-trained critic, the judge's milestone reward",
         f"{c.path('hf', 'ppo-actor')} (merged), checkpoints in {c.path('checkpoints', 'ppo')}",
         _check_dir(c.episodes("ppo")) + cmd(ppo, ppo_overrides(c, "ppo", loop_yaml))
         + merge_cmd(c.path("checkpoints", "ppo"), "actor", c.path("hf", "ppo-actor"))),
    ]


def _readme(c: VerlLaunch, stages: list[tuple[str, str, str, str]], out: Path) -> str:
    lines = ["CUDA Agent on verl: the stages, run in this order (each one's output is the next one's input).",
             f"Node layout: {c.nnodes} node(s) x {c.gpus_per_node} GPUs: {c.train_gpus} per node roll out and train "
             f"(trainer.n_gpus_per_node), {c.judge_gpus_per_node} per node are the judge's (Ray reserves them "
             "for the node's judge actor)." if c.judge_gpus_per_node else
             f"Node layout: {c.nnodes} node(s) x {c.gpus_per_node} GPUs, shared by training and the judge "
             "(judge_gpus_per_node=0: the judge times on busy GPUs).",
             f"Everything is written under {c.out} (shared by every node); episodes in "
             f"{c.episodes_dir or c.path('episodes')}.",
             "Start Ray on the node(s) first (ray start --head ...); run every script from a machine of the cluster.",
             ""]
    for i, (name, what, produces, _) in enumerate(stages):
        lines += [f"{i}. bash {out / name}", f"   {what}", f"   produces: {produces}", ""]
    lines += ["Every training stage ends with verl's model merger on its last checkpoint:",
              "   " + " ".join(MERGER) + " --local_dir CHECKPOINTS/global_step_N/{actor,critic} --target_dir HF",
              f"Loggers: {', '.join(c.loggers)} (add wandb with -c 'loggers=[\"console\",\"wandb\"]' and credentials).",
              "agent_loop.yaml registers the cuda_agent agent loop (cuda_agent.train.verl_loop.CudaAgentLoop)."]
    return "\n".join(lines) + "\n"


def write_verl_configs(c: VerlLaunch, out: Path) -> list[Path]:
    """agent_loop.yaml, a script per stage and README.txt in `out`; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    loop_yaml = out / "agent_loop.yaml"
    loop_yaml.write_text("# verl agent loops of this project: rows with agent_name cuda_agent use it\n"
                         "- name: cuda_agent\n  _target_: cuda_agent.train.verl_loop.CudaAgentLoop\n")
    stages = _stages(c, loop_yaml.resolve())
    written = [loop_yaml]
    for name, what, produces, body in stages:
        path = out / name
        path.write_text(f"#!/usr/bin/env bash\n# {name}: {what}\n# produces: {produces}\nset -euo pipefail\n" + body)
        path.chmod(0o755)
        written.append(path)
    readme = out / "README.txt"
    readme.write_text(_readme(c, stages, out.resolve()))
    return written + [readme]


def launch_settings(preset: str | None, config: Path | None, overrides: list[str]) -> VerlLaunch:
    """VerlLaunch from a preset's values, then the file's [verl] table, then the -c overrides."""
    from cuda_agent.settings import apply_overrides, read_file, validate

    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    values = {**PRESETS.get(preset or "", {}), **read_file(config, "verl")}
    return validate(VerlLaunch, apply_overrides(values, overrides, VerlLaunch), "verl launch settings")
