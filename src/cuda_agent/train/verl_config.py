"""Launch configs for the four stages on a verl cluster (`cuda-agent train verl-config`).

Writes, into one folder: `agent_loop.yaml` (registers `cuda_agent`), `warmup.sh` and `ppo.sh`
(`verl.trainer.main_ppo` with the agent loop, PPO with a GAE critic), `rft.sh` (verl's multi-turn
SFT trainer on the RFT parquet) and `critic.sh` (this project's value pre-training, whose
`final/critic` is the `critic.model.path` of `ppo.sh`: verl's own `trainer.critic_warmup` trains the
critic online only). Every value is an override on verl's command line, so a person can read and
change them; `cuda_agent.*` carries this project's settings to `CudaAgentLoop`.

What the settings are for (CUDA Agent, section 3.3): 128k-token context (prompt + response), up to
150 turns in training, the milestone reward from the judge on the last token, GAE
(`algorithm.adv_estimator=gae`, gamma = lambda = 1), clip-higher, the engine's logprobs
(`rollout.calculate_log_probs=True`) with token-level importance correction against the
engine/trainer mismatch (`algorithm.rollout_correction.rollout_is=token`), Ulysses sequence
parallelism for the long sequences.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class VerlLaunch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    actor: str = Field(description="the actor to start PPO from (the RFT stage's final/actor)")
    base_model: str = Field("", description="the model the warm-up starts from (default: actor)")
    critic: str = Field("", description="the pre-trained critic (critic stage's final/critic)")
    data: str = Field(description="folder of train.parquet / val.parquet from `cuda-agent train prepare`")
    warmup_data: str = Field("", description="single-turn data folder (prepare --mode single_turn)")
    rft_parquet: str = Field("", description="RFT data (rft stage's OUT/rft.parquet)")
    out: str = Field("checkpoints", description="where verl writes checkpoints")
    nnodes: int = 1
    gpus_per_node: int = 8
    engine: str = Field("vllm", description="rollout engine: vllm or sglang")
    prompt_length: int = 16_384
    response_length: int = 114_688          # prompt + response = 128k
    max_turns: int = 150
    turn_tokens: int = 8192
    train_batch_size: int = 64
    rollouts_per_task: int = 1
    sp_size: int = Field(8, description="Ulysses sequence parallel size for actor and critic")
    tensor_parallel: int = Field(4, description="rollout tensor parallel size")
    judge_device: str = "cuda"
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    epochs: int = 100


def _cmd(head: list[str], overrides: dict) -> str:
    lines = [" ".join(head) + " \\"]
    items = list(overrides.items())
    for i, (k, v) in enumerate(items):
        val = str(v).lower() if isinstance(v, bool) else str(v)
        lines.append(f"    {shlex.quote(f'{k}={val}')}" + (" \\" if i < len(items) - 1 else ""))
    return "\n".join(lines) + "\n"


def _ppo_overrides(c: VerlLaunch, *, single_turn: bool, loop_yaml: Path) -> dict:
    data = c.warmup_data or c.data if single_turn else c.data
    ctx = c.prompt_length + c.response_length
    o = {
        "algorithm.adv_estimator": "gae", "algorithm.gamma": 1.0, "algorithm.lam": 1.0,
        "algorithm.use_kl_in_reward": False,
        "algorithm.rollout_correction.rollout_is": "token", "algorithm.rollout_correction.rollout_is_threshold": 2.0,
        "data.train_files": f"{data}/train.parquet", "data.val_files": f"{data}/val.parquet",
        "data.max_prompt_length": c.prompt_length, "data.max_response_length": c.response_length,
        "data.train_batch_size": c.train_batch_size, "data.return_raw_chat": True,
        "data.filter_overlong_prompts": True, "data.truncation": "error",
        "actor_rollout_ref.model.path": c.base_model or c.actor if single_turn else c.actor,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.optim.lr": c.actor_lr,
        "actor_rollout_ref.actor.ppo_mini_batch_size": max(1, c.train_batch_size // 4),
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ctx // c.sp_size + 1,
        "actor_rollout_ref.actor.clip_ratio_low": 0.2, "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size": c.sp_size,
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.rollout.name": c.engine, "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": c.rollouts_per_task,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": c.tensor_parallel,
        "actor_rollout_ref.rollout.max_model_len": ctx,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.multi_turn.enable": not single_turn,
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 1 if single_turn else c.max_turns,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "cuda_agent",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(loop_yaml),
        "critic.model.path": c.critic or c.actor if not single_turn else c.base_model or c.actor,
        "critic.optim.lr": c.critic_lr, "critic.cliprange_value": 0.5,
        "critic.ulysses_sequence_parallel_size": c.sp_size, "critic.use_dynamic_bsz": True,
        "critic.ppo_max_token_len_per_gpu": ctx // c.sp_size + 1,
        "critic.model.enable_gradient_checkpointing": True,
        "trainer.critic_warmup": 0,
        "trainer.nnodes": c.nnodes, "trainer.n_gpus_per_node": c.gpus_per_node,
        "trainer.total_epochs": c.epochs, "trainer.save_freq": 10, "trainer.test_freq": -1,
        "trainer.project_name": "cuda-agent",
        "trainer.experiment_name": "warmup" if single_turn else "agentic-ppo",
        "trainer.default_local_dir": f"{c.out}/{'warmup' if single_turn else 'ppo'}",
        "+cuda_agent.judge.device": c.judge_device,
        "+cuda_agent.episode.max_turns": 1 if single_turn else c.max_turns,
        "+cuda_agent.episodes_dir": f"{c.out}/{'warmup' if single_turn else 'ppo'}-episodes",
        "+cuda_agent.episode.context_tokens": ctx, "+cuda_agent.episode.turn_tokens": c.turn_tokens,
    }
    return o


def write_verl_configs(c: VerlLaunch, out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    loop_yaml = out / "agent_loop.yaml"
    loop_yaml.write_text("# verl agent loops of this project: rows with agent_name cuda_agent use it\n"
                         "- name: cuda_agent\n  _target_: cuda_agent.train.verl_loop.CudaAgentLoop\n")
    head = ["python3", "-m", "verl.trainer.main_ppo"]
    files = {
        "warmup.sh": ("# Stage 1: single-turn PPO warm-up (data: cuda-agent train prepare --mode single_turn)\n",
                      _cmd(head, _ppo_overrides(c, single_turn=True, loop_yaml=loop_yaml.resolve()))),
        "rft.sh": ("# Stage 2: rejection fine-tuning. The warm-up's episodes are filtered into the RFT parquet\n"
                   f"#   cuda-agent train rft --export-only --out {c.out}/rft-data --episodes {c.out}/warmup-episodes\n",
                   _cmd(["torchrun", f"--nnodes={c.nnodes}", f"--nproc_per_node={c.gpus_per_node}", "-m",
                         "verl.trainer.sft_trainer"], {
                       "data.train_files": c.rft_parquet or f"{c.out}/rft-data/rft.parquet",
                       "data.val_files": c.rft_parquet or f"{c.out}/rft-data/rft.parquet",
                       "data.messages_key": "messages", "data.tools_key": "tools",
                       "data.custom_cls.path": "pkg://cuda_agent.train.verl_sft",
                       "data.custom_cls.name": "CudaAgentSFTDataset",
                       "data.max_length": c.prompt_length + c.response_length, "data.truncation": "error",
                       "model.path": c.base_model or c.actor,
                       "model.use_remove_padding": True, "engine.ulysses_sequence_parallel_size": c.sp_size,
                       "trainer.default_local_dir": f"{c.out}/rft", "trainer.total_epochs": 2,
                       "trainer.project_name": "cuda-agent", "trainer.experiment_name": "rft"})),
        "critic.sh": ("# Stage 3: critic value pre-training on stored episodes (this project's learner, one GPU;\n"
                      "# verl trains critics online only). Its final/critic is critic.model.path of ppo.sh.\n",
                      " ".join(shlex.quote(a) for a in ["cuda-agent", "train", "critic", "--out", f"{c.out}/critic",
                                                          "--model", c.actor, "--train-device", "cuda",
                                                          "--episodes", f"{c.out}/warmup-episodes",
                                                          "-c", "epochs=2"]) + "\n"),
        "ppo.sh": ("# Stage 4: multi-turn agentic PPO with the GAE critic and the judge's milestone reward\n",
                   _cmd(head, _ppo_overrides(c, single_turn=False, loop_yaml=loop_yaml.resolve()))),
    }
    written = [loop_yaml]
    for name, (comment, body) in files.items():
        path = out / name
        path.write_text("#!/usr/bin/env bash\n" + comment + "set -euo pipefail\n" + body)
        path.chmod(0o755)
        written.append(path)
    return written
