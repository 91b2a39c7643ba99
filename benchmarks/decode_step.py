"""One decode step of a real-shape model (random weights, bf16) at a batch of rows with a prefilled
cache: host time (CUDA-synchronised wall time over 30 steps), device time and kernels per step
(torch.profiler), through transformers' modules, through train/fastdecode.FastDecoder, and through
FastDecoder's step replayed from a CUDA graph (fastdecode.GraphedStep, as the rollouts run it).

    python benchmarks/decode_step.py --shape qwen2.5-1.5b --rows 32 --context 4096
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from cuda_agent.train.fastdecode import FastDecoder, GraphedStep
from cuda_agent.train.shapes import SHAPES, build_model


def timed(step, n: int = 30) -> tuple[float, float, float]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / n
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    device = sum(e.self_device_time_total for e in events) / 5 / 1000
    kernels = sum(e.count for e in events if e.self_device_time_total > 0) / 5
    return host * 1000, device, kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=4096)
    a = p.parse_args()
    model = build_model(a.shape, "cuda", torch.bfloat16)
    ids = torch.randint(0, 1000, (a.rows, a.context), device="cuda")
    with torch.inference_mode():
        cache = DynamicCache()
        for s in range(0, a.context, 2048):
            model(input_ids=ids[:, s:s + 2048], past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = ids[:, -1:]
        hf = timed(lambda: model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1))
        # the same rows through FastDecoder, over a slab with room for the timed steps
        fast = FastDecoder(model)
        steps = 40
        slabs = []
        for layer in cache.layers:
            k = torch.zeros(*layer.keys.shape[:2], a.context + steps, layer.keys.shape[3], device="cuda",
                            dtype=layer.keys.dtype)
            v = torch.zeros_like(k)
            k[:, :, : a.context].copy_(layer.keys[:, :, : a.context])
            v[:, :, : a.context].copy_(layer.values[:, :, : a.context])
            slabs.append((k, v))
        pos = torch.full((a.rows,), a.context, device="cuda")
        start = torch.zeros(a.rows, dtype=torch.long, device="cuda")
        fd = timed(lambda: fast.step(tok[:, 0], pos, slabs, a.context, start))
        graph = GraphedStep(fast, slabs)
        graph.capture(tok[:, 0], pos, a.context, start)
        gd = timed(lambda: graph(tok[:, 0], pos, a.context, start))
    for name, (host, device, kernels) in (("transformers", hf), ("FastDecoder", fd), ("+CUDA graph", gd)):
        print(f"{name:<13} {a.shape} rows={a.rows} context={a.context}: {host:.1f} ms a step on the host "
              f"({a.rows / host * 1000:.0f} tokens/s), {device:.1f} ms on the device, {kernels:.0f} kernels")


if __name__ == "__main__":
    main()
