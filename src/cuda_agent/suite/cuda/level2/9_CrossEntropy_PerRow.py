# Level 2: per-example cross-entropy (log-softmax over the classes + pick the target's term).
# estimate on H200: logits 32768 x 8192 fp32 = 1.07 GB; eager log_softmax reads and writes it (2.1 GB), the gather
#   is small: ~2.1 GB / 4 TB/s ~= 0.54 ms (fused, one read: 1.07 GB ~= 0.27 ms)
# eager on H200 (torch 2.11): 2.84 ms measured at 98304 x 8192, so ~0.95 ms expected at this shape
# size: capped near 1 GiB per tensor so that every checked call's inputs and outputs cross the
# process boundary quickly.
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32768
CLASSES = 8192


class Model(nn.Module):
    """loss[i] = logsumexp(logits[i]) - logits[i, target[i]]."""

    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target, reduction="none")


def get_inputs():
    return [torch.randn(BATCH, CLASSES) * 2.0, torch.randint(0, CLASSES, (BATCH,))]


def get_init_inputs():
    return []
