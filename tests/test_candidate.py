"""Candidates: single-file and workspace forms, hashing, limits and the fixed infrastructure."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pydantic
import pytest

from cuda_agent.candidate import (
    INFRA_FILES,
    MAX_SOURCE_BYTES,
    Candidate,
    CandidateError,
)

MODEL_NEW = '''import torch
import cuda_extension


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return cuda_extension.relu_forward(x)
'''

KERNEL = '''#include <torch/types.h>
__global__ void relu_kernel(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_forward(torch::Tensor x) { return x; }
'''

BINDING = '''#include "../binding_registry.h"
torch::Tensor relu_forward(torch::Tensor x);
REGISTER_BINDING(relu, [](pybind11::module_& m) { m.def("relu_forward", &relu_forward); });
'''

SINGLE = '''import torch
from torch.utils.cpp_extension import load_inline

cpp_sources = """torch::Tensor relu(torch::Tensor x) { return x.clamp_min(0); }"""
ext = load_inline("relu_ext", cpp_sources=cpp_sources, functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x)
'''


def make_workspace(root: Path, *, extra: dict[str, str] | None = None) -> Path:
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    (root / "model_new.py").write_text(MODEL_NEW)
    (root / "kernels" / "relu.cu").write_text(KERNEL)
    (root / "kernels" / "relu_binding.cpp").write_text(BINDING)
    for rel, text in (extra or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# --- single file -------------------------------------------------------------------------------

def test_single_file(tmp_path: Path):
    path = tmp_path / "solution.py"
    path.write_text(SINGLE)
    cand = Candidate.from_path(path)
    assert cand.kind == "file"
    assert cand.model_new == SINGLE
    assert cand.kernels == ()
    assert cand.origin == str(path)
    assert Candidate.from_path(str(path)) == cand


def test_single_file_hash_matches_from_source(tmp_path: Path):
    path = tmp_path / "solution.py"
    path.write_text(SINGLE)
    assert Candidate.from_path(path).hash == Candidate.from_source(SINGLE).hash


def test_single_file_hash_sensitive(tmp_path: Path):
    a = Candidate.from_source(SINGLE)
    b = Candidate.from_source(SINGLE.replace("clamp_min(0)", "clamp_min(1)"))
    assert a.hash != b.hash
    assert len(a.hash) == 16


def test_file_and_workspace_with_same_text_hash_differently():
    assert Candidate.from_source(MODEL_NEW).hash != Candidate.from_files(MODEL_NEW, {}).hash


# --- workspace ---------------------------------------------------------------------------------

def test_workspace(tmp_path: Path):
    root = make_workspace(tmp_path / "ws")
    cand = Candidate.from_path(root)
    assert cand.kind == "workspace"
    assert cand.model_new == MODEL_NEW
    assert cand.kernels == (("relu.cu", KERNEL), ("relu_binding.cpp", BINDING))
    assert cand.origin == str(root)


def test_workspace_ignores_other_suffixes_and_root_infra(tmp_path: Path):
    root = make_workspace(tmp_path / "ws", extra={
        "kernels/notes.txt": "scratch",
        "kernels/relu.o": "object",
        "kernels/build.ninja": "rule cc",
        "kernels/old.cu.bak": "old",
        "binding.cpp": "// tampered binding\n",
        "binding_registry.h": "#define REGISTER_BINDING(a, b)\n",
        "run.sh": "rm -rf /",
        "helper.cu": "// not under kernels/",
    })
    cand = Candidate.from_path(root)
    assert [rel for rel, _ in cand.kernels] == ["relu.cu", "relu_binding.cpp"]
    assert "tampered" not in cand.model_new
    assert all("tampered" not in src for _, src in cand.kernels)
    # Changing the workspace's own infra copies or ignored files does not change the candidate.
    (root / "binding.cpp").write_text("// tampered again\n")
    (root / "kernels" / "notes.txt").write_text("more scratch")
    assert Candidate.from_path(root).hash == cand.hash


def test_workspace_keeps_all_kernel_suffixes_and_subfolders(tmp_path: Path):
    root = make_workspace(tmp_path / "ws", extra={
        "kernels/common.cuh": "#pragma once\n",
        "kernels/util.h": "#pragma once\n",
        "kernels/util.hpp": "#pragma once\n",
        "kernels/cpu/relu_cpu.cpp": "// cpu\n",
    })
    rels = [rel for rel, _ in Candidate.from_path(root).kernels]
    assert rels == sorted(rels)
    assert set(rels) == {"common.cuh", "cpu/relu_cpu.cpp", "relu.cu", "relu_binding.cpp",
                         "util.h", "util.hpp"}


def test_workspace_without_kernels_dir(tmp_path: Path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "model_new.py").write_text(MODEL_NEW)
    cand = Candidate.from_path(root)
    assert cand.kind == "workspace" and cand.kernels == ()


def test_workspace_hash_stable(tmp_path: Path):
    a = Candidate.from_path(make_workspace(tmp_path / "a"))
    b = Candidate.from_path(make_workspace(tmp_path / "b"))
    assert a.hash == b.hash  # location does not matter, content does
    assert a.hash == Candidate.from_path(tmp_path / "a").hash
    assert a.hash == Candidate.from_files(MODEL_NEW, {"relu_binding.cpp": BINDING, "relu.cu": KERNEL}).hash


@pytest.mark.parametrize("which", ["relu.cu", "relu_binding.cpp"])
def test_workspace_hash_sensitive_to_any_kernel_byte(tmp_path: Path, which: str):
    root = make_workspace(tmp_path / "ws")
    before = Candidate.from_path(root).hash
    path = root / "kernels" / which
    data = bytearray(path.read_bytes())
    for pos in (0, len(data) // 2, len(data) - 1):
        changed = bytearray(data)
        changed[pos] = ord("#") if changed[pos] != ord("#") else ord("$")
        path.write_bytes(bytes(changed))
        assert Candidate.from_path(root).hash != before, pos
    path.write_bytes(bytes(data) + b" ")
    assert Candidate.from_path(root).hash != before
    path.write_bytes(bytes(data))
    assert Candidate.from_path(root).hash == before


def test_workspace_hash_sensitive_to_names_and_model(tmp_path: Path):
    root = make_workspace(tmp_path / "ws")
    before = Candidate.from_path(root).hash
    (root / "kernels" / "relu.cu").rename(root / "kernels" / "relu2.cu")
    renamed = Candidate.from_path(root).hash
    assert renamed != before
    (root / "model_new.py").write_text(MODEL_NEW + "\n")
    assert Candidate.from_path(root).hash not in (before, renamed)
    (root / "kernels" / "extra.cuh").write_text("")
    assert len({before, renamed, Candidate.from_path(root).hash}) == 3


def test_hash_separates_name_and_content():
    # Moving bytes between a file name and its content must not collide.
    a = Candidate.from_files("m", {"ab.cu": "c"})
    b = Candidate.from_files("m", {"a": "b.cuc"})
    assert a.hash != b.hash


def test_candidate_is_frozen(tmp_path: Path):
    cand = Candidate.from_path(make_workspace(tmp_path / "ws"))
    with pytest.raises(pydantic.ValidationError):
        cand.model_new = "x"


# --- errors ------------------------------------------------------------------------------------

def test_workspace_without_model_new(tmp_path: Path):
    root = make_workspace(tmp_path / "ws")
    (root / "model_new.py").unlink()
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(root)
    assert str(root) in str(err.value)
    assert "model_new.py" in str(err.value)


def test_missing_path(tmp_path: Path):
    missing = tmp_path / "absent.py"
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(missing)
    assert str(missing) in str(err.value)
    assert "no such file" in str(err.value)


def test_oversized_file(tmp_path: Path):
    path = tmp_path / "big.py"
    path.write_text("#" * (MAX_SOURCE_BYTES + 1))
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(path)
    assert str(path) in str(err.value)
    assert str(MAX_SOURCE_BYTES) in str(err.value)
    path.write_text("#" * MAX_SOURCE_BYTES)
    assert len(Candidate.from_path(path).model_new) == MAX_SOURCE_BYTES


def test_oversized_kernel(tmp_path: Path):
    root = make_workspace(tmp_path / "ws")
    big = root / "kernels" / "huge.cu"
    big.write_text("/" * (MAX_SOURCE_BYTES + 10))
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(root)
    assert str(big) in str(err.value)


def test_non_utf8_file(tmp_path: Path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"# caf\xe9\nclass ModelNew: pass\n")
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(path)
    assert str(path) in str(err.value)
    assert "UTF-8" in str(err.value)


def test_non_utf8_kernel(tmp_path: Path):
    root = make_workspace(tmp_path / "ws")
    bad = root / "kernels" / "relu.cu"
    bad.write_bytes(b"\xff\xfe binary")
    with pytest.raises(CandidateError) as err:
        Candidate.from_path(root)
    assert str(bad) in str(err.value)


def test_candidate_error_is_value_error():
    assert issubclass(CandidateError, ValueError)


# --- write_workspace ---------------------------------------------------------------------------

def test_write_workspace_uses_package_infra(tmp_path: Path):
    src = make_workspace(tmp_path / "src", extra={"binding.cpp": "// tampered\n",
                                                  "binding_registry.h": "// tampered\n"})
    cand = Candidate.from_path(src)
    out = tmp_path / "out" / "nested"
    cand.write_workspace(out)
    assert (out / "model_new.py").read_text() == MODEL_NEW
    assert (out / "kernels" / "relu.cu").read_text() == KERNEL
    assert (out / "kernels" / "relu_binding.cpp").read_text() == BINDING
    infra = files("cuda_agent") / "infra"
    for name in INFRA_FILES:
        assert (out / name).read_text() == (infra / name).read_text()
        assert "tampered" not in (out / name).read_text()
    assert "PYBIND11_MODULE" in (out / "binding.cpp").read_text()
    assert "REGISTER_BINDING" in (out / "binding_registry.h").read_text()
    # Reading back what was written gives the same candidate.
    assert Candidate.from_path(out).hash == cand.hash


def test_write_workspace_subfolders_and_overwrite(tmp_path: Path):
    cand = Candidate.from_files(MODEL_NEW, {"sub/a.cu": "// a\n", "b_binding.cpp": "// b\n"})
    out = tmp_path / "ws"
    out.mkdir()
    (out / "binding.cpp").write_text("// stale\n")
    cand.write_workspace(out)
    assert (out / "kernels" / "sub" / "a.cu").read_text() == "// a\n"
    assert (out / "binding.cpp").read_text() == (files("cuda_agent") / "infra" / "binding.cpp").read_text()
    assert Candidate.from_path(out).kernels == (("b_binding.cpp", "// b\n"), ("sub/a.cu", "// a\n"))
