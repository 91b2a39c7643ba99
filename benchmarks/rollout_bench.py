"""Agentic rollouts on one GPU through the real engine and tools, the judge stood in for: episodes
per hour, generated tokens per second, peak GPU memory (cuda_agent.train.rolloutbench).

    python benchmarks/rollout_bench.py --shape qwen2.5-1.5b --episodes 32 --turns 10 --reply 512
    python benchmarks/rollout_bench.py --shape tiny --device cpu --episodes 2 --turns 3 --reply 32   # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from cuda_agent.train.rolloutbench import run_rollout_bench
from cuda_agent.train.shapes import SHAPES


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--episodes", type=int, default=32, help="episodes at once (all in flight together)")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--prompt", type=int, default=4096, help="pad the task to about this many prompt tokens")
    p.add_argument("--reply", type=int, default=512, help="tokens the model generates each turn")
    p.add_argument("--judge-s", type=float, default=0.0, help="seconds the stand-in judge takes per verdict")
    p.add_argument("--device", default=None)
    p.add_argument("--no-fast-decode", action="store_true", help="decode through transformers' modules")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="run FastDecoder's steps eagerly instead of replaying them from CUDA graphs")
    a = p.parse_args()
    t0 = time.monotonic()
    total = a.episodes * a.turns

    def on_turn(replies: int, generated: int) -> None:
        # a line per tenth of the replies on stderr: a long run shows it is moving
        if replies % max(total // 10, 1) == 0 or replies == total:
            s = time.monotonic() - t0
            print(f"[{s:7.1f} s] {replies}/{total} replies, {generated} tokens generated "
                  f"({generated / max(s, 1e-9):.0f} tokens/s)", file=sys.stderr, flush=True)

    fig = run_rollout_bench(on_turn=on_turn, shape=a.shape, episodes=a.episodes, turns=a.turns, prompt_tokens=a.prompt,
                            reply_tokens=a.reply, judge_s=a.judge_s, device=a.device,
                            fast_decode=not a.no_fast_decode, cuda_graphs=not a.no_cuda_graphs, ignore_eos=True)
    print(json.dumps(asdict(fig)))
    print(fig.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
