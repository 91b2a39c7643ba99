"""Rollout throughput of train.generate.HFPolicy on a random model of a real shape.

    python benchmarks/generate_bench.py --shape qwen2.5-1.5b --device cuda        # 32 x 10 turns
    python benchmarks/generate_bench.py --shape qwen2.5-1.5b --device cuda --baseline --sessions 2 --turns 2
    python benchmarks/generate_bench.py --shape tiny --device cpu --sessions 4 --turns 2 --prompt 64 --reply 16 --obs 8

Prints one JSON line (BenchResult) and a summary. The workload and the baseline are in
cuda_agent.train.genbench.
"""

from __future__ import annotations

import argparse
import json

from cuda_agent.train.genbench import BenchConfig, run_bench
from cuda_agent.train.shapes import SHAPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--sessions", type=int, default=32, help="concurrent episodes")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=4096, help="first prompt tokens")
    ap.add_argument("--reply", type=int, default=512, help="tokens per reply (EOS ignored)")
    ap.add_argument("--obs", type=int, default=256, help="observation tokens after each reply")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", action="store_true", help="the old policy: batch 1, full prefill every turn")
    a = ap.parse_args()
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    cfg = BenchConfig(shape=a.shape, sessions=a.sessions, turns=a.turns, prompt_tokens=a.prompt, reply_tokens=a.reply,
                      obs_tokens=a.obs, device=a.device, dtype=dtype, seed=a.seed, max_batch=a.max_batch,
                      baseline=a.baseline)
    r = run_bench(cfg)
    print(json.dumps(r.record()))
    mem = "n/a" if r.peak_gpu_mem_gib is None else f"{r.peak_gpu_mem_gib:.1f} GiB"
    print(f"{'baseline' if a.baseline else 'HFPolicy'} {a.shape} on {r.device_name}: {r.episodes} episodes in "
          f"{r.wall_s:.1f} s = {r.episodes_per_hour:.0f} episodes/h; generated {r.generated_tok_per_s:.0f} tok/s "
          f"(mean batch {r.mean_batch:.1f}); prefill {r.prefill_tok_per_s:.0f} tok/s over {r.prefill_tokens} tokens "
          f"({r.reused_tokens} reused); peak GPU memory {mem}; scheduler time: prefill {r.prefill_s:.1f} s, "
          f"decode {r.decode_s:.1f} s over {r.decode_steps} steps ({1000 * r.decode_s / max(r.decode_steps, 1):.1f} ms "
          f"a step), {r.repacks} repacks")


if __name__ == "__main__":
    main()
