"""One config for every stage of `cuda-agent train`: a TOML/JSON file (its `[train]` table, the
judge's under `[judge]`), then `-c field=value` overrides (`-c ppo.lam=0.95`), then flags."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cuda_agent.reward import RewardConfig

from .episode import EpisodeConfig
from .learner import OptimConfig, PPOConfig
from .rft import RFTFilter


class LoraConfig(BaseModel):
    """LoRA adapters on the actor (peft): only they (and a shared value head) train; the frozen base
    is the KL reference for free (the adapter disabled)."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: int = Field(32, ge=1, description="scaling numerator (the update is alpha/r x B A)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="names (last component) of the linear modules that get an adapter")


class TrainConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("tiny", description="the actor: a Hugging Face model folder, or 'tiny' for a random "
                                           "~0.15M-parameter Qwen2 built on the fly (plumbing checks only)")
    critic: str | None = Field(None, description="the critic folder (AutoModelForTokenClassification, 1 label); "
                                                 "default: a new value head on the actor")
    tasks: str = Field("suite", description="tasks: suite, suite:cpu, a KernelBench folder, .py, .jsonl or "
                                            ".parquet (Ops-6K columns, synth output)")
    levels: list[int] = Field(default_factory=list, description="KernelBench levels to keep (empty: all)")
    limit: int | None = Field(None, ge=1, description="use only the first N tasks (after the seeded shuffle)")
    episodes: list[str] = Field(default_factory=list, description="rft/critic: episode JSONL files or folders "
                                                                  "(default: OUT/../collect/episodes, else OUT/../warmup/episodes)")
    train_device: str = Field("cpu", description="torch device of the actor and critic: cpu, cuda, cuda:1")
    seed: int = Field(0, description="task order, sampling and mini-batch order")
    steps: int = Field(10, ge=1, description="warmup/ppo: rollout-and-update steps")
    episodes_per_step: int = Field(8, ge=1, description="episodes per step (the PPO batch)")
    concurrency: int = Field(4, ge=1, description="episodes in flight (generation is serialised, the judge's "
                                                  "work overlaps)")
    judge_workers: int | None = Field(None, ge=1, description="judge workers of the pool (cuda: one per GPU)")
    judge_memo: bool = Field(False, description="judge an identical (task, candidate) once per run: saves the "
                                                "judge's time when candidates repeat, as in the toy check")
    epochs: int = Field(1, ge=1, description="rft/critic: passes over the kept episodes")
    batch_episodes: int = Field(8, ge=1, description="rft/critic: episodes per optimiser step")
    checkpoint_every: int = Field(1, ge=1, description="steps between checkpoints (the last step always saves)")
    allowed_tokens: list[str] = Field(default_factory=list, description="restrict sampling (and the trainer's "
                                      "logprobs) to these token strings plus EOS; the toy check's action space")
    precision: Literal["bf16", "fp32"] | None = Field(
        None, description="weights' dtype: bf16 (AdamW moments kept fp32, stochastic rounding of updates) or "
                          "fp32; default bf16 on CUDA, fp32 on the CPU")
    gradient_checkpointing: bool | None = Field(None, description="recompute each layer in backward instead of "
                                                                  "keeping its activations; default on with bf16")
    lora: LoraConfig | None = Field(None, description="LoRA on the actor (-c lora.r=16); None trains every "
                                                      "parameter")
    critic_mode: Literal["separate", "shared"] = Field(
        "separate", description="separate: a second model (AutoModelForTokenClassification, verl's format); "
                                "shared: a value head on the actor's hidden states, one backbone for both")
    logprob_chunk: int = Field(1024, ge=1, description="positions per lm_head + log_softmax chunk: peak logits "
                                                       "memory is ~chunk x vocabulary x 12 bytes")
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    rft: RFTFilter = Field(default_factory=RFTFilter)
    reward: RewardConfig = Field(default_factory=RewardConfig)

    @model_validator(mode="after")
    def _groups_fill_the_step(self):
        if self.episodes_per_step % self.ppo.group_size:
            raise ValueError(f"episodes_per_step ({self.episodes_per_step}) must be a multiple of ppo.group_size "
                             f"({self.ppo.group_size}): each step runs whole groups of one task")
        return self

    @property
    def on_cuda(self) -> bool:
        return self.train_device.startswith("cuda")

    @property
    def dtype_name(self) -> str:
        """The precision in force: the setting, else bf16 on CUDA and fp32 on the CPU."""
        return self.precision or ("bf16" if self.on_cuda else "fp32")

    @property
    def checkpointing(self) -> bool:
        return self.gradient_checkpointing if self.gradient_checkpointing is not None else self.dtype_name == "bf16"
