"""Print a training run's metrics (OUT/metrics.jsonl) as a table, and the time split of its rollout
steps: generation, tools, judge and training, with episodes per hour.

    python benchmarks/train_metrics.py runs/warmup [runs/ppo ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    for root in map(Path, paths):
        lines = [json.loads(x) for x in (root / "metrics.jsonl").read_text().splitlines() if x.strip()]
        print(f"== {root} ({len(lines)} steps)")
        keys = ["step", "reward_mean", "pass_rate", "turns_mean", "model_tokens_mean", "pg_loss", "vf_loss",
                "sft_loss", "value_loss", "rollout_logprob_gap", "rollout_s", "train_s", "episodes_per_hour"]
        keys = [k for k in keys if any(k in m for m in lines)]
        print("\t".join(keys))
        for m in lines:
            print("\t".join(f"{m[k]:.4g}" if isinstance(m.get(k), float) else str(m.get(k, "-")) for k in keys))
        roll = [m for m in lines if "rollout_s" in m]
        if roll:
            gen = sum(m["generate_s"] for m in roll)
            tool = sum(m["tool_s"] for m in roll)
            judge = sum(m["judge_s"] for m in roll)
            train = sum(m["train_s"] for m in roll)
            wall = sum(m["rollout_s"] + m["train_s"] for m in roll)
            eps = sum(m["episodes"] for m in roll)
            print(f"episodes {eps} in {wall:.1f} s: {eps / wall * 3600:.0f} episodes/hour; summed over episodes: "
                  f"generation {gen:.1f} s, tools {tool:.1f} s, judge {judge:.1f} s; training {train:.1f} s "
                  f"(rollout wall {sum(m['rollout_s'] for m in roll):.1f} s)")
            counts: dict[str, int] = {}
            for m in roll:
                for k, v in m.get("reward_counts", {}).items():
                    counts[k] = counts.get(k, 0) + v
            ends: dict[str, int] = {}
            for m in roll:
                for k, v in m.get("terminations", {}).items():
                    ends[k] = ends.get(k, 0) + v
            print(f"rewards: {counts}; terminations: {ends}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/train"])
