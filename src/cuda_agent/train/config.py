"""One config for every stage of `cuda-agent train`: a TOML/JSON file (its `[train]` table, the
judge's under `[judge]`), then `-c field=value` overrides (`-c ppo.lam=0.95`), then flags."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.reward import RewardConfig

from .episode import EpisodeConfig
from .learner import OptimConfig, PPOConfig
from .rft import RFTFilter


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
                                                                  "(default: OUT/../warmup/episodes)")
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
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    rft: RFTFilter = Field(default_factory=RFTFilter)
    reward: RewardConfig = Field(default_factory=RewardConfig)
