"""Training: CUDA Agent's four RL stages on the agent's own environment and the judge's reward.

    episode.py   token-in/token-out episodes (single-turn and agentic), masks, logprobs, reward
    rollout.py   tasks, the judge behind the tools (a pool), episodes in flight, storage, metrics
    hf.py        generation and log-probabilities with transformers (the one-GPU path)
    ppo.py       GAE and the PPO losses with verl's definitions
    learner.py   actor/critic updates (SFT, value pre-training, PPO) and atomic checkpoints
    rft.py       the RFT filter and verl's SFT parquet
    stages.py    warmup, rft, critic, ppo on one GPU, resumable
    verl/        the cluster path: the `cuda_agent` agent loop, RL parquet, launch configs
    tiny.py      a random tiny Qwen2 and tokenizer for tests and smoke runs
    cli.py       `cuda-agent train ...`

Heavy imports (torch, transformers, verl) stay inside the modules that need them; this package
imports nothing heavy on its own.
"""
