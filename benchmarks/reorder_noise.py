"""How far from float64 do correct float32 orders of the same arithmetic land, against the reference's?

The judge's relative-L2 bound scales with the float32 reference's own error against float64 (its
"noise"), capped at `max_rel_l2_ceiling + CEILING_NOISE_MULTIPLE x noise` (`cuda_agent.judge.compare`).
This measures, for an ill-conditioned task where a few outputs carry the norm (KernelBench level 1,
problem 50: products of 256 standard-normal float32 factors, which pass through denormals), the
ratio of one order's error to another's over many input draws, and how many correct (order,
reference-order) pairs the bound would refuse at each cap multiple. The orders are written with
elementwise float32 multiplies, so the figures do not depend on the CPU's vector width.

    python benchmarks/reorder_noise.py [--draws 40] [--multiples 1 2 3 4 6 16]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch


def left_to_right(x: torch.Tensor) -> torch.Tensor:
    acc = x[:, 0].clone()
    for k in range(1, x.shape[1]):
        acc = acc * x[:, k]
    return acc


def pairwise(x: torch.Tensor) -> torch.Tensor:
    while x.shape[1] > 1:
        x = x[:, 0::2] * x[:, 1::2]
    return x[:, 0]


def lanes(width: int):
    """`width` strided partial products (a vectorised or per-thread loop), then combined pairwise."""
    return lambda x: pairwise(torch.stack([left_to_right(x[:, i::width]) for i in range(width)], 1))


ORDERS = {"left_to_right": left_to_right, "right_to_left": lambda x: left_to_right(x.flip(1)),
          "pairwise": pairwise, "lanes8": lanes(8), "lanes32": lanes(32)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=int, default=40, help="input draws (seeds 0..N-1)")
    p.add_argument("--multiples", type=float, nargs="+", default=[1, 2, 3, 4, 6, 16],
                   help="cap multiples of the reference's error to count refusals at")
    p.add_argument("--floor", type=float, default=1e-4)
    p.add_argument("--ceiling", type=float, default=1e-2)
    p.add_argument("--noise-multiple", type=float, default=16.0)
    a = p.parse_args()
    pairs = []  # (reference's error, the other order's error), both against float64
    for seed in range(a.draws):
        x = torch.randn(16, 256, 256, generator=torch.Generator().manual_seed(seed))
        exact = torch.prod(x.double(), 1)
        norm = float(exact.norm())
        if norm == 0.0:
            continue
        errs = {name: float((f(x).double() - exact).norm()) / norm for name, f in ORDERS.items()}
        pairs += [(errs[r], errs[c]) for r, c in itertools.permutations(errs, 2) if errs[r] > 0]
    ratios = sorted((c / r for r, c in pairs), reverse=True)
    print(f"{len(pairs)} (reference order, other order) pairs over {a.draws} draws, {len(ORDERS)} orders")
    print(f"other order's error / reference's: median {statistics.median(ratios):.2f}, "
          f"99th percentile {ratios[len(ratios) // 100]:.2f}, max {ratios[0]:.2f}")
    print("| cap multiple | correct pairs refused by the bound | share |\n|---|---|---|")
    for k in a.multiples:
        refused = sum(1 for r, c in pairs if c > min(max(a.floor, a.noise_multiple * r), a.ceiling + k * r))
        print(f"| {k:g} | {refused} | {refused / len(pairs):.1%} |")


if __name__ == "__main__":
    main()
