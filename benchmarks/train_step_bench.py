"""Training throughput and memory of one PPO update of the real Learner, on a random model of a real
shape (no download) and synthetic agentic episodes of each context length: the number that says
whether a 32k or 128k episode trains on one GPU, and how fast.

    python benchmarks/train_step_bench.py --shape qwen2.5-1.5b --context 8192 32768 131072
    python benchmarks/train_step_bench.py --shape qwen2.5-7b --lora --context 8192 32768
    python benchmarks/train_step_bench.py --shape tiny --device cpu --context 256   # seconds, plumbing

One JSON line per context (training tokens/s, peak GPU memory, the pre-flight estimate, the
update's metrics); a context that runs out of memory prints its error and the next one runs.
The logic lives in cuda_agent.train.trainbench.
"""

from __future__ import annotations

import argparse
import json

import torch

from cuda_agent.train import trainbench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(trainbench.SHAPES))
    ap.add_argument("--context", type=int, nargs="+", default=[8192, 32768, 131072], help="tokens per episode")
    ap.add_argument("--episodes", type=int, default=2, help="episodes in the batch")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA")
    ap.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    ap.add_argument("--lora", action="store_true", help="LoRA on every projection (r 16): 7B on one GPU")
    ap.add_argument("--critic-mode", choices=["shared", "separate"], default="shared")
    ap.add_argument("--estimator", choices=["gae", "grpo", "rloo"], default="gae")
    ap.add_argument("--chunk", type=int, default=1024, help="positions per log-prob chunk")
    args = ap.parse_args()
    for context in args.context:
        try:
            res = trainbench.run(args.shape, context, episodes=args.episodes, device=args.device,
                                 precision=args.precision, checkpointing=False if args.no_checkpointing else None,
                                 lora=args.lora, critic_mode=args.critic_mode, estimator=args.estimator,
                                 micro_batch=args.micro_batch, epochs=args.epochs, chunk=args.chunk)
            print(json.dumps(trainbench.as_dict(res)), flush=True)
        except torch.OutOfMemoryError as exc:
            print(json.dumps({"shape": args.shape, "context": context, "error": f"out of memory: {exc}"[:400]}),
                  flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
