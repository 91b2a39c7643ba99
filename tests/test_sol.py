"""Speed-of-light: the work counted from a reference (FLOPs by precision, least DRAM bytes) on known
cases, the bound on GPU models of the peaks table, and how it reaches verdicts and metrics."""

from __future__ import annotations

import json

import pytest

from cuda_agent.hardware import GPU_PEAKS, count_work, peaks_for, speed_of_light
from cuda_agent.hardware.sol import SpeedOfLight, TaskWork, matmul_rate, vector_rate
from cuda_agent.judge.verdict import Timing, Verdict
from cuda_agent.metrics import Outcome, metrics

H200 = "NVIDIA H200"


def task(model: str, inputs: str, init: str = "[]", imports: str = "") -> str:
    return (f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n{imports}\n{model}\n"
            f"def get_inputs():\n    return {inputs}\n\ndef get_init_inputs():\n    return {init}\n")


GEMM = task("class Model(nn.Module):\n    def forward(self, a, b):\n        return a @ b\n",
            "[torch.randn(512, 256), torch.randn(256, 1024)]")


def test_gemm_flops_bytes_and_bound():
    w = count_work(GEMM)
    assert w.counted_on == "meta"
    assert w.matmul_flops == {"fp32": 2 * 512 * 256 * 1024}
    assert w.vector_flops == {}
    assert (w.input_bytes, w.param_bytes, w.output_bytes) == (4 * (512 * 256 + 256 * 1024), 0, 4 * 512 * 1024)
    sol = speed_of_light(w, H200)
    p = peaks_for(H200)
    # fp32 GEMM: the faster of FP32 CUDA cores (67 TFLOP/s) and 3xTF32 on tensor cores (494.7 / 3)
    rate = max(67e12, 494.7e12 / 3)
    assert matmul_rate(p, "fp32") == pytest.approx(rate)
    assert sol.matmul_ms == pytest.approx(2 * 512 * 256 * 1024 / rate * 1e3)
    assert sol.memory_ms == pytest.approx(w.dram_bytes / 4.8e12 * 1e3)
    assert sol.sol_ms == pytest.approx(max(sol.memory_ms, sol.matmul_ms))
    assert sol.bound == "compute" and sol.gpu_model == "H200 SXM"
    assert w.intensity == pytest.approx(w.flops / w.dram_bytes)


def test_half_precision_gemm_is_rated_at_its_tensor_core_peak():
    src = GEMM.replace("torch.randn(512, 256), torch.randn(256, 1024)",
                       "torch.randn(512, 256, dtype=torch.bfloat16), torch.randn(256, 1024, dtype=torch.bfloat16)")
    w = count_work(src)
    assert w.matmul_flops == {"bf16": 2 * 512 * 256 * 1024}
    assert w.dram_bytes == 2 * (512 * 256 + 256 * 1024 + 512 * 1024)
    sol = speed_of_light(w, "NVIDIA H100 80GB HBM3")
    assert sol.gpu_model == "H100 SXM"
    assert sol.matmul_ms == pytest.approx(2 * 512 * 256 * 1024 / 989.4e12 * 1e3)


def test_linear_counts_parameters_once():
    src = task("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.fc = nn.Linear(64, 32)\n    def forward(self, x):\n        return torch.relu(self.fc(x))\n",
               "[torch.randn(128, 64)]")
    w = count_work(src)
    assert w.matmul_flops == {"fp32": 2 * 128 * 64 * 32}
    assert w.param_bytes == 4 * (64 * 32 + 32)
    assert w.vector_flops == {"fp32": 128 * 32}          # the relu: one per output element
    assert w.dram_bytes == 4 * (128 * 64 + 64 * 32 + 32 + 128 * 32)


def test_elementwise_is_memory_bound_at_bytes_over_bandwidth():
    src = task("class Model(nn.Module):\n    def forward(self, x, y):\n        return F.gelu(x) + y\n",
               "[torch.randn(1024, 4096), torch.randn(1024, 4096)]")
    w = count_work(src)
    n = 1024 * 4096
    assert w.matmul_flops == {} and w.vector_flops == {"fp32": 2 * n}   # gelu and add
    assert w.dram_bytes == 3 * 4 * n
    sol = speed_of_light(w, H200)
    assert sol.bound == "memory"
    assert sol.sol_ms == pytest.approx(3 * 4 * n / 4.8e12 * 1e3)
    assert sol.vector_ms == pytest.approx(2 * n / vector_rate(peaks_for(H200), "fp32") * 1e3)


def test_reduction_reads_every_element_and_writes_one_per_row():
    src = task("class Model(nn.Module):\n    def forward(self, x):\n        return x.sum(dim=1)\n",
               "[torch.randn(256, 8192)]")
    w = count_work(src)
    assert w.vector_flops == {"fp32": 256 * 8192}
    assert (w.input_bytes, w.output_bytes) == (4 * 256 * 8192, 4 * 256)
    sol = speed_of_light(w, "NVIDIA A100-SXM4-40GB")
    assert sol.gpu_model == "A100 40GB" and sol.bound == "memory"
    assert sol.sol_ms == pytest.approx(4 * (256 * 8192 + 256) / 1555e9 * 1e3)


def test_softmax_moves_its_input_and_output_once():
    src = task("class Model(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n",
               "[torch.randn(4096, 2048, dtype=torch.float16)]")
    w = count_work(src)
    n = 4096 * 2048
    assert w.vector_flops == {"fp16": n}
    assert w.dram_bytes == 2 * 2 * n
    sol = speed_of_light(w, "NVIDIA L40S")
    assert sol.gpu_model == "L40S" and sol.bound == "memory"
    assert sol.sol_ms == pytest.approx(2 * 2 * n / 864e9 * 1e3)
    assert vector_rate(peaks_for("NVIDIA L40S"), "fp16") == pytest.approx(2 * 91.6e12)


def test_conv2d_flops_follow_the_direct_formula():
    src = task("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)\n"
               "    def forward(self, x):\n        return self.conv(x)\n",
               "[torch.randn(8, 16, 64, 64)]")
    w = count_work(src)
    out_elems = 8 * 32 * 64 * 64
    assert w.matmul_flops == {"fp32": 2 * out_elems * 16 * 3 * 3}
    assert w.param_bytes == 4 * 32 * 16 * 3 * 3
    assert w.dram_bytes == 4 * (8 * 16 * 64 * 64 + 32 * 16 * 9 + out_elems)
    sol = speed_of_light(w, "NVIDIA H100 PCIe")
    assert sol.gpu_model == "H100 PCIe"
    assert sol.matmul_ms == pytest.approx(w.matmul_flops["fp32"] / max(51.2e12, 378e12 / 3) * 1e3)


def test_peaks_table_resolves_the_names_torch_gives():
    names = {"NVIDIA H200": "H200 SXM", "NVIDIA H200 NVL": "H200 NVL", "NVIDIA H100 80GB HBM3": "H100 SXM",
             "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL", "NVIDIA A100-SXM4-80GB": "A100 80GB SXM",
             "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA A100-PCIE-40GB": "A100 40GB",
             "NVIDIA A100 80GB PCIe": "A100 80GB PCIe", "NVIDIA L40S": "L40S"}
    for name, model in names.items():
        assert peaks_for(name).model == model, name
    assert peaks_for("Tesla V100-SXM2-16GB") is None
    for p in GPU_PEAKS:  # every entry says where its figures come from and has the keys the bound uses
        assert p.source and p.dram_gbs > 0 and {"fp32", "tf32", "fp16", "bf16"} <= set(p.tflops)


def test_cpu_and_unknown_gpus_have_no_bound_but_keep_the_work():
    w = count_work(GEMM)
    cpu = speed_of_light(w, "cpu x2")
    assert cpu.sol_ms is None and "CPU backend has no speed-of-light" in cpu.reason and cpu.work == w
    other = speed_of_light(w, "Tesla V100")
    assert other.sol_ms is None and "H200 SXM" in other.reason
    assert cpu.share(1.0) is None


def test_unrunnable_reference_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot count"):
        count_work(task("class Model(nn.Module):\n    def forward(self, x):\n        raise RuntimeError('no')\n",
                        "[torch.randn(4)]"))


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5)


def test_verdict_reports_runtime_as_a_share_of_speed_of_light():
    sol = speed_of_light(count_work(GEMM), H200)
    v = Verdict(task_id="t", task_name="gemm", candidate_hash="c", device="cuda", device_name=H200, correct=True,
                runtime=timing(4 * sol.sol_ms), eager=timing(8 * sol.sol_ms), speed_of_light=sol)
    assert v.sol_share == pytest.approx(0.25) and v.eager_sol_share == pytest.approx(0.125)
    s = v.summary()
    assert s["sol_ms"] == pytest.approx(sol.sol_ms) and s["sol_share"] == pytest.approx(0.25)
    assert s["sol_bound"] == "compute" and s["sol_gpu"] == "H200 SXM"
    # the record survives JSON (results database, pool transport)
    back = Verdict.model_validate_json(v.model_dump_json())
    assert back.speed_of_light == sol and back.sol_share == pytest.approx(0.25)
    v.correct = False
    assert v.sol_share is None and v.summary()["eager_sol_share"] == pytest.approx(0.125)


def test_metrics_geomean_share_over_correct_pairs_with_a_bound():
    outcomes = [Outcome(level=1, correct=True, speedup_vs_eager=2.0, sol_share=0.5, eager_sol_share=0.25),
                Outcome(level=1, correct=True, speedup_vs_eager=2.0, sol_share=0.125, eager_sol_share=0.0625),
                Outcome(level=1, correct=False),
                Outcome(level=1, correct=True, speedup_vs_eager=1.0)]   # no bound (e.g. the CPU backend)
    m = metrics(outcomes)
    assert m.n_sol == 2
    assert m.geomean_sol_share == pytest.approx(0.25) and m.geomean_eager_sol_share == pytest.approx(0.125)
    assert metrics([Outcome(level=1, correct=True, speedup_vs_eager=1.0)]).geomean_sol_share is None


def test_baseline_record_keeps_speed_of_light_and_reads_old_caches():
    from cuda_agent.judge.baselines import Baseline

    old = '{"timing": %s, "overhead_ms": 0.1}' % timing(1.0).model_dump_json()
    assert Baseline.model_validate_json(old).speed_of_light is None
    sol = SpeedOfLight(work=TaskWork(input_bytes=8), device_name="cpu x2", reason="none here")
    b = Baseline(timing=timing(1.0), overhead_ms=0.1, speed_of_light=sol)
    assert Baseline.model_validate_json(b.model_dump_json()).speed_of_light == sol


def test_sol_command_lists_the_suite_on_a_named_gpu(tmp_path):
    from typer.testing import CliRunner

    from cuda_agent.cli import app

    out = tmp_path / "sol.jsonl"
    res = CliRunner().invoke(app, ["sol", "suite", "--gpu", "H100 SXM", "--level", "1", "--out", str(out)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "1_Matmul_Square" in res.output and "H100 SXM" in res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["level"] == 1 for r in rows)
    gemm = next(r for r in rows if r["task"] == "1_Matmul_Square")["speed_of_light"]
    assert gemm["bound"] == "compute" and gemm["work"]["matmul_flops"]["fp32"] > 0
    bad = CliRunner().invoke(app, ["sol", "suite", "--gpu", "V100"])
    assert bad.exit_code == 2 and "known" in bad.output


def test_synthesis_export_carries_the_work_and_an_h200_bound():
    from cuda_agent.synth.export import SCHEMA, _work

    work, sol_ms = _work(GEMM)
    assert TaskWork.model_validate_json(work).matmul_flops == {"fp32": 2 * 512 * 256 * 1024}
    assert sol_ms == pytest.approx(speed_of_light(count_work(GEMM), H200).sol_ms)
    assert _work("import torch\nclass Model: pass\ndef get_inputs(): raise ValueError\n"
                 "def get_init_inputs(): return []\n") == (None, None)
    assert {"work", "sol_ms_h200"} <= set(SCHEMA.names)
