"""`cuda-agent train metrics`: a training run's metrics as a table, and where its rollout time went."""

from __future__ import annotations

import json
from pathlib import Path

KEYS = ("step", "reward_mean", "pass_rate", "turns_mean", "model_tokens_mean", "pg_loss", "vf_loss", "sft_loss",
        "value_loss", "rollout_logprob_gap", "rollout_s", "train_s", "episodes_per_hour")


def _summed(rows: list[dict], field: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for m in rows:
        for k, v in m.get(field, {}).items():
            total[k] = total.get(k, 0) + v
    return total


def metrics_report(root: Path) -> str:
    """A run's OUT/metrics.jsonl as a table (one tab-separated row per step), then its rollout
    steps' time split, episodes per hour, rewards and terminations."""
    lines = [json.loads(x) for x in (root / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keys = [k for k in KEYS if any(k in m for m in lines)]
    out = [f"== {root} ({len(lines)} steps)", "\t".join(keys)]
    for m in lines:
        out.append("\t".join(f"{m[k]:.4g}" if isinstance(m.get(k), float) else str(m.get(k, "-")) for k in keys))
    roll = [m for m in lines if "rollout_s" in m]
    if roll:
        gen, tool, judge, train = (sum(m.get(k, 0.0) for m in roll) for k in ("generate_s", "tool_s", "judge_s",
                                                                             "train_s"))
        wall = sum(m["rollout_s"] + m.get("train_s", 0.0) for m in roll)
        eps = sum(m.get("episodes", 0) for m in roll)
        rate = f"{eps / wall * 3600:.0f}" if wall > 0 else "-"
        out.append(f"episodes {eps} in {wall:.1f} s: {rate} episodes/hour; summed over episodes: "
                   f"generation {gen:.1f} s, tools {tool:.1f} s, judge {judge:.1f} s; training {train:.1f} s "
                   f"(rollout wall {sum(m['rollout_s'] for m in roll):.1f} s)")
        out.append(f"rewards: {_summed(roll, 'reward_counts')}; terminations: {_summed(roll, 'terminations')}")
    return "\n".join(out)
