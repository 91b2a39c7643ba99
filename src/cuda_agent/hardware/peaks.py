"""Peak DRAM bandwidth and arithmetic throughput per GPU model, the basis of speed-of-light.

Figures are NVIDIA's published peaks (dense, no structured sparsity, boost clock), because a
speed-of-light is a lower bound on runtime: it must use what no kernel can beat, not what a good
kernel reaches. Measured figures are kept beside them where this project measured them, to show how
far below the datasheet the practical ceiling lies; they are never used for the bound.

Units: bandwidth in GB/s (1e9 bytes per second), throughput in TFLOP/s (1e12 per second), INT8 in
TOP/s under the same key. Precision keys:

- ``fp64``: the fastest FP64 path (tensor cores where the chip has FP64 MMA);
- ``fp32``: IEEE FP32 on CUDA cores (the judge computes references in true fp32 and rejects TF32
  operands, so a fp32 GEMM runs on CUDA cores or as a split-precision emulation, see `sol.py`);
- ``tf32``, ``fp16``, ``bf16``, ``fp8``, ``int8``: tensor-core peaks (fp16/bf16 with fp32
  accumulation as listed in the datasheets).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field


class GpuPeaks(BaseModel):
    """One GPU model's peaks. `match` is a regular expression over `torch.cuda.get_device_name()`."""

    model_config = ConfigDict(frozen=True)
    model: str
    match: str
    dram_gbs: float
    tflops: dict[str, float]
    sms: int
    source: str
    # L2 cache in MB (1e6 bytes): the most data a call can find on chip at its start or leave there at
    # its end instead of moving it through DRAM (the physical floor, `sol.floor_ms`). The full die's
    # L2 where products enable less (GH100: 60 MB, 50 enabled on H100/H200): a larger L2 only lowers the
    # floor. The judge also asks the device and takes the larger figure.
    l2_mb: float = 0.0
    measured_dram_gbs: float | None = None        # this project's own measurement, never used for bounds
    measured_tflops: dict[str, float] = Field(default_factory=dict)

    def flops_per_s(self, precision: str) -> float | None:
        tf = self.tflops.get(precision)
        return tf * 1e12 if tf else None


# The order matters: the first match wins, so specific names (NVL, PCIe, 40GB) come before the
# generic ones. The regular expressions cover how torch names each board, e.g. "NVIDIA H100 80GB
# HBM3" (SXM5), "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe".
GPU_PEAKS: tuple[GpuPeaks, ...] = (
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200, Tensor Core figures halved to dense):
    # H200 NVL: 4.8 TB/s, FP64 TC 60, FP32 60, TF32 835 sparse, BF16/FP16 1671 sparse, FP8 3341 sparse.
    GpuPeaks(model="H200 NVL", match=r"H200\s*NVL", dram_gbs=4800, sms=132, l2_mb=60,
             tflops={"fp64": 60, "fp32": 60, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5,
                     "int8": 1670.5},
             source="NVIDIA H200 datasheet (H200 NVL column), sparse Tensor Core figures halved"),
    # H200 SXM: 4.8 TB/s HBM3e, FP64 TC 67, FP32 67, TF32 989 sparse, BF16/FP16 1979 sparse, FP8 3958
    # sparse, INT8 3958 sparse. Measured on the lent H200 (torch 2.11, cu130): ~4.3 TB/s device-to-device
    # copy, ~790 TFLOP/s bf16 dense matmul.
    GpuPeaks(model="H200 SXM", match=r"H200", dram_gbs=4800, sms=132, l2_mb=60,
             tflops={"fp64": 67, "fp32": 67, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
                     "int8": 1978.9},
             source="NVIDIA H200 datasheet (H200 SXM column), sparse Tensor Core figures halved",
             measured_dram_gbs=4300, measured_tflops={"bf16": 790}),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): H100 NVL 3.9 TB/s, FP64 TC 60,
    # FP32 60, TF32 835 sparse, BF16 1671 sparse, FP8 3341 sparse.
    GpuPeaks(model="H100 NVL", match=r"H100\s*NVL", dram_gbs=3900, sms=132, l2_mb=60,
             tflops={"fp64": 60, "fp32": 60, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5,
                     "int8": 1670.5},
             source="NVIDIA H100 datasheet (H100 NVL column), sparse Tensor Core figures halved"),
    # H100 PCIe: 2.0 TB/s HBM2e, FP64 TC 51, FP32 51, TF32 756 sparse, BF16 1513 sparse, FP8 3026 sparse
    # (114 SMs x 128 FP32 lanes x 2 x 1.755 GHz = 51.2 TFLOP/s).
    GpuPeaks(model="H100 PCIe", match=r"H100.*PCIe", dram_gbs=2000, sms=114, l2_mb=60,
             tflops={"fp64": 51, "fp32": 51.2, "tf32": 378, "fp16": 756.5, "bf16": 756.5, "fp8": 1513,
                     "int8": 1513},
             source="NVIDIA H100 datasheet (H100 PCIe column), sparse Tensor Core figures halved"),
    # H100 SXM5: 3.35 TB/s HBM3, FP64 TC 67, FP32 67, TF32 989 sparse, BF16/FP16 1979 sparse, FP8 3958 sparse.
    GpuPeaks(model="H100 SXM", match=r"H100", dram_gbs=3350, sms=132, l2_mb=60,
             tflops={"fp64": 67, "fp32": 67, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
                     "int8": 1978.9},
             source="NVIDIA H100 datasheet (H100 SXM column), sparse Tensor Core figures halved"),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): FP64 TC 19.5, FP32 19.5, TF32 156,
    # BF16/FP16 312, INT8 624 (dense); bandwidth 1,555 GB/s (40GB), 1,935 GB/s (80GB PCIe),
    # 2,039 GB/s (80GB SXM). No FP8 on Ampere.
    GpuPeaks(model="A100 80GB PCIe", match=r"A100.*80GB.*PCIe|A100-PCIE-80GB", dram_gbs=1935, sms=108, l2_mb=48,
             tflops={"fp64": 19.5, "fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624},
             source="NVIDIA A100 datasheet (80GB PCIe column)"),
    GpuPeaks(model="A100 40GB", match=r"A100.*40GB|A100-PCIE-40GB", dram_gbs=1555, sms=108, l2_mb=48,
             tflops={"fp64": 19.5, "fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624},
             source="NVIDIA A100 datasheet (40GB PCIe and SXM columns)"),
    GpuPeaks(model="A100 80GB SXM", match=r"A100", dram_gbs=2039, sms=108, l2_mb=48,
             tflops={"fp64": 19.5, "fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624},
             source="NVIDIA A100 datasheet (80GB SXM column)"),
    # NVIDIA L40S datasheet (dense | sparse): 864 GB/s GDDR6, FP32 91.6, TF32 183 | 366, BF16/FP16
    # 362.05 | 733, FP8 733 | 1466, INT8 733 | 1466; FP64 is not listed: 1/64 of FP32 on AD102.
    GpuPeaks(model="L40S", match=r"L40S", dram_gbs=864, sms=142, l2_mb=96,
             tflops={"fp64": 1.43, "fp32": 91.6, "tf32": 183, "fp16": 362.05, "bf16": 362.05, "fp8": 733,
                     "int8": 733},
             source="NVIDIA L40S datasheet, dense figures; FP64 as 1/64 of FP32"),
)


def peaks_for(device_name: str) -> GpuPeaks | None:
    """The peaks of the GPU torch names `device_name`, or None for a model not in the table (and for
    the CPU backend, which has none: its bound would depend on the host's cores, clocks and memory
    channels, which the judge does not know)."""
    for peaks in GPU_PEAKS:
        if re.search(peaks.match, device_name, flags=re.IGNORECASE):
            return peaks
    return None


def known_models() -> list[str]:
    return [p.model for p in GPU_PEAKS]
