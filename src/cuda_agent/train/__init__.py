"""Training: CUDA Agent's four RL stages on the agent's own environment and the judge's reward.

    episode.py   token-in/token-out episodes (single-turn and agentic), masks, logprobs, reward
    rollout.py   tasks, the judge behind the tools (a pool), episodes in flight, storage, metrics
    generate.py  rollouts on one GPU: batched sampling with per-session KV caches (HFPolicy)
    server_policy.py  the same token policy over a vLLM/SGLang server (CompletionsPolicy)
    genbench.py  rollout throughput on random models of real shapes (benchmarks/generate_bench.py)
    hf.py        log-probabilities and values with transformers (the trainer's side)
    ppo.py       GAE and the PPO losses with verl's definitions
    learner.py   actor/critic updates (SFT, value pre-training, PPO) and atomic checkpoints
    rft.py       the RFT filter and verl's SFT parquet
    stages.py    warmup, rft, critic, ppo on one GPU, resumable
    verl_loop.py the cluster path: the `cuda_agent` verl agent loop, the per-node judge service
    verl_data.py task files as verl's RL parquet
    verl_config.py  launch scripts of the four stages for verl
    verl_sft.py  verl's multi-turn SFT dataset for the RFT parquet
    tiny.py      a random tiny Qwen2 and tokenizer for tests and smoke runs
    toy.py       the learning check (choose the correct kernel through the real tools and judge)
    cli.py       `cuda-agent train ...`

Heavy imports (torch, transformers, verl) stay inside the modules that need them; this package
imports nothing heavy on its own.
"""
