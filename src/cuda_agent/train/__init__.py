"""Training: CUDA Agent's four RL stages on the agent's own environment and the judge's reward.

    episode.py   episodes as records: the episode engine with the token front (agentic), the
                 single-turn warm-up episode, EpisodeRecord (the stored format), EpisodeConfig
    rollout.py   tasks, episodes in flight (the judge behind the tools: any rollout Evaluator,
                 a pool for training), storage, metrics
    generate.py  rollouts on one GPU: batched sampling with per-session KV caches (HFPolicy)
    fastdecode.py  a Qwen2 decode step in a few fused operations (HFPolicy's decode path)
    server_policy.py  the same token policy over a vLLM/SGLang server (CompletionsPolicy)
    genbench.py  rollout throughput on random models of real shapes (benchmarks/generate_bench.py)
    hf.py        log-probabilities and values with transformers (the trainer's side)
    ppo.py       GAE and the PPO losses with verl's definitions
    learner.py   actor/critic updates (SFT, value pre-training, PPO) and atomic checkpoints
    rft.py       the RFT filter and verl's SFT parquet
    stages.py    warmup, rft, critic, ppo on one GPU, resumable
    verl_loop.py the cluster path: the `cuda_agent` verl agent loop (the per-node judge actor is
                 `cuda_agent.rollout.ray_judge`)
    verl_data.py task files as verl's RL parquet
    verl_config.py  launch scripts of the four stages for verl
    verl_sft.py  verl's multi-turn SFT dataset for the RFT parquet
    tiny.py      a random tiny Qwen2 and tokenizer for tests and smoke runs
    toy.py       the learning check (choose the correct kernel through the real tools and judge)
    cli.py       `cuda-agent train ...`

The loop itself, the token front (TokenPolicy, Generation, ChatRenderer) and the ways of reaching
the judge live in `cuda_agent.rollout`, shared with `solve`; `episode.py` re-exports the token
front's names.

Heavy imports (torch, transformers, verl) stay inside the modules that need them; this package
imports nothing heavy on its own.
"""
