"""The judge's launch observer (infra/launches.cpp, judge/launches.py), built and loaded for real.

On a GPU the check runs in a fresh interpreter, as the worker does: the observer is loaded and
subscribed, then kernels are launched the ways a candidate could launch them (PyTorch, a CUDA graph
captured beforehand, a kernel compiled at run time and launched through the driver from another
thread). On the CPU: where the judge finds CUPTI's headers and library.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import judge_cache_dir
from cuda_agent.judge import launches as ln
from cuda_agent.judge.builds import Builder
from cuda_agent.judge.sandbox import work_root_dir

SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys, threading
    import torch
    from cuda_agent.judge import launches as ln
    from cuda_agent.judge import observer as obs

    torch.cuda.init()
    spec = importlib.util.spec_from_file_location(ln.MODULE, sys.argv[1])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    token = obs.new_token()
    out = {"enabled": m.install(token, ln.cupti_library(), "cuda_agent_gate")}
    m.warm(token)
    x = torch.randn(256, 1024, device="cuda")

    # a graph captured before any call is observed, replayed inside one
    static = torch.empty(256, 1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.softmax(static, dim=1)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        y = torch.softmax(static, dim=1)
    torch.cuda.synchronize()
    m.take(token)

    def observe(fn):
        m.take(token)
        fn()
        torch.cuda.synchronize()
        return m.take(token)

    out["plain"] = observe(lambda: torch.relu(x))
    out["nothing"] = observe(lambda: None)
    out["graph"] = observe(graph.replay)
    # a kernel of its own, compiled at run time and launched through the driver, from another thread
    kernel = torch.cuda._compile_kernel(
        'extern "C" __global__ void own_scale(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; '
        'if (i < n) p[i] *= 2.0f; }', "own_scale")
    t = threading.Thread(target=lambda: kernel(grid=(1024, 1, 1), block=(256, 1, 1), args=[x, x.numel()]))
    out["thread"] = observe(lambda: (t.start(), t.join()))
    out["disabled"] = m.disabled(token)

    # who issued each kernel (image chains, see launches.cpp `issuer`)
    def owned(fn):
        m.take(token)
        fn()
        torch.cuda.synchronize()
        return {name: chains for name, chains in m.take_owned(token)}

    a = torch.randn(512, 512, device="cuda")
    out["owned_relu"] = owned(lambda: torch.relu(x))
    out["owned_mm"] = owned(lambda: torch.mm(a, a))
    out["owned_graph"] = owned(graph.replay)
    t2 = threading.Thread(target=lambda: kernel(grid=(1024, 1, 1), block=(256, 1, 1), args=[x, x.numel()]))
    out["owned_thread"] = owned(lambda: (t2.start(), t2.join()))
    # between calls: after take(judge=True) this thread's launches are the judge's own, left out,
    # while another thread's are kept for the next take (after begin)
    m.take(token, True)
    torch.relu(x)
    t3 = threading.Thread(target=lambda: kernel(grid=(1024, 1, 1), block=(256, 1, 1), args=[x, x.numel()]))
    t3.start(); t3.join()
    torch.cuda.synchronize()
    m.begin(token)
    out["between"] = m.take(token)
    torch.relu(x)
    torch.cuda.synchronize()
    out["after_begin"] = m.take(token)
    out["torch_dir"] = ln.torch_dir()
    # the activity records of a call: the kernels that ran and their device time
    m.activity_start(token)
    for _ in range(3):
        torch.relu(x)
    torch.cuda.synchronize()
    m.activity_stop(token)
    torch.relu(x)  # after the window
    names, ms = m.activity_take(token)
    out["activity"] = {"names": names, "ms": ms}
    try:
        m.take("0" * 48)
        out["foreign_token"] = "answered"
    except RuntimeError:
        out["foreign_token"] = "refused"
    try:
        m.install(obs.new_token(), ln.cupti_library(), "")
        out["second_install"] = "installed"
    except RuntimeError:
        out["second_install"] = "refused"
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def launches_library(tmp_path_factory):
    spec = ln.spec()
    if spec is None:
        pytest.skip("no CUPTI headers where PyTorch's CUDA is")
    cache = judge_cache_dir(tmp_path_factory)
    builder = Builder(cache, work_root_dir(), arch=None, timeout_s=900, uid=None)
    return builder.build(spec).library


@pytest.mark.gpu
def test_launch_observer_sees_every_launch(launches_library):
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(launches_library)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["enabled"] >= 2
    assert any("at::native" in k for k in out["plain"]), out["plain"]
    assert out["nothing"] == []
    # the replay is seen, and with it the kernels the graph was captured with
    assert ln_graph_launch() in out["graph"]
    assert any("softmax" in k.lower() for k in out["graph"]), out["graph"]
    assert out["thread"] == ["own_scale"], out["thread"]
    assert out["disabled"] == []
    assert any("at::native" in k for k in out["activity"]["names"]), out["activity"]
    assert 0 < out["activity"]["ms"] < 1000, out["activity"]
    assert out["foreign_token"] == "refused"
    assert out["second_install"] == "refused"

    # attribution: PyTorch's own kernels, and cuBLAS called by PyTorch, read as PyTorch's; a kernel
    # launched through the driver from Python (ctypes) does not
    from cuda_agent.judge.launches import check_kernel_owners, issuer_of

    torch_dir = out["torch_dir"]
    for case in ("owned_relu", "owned_mm"):
        chains = [c for name, cs in out[case].items() for c in cs]
        assert chains and all(issuer_of(c).library and issuer_of(c).library.startswith(torch_dir) for c in chains), \
            (case, out[case])
    assert any(issuer_of(c).vendor and "cublas" in issuer_of(c).vendor for cs in out["owned_mm"].values() for c in cs), \
        out["owned_mm"]
    assert check_kernel_owners(out["owned_mm"], "strict", frozenset({"gemm"}), torch_dir), out["owned_mm"]
    # the replayed graph's kernels carry their issuers at capture (PyTorch's softmax)
    softmax = [c for name, cs in out["owned_graph"].items() if "softmax" in name.lower() for c in cs]
    assert softmax and all(issuer_of(c).library.startswith(torch_dir) for c in softmax), out["owned_graph"]
    own = out["owned_thread"].get("own_scale")
    assert own and not any((issuer_of(c).library or "").startswith(torch_dir) for c in own), out["owned_thread"]
    assert out["between"] == ["own_scale"], out["between"]
    assert any("at::native" in k for k in out["after_begin"]), out["after_begin"]


def ln_graph_launch() -> str:
    return "cuda_agent::graph_launch"  # launches.cpp's GRAPH_LAUNCH


# ------------------------------------------------------------------ CPU: finding CUPTI (no GPU needed)
def _fake_cuda_wheel(root):
    wheel = root / "nvidia" / "cu13"
    (wheel / "include").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "include" / "cupti.h").write_text("#include <cupti_activity.h>\n")
    (wheel / "include" / "cupti_activity.h").write_text("/* activity */\n")
    (wheel / "include" / "cublas_v2.h").write_text("/* not CUPTI's */\n")
    (wheel / "lib" / "libcupti.so.13").write_bytes(b"\x7fELF")
    return wheel


@pytest.mark.parametrize("present", [True, False])
def test_cupti_headers_and_library_are_found_beside_pytorchs_cuda(tmp_path, monkeypatch, present):
    """The build spec carries CUPTI's headers (and nothing else of the folder) beside the source,
    since the judge's builds take no -I flags; without them there is no spec and the workers say so."""
    if present:
        wheel = _fake_cuda_wheel(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(ln, "_cuda_home", lambda: None)
    monkeypatch.setattr("builtins.open", _no_maps(open))
    spec = ln.spec()
    if not present:
        assert spec is None and ln.cupti_include() is None and ln.cupti_library() is None
        return
    assert ln.cupti_include() == wheel / "include"
    names = [name for name, _ in spec.sources]
    assert names == ["launches.cpp", "cupti.h", "cupti_activity.h"]
    assert spec.with_cuda and not any(flag.startswith("-I") for flag in spec.cflags)
    assert ln.cupti_library() == str(wheel / "lib" / "libcupti.so.13")


def _no_maps(real_open):
    """open() as it is, except that this process's memory map lists no libcupti (the CPU case)."""
    def fake(path, *args, **kwargs):
        if str(path) == "/proc/self/maps":
            raise OSError("not read in this test")
        return real_open(path, *args, **kwargs)
    return fake


# ------------------------------------------------------------------ CPU: the issuer of a launch (slow: builds C++)
PROBE = r"""
#include <pybind11/pybind11.h>
#undef PYBIND11_MODULE
#define PYBIND11_MODULE(name, m) [[maybe_unused]] static void launches_module_unused(pybind11::module_& m)
#include "launches.cpp"
// the observer's `issuer`, as the launch callback calls it (this image is the observer: its frames are skipped)
extern "C" const char* probe_issuer(const void* stub) {
  thread_local std::string out;
  out = *issuer(stub);
  return out.c_str();
}
"""
VENDOR = r"""
extern "C" const char* probe_issuer(const void* stub);
extern "C" const char* vendor_call(const void* stub) { const char* r = probe_issuer(stub); return r; }
extern "C" void vendor_kernel_stub() {}
"""
CALLER = r"""
extern "C" const char* probe_issuer(const void* stub);
extern "C" const char* vendor_call(const void* stub);
extern "C" void vendor_kernel_stub();
extern "C" void own_kernel_stub() {}
extern "C" const char* call_direct() { const char* r = probe_issuer(nullptr); return r; }
extern "C" const char* call_through_vendor() { const char* r = vendor_call(nullptr); return r; }
extern "C" const char* call_own_stub() { const char* r = probe_issuer((const void*)&own_kernel_stub); return r; }
extern "C" const char* call_vendor_stub() { const char* r = probe_issuer((const void*)&vendor_kernel_stub); return r; }
"""


def _headers_for_probe():
    import glob
    from pathlib import Path

    for folder in [ln.cupti_include(), *map(Path, sorted(glob.glob("/usr/local/cuda*/include")))]:
        if folder is not None and (folder / "cupti.h").is_file() and (folder / "cuda.h").is_file():
            return folder
    return None


@pytest.mark.slow
def test_the_issuer_of_a_launch_is_found_past_nvidias_images(tmp_path):
    """launches.cpp's `issuer`, compiled into a probe image (standing for the observer) with a fake
    vendor library (named as NVIDIA's are, with a version after .so) and a caller (standing for the
    candidate's extension): the stack walk skips the observer's own frames and the vendor's, and ends
    at the caller; a launch stub in the caller's image names it at once; one in the vendor's is walked."""
    import ctypes
    import shutil
    import sysconfig
    from importlib.resources import files

    import torch
    from torch.utils.cpp_extension import include_paths

    from cuda_agent.judge.launches import issuer_of

    cuda_include = _headers_for_probe()
    if cuda_include is None or shutil.which("g++") is None:
        pytest.skip("no cupti.h/cuda.h or no g++")
    (tmp_path / "launches.cpp").write_text((files("cuda_agent") / "infra" / "launches.cpp").read_text())
    (tmp_path / "probe.cpp").write_text(PROBE)
    (tmp_path / "vendor.cpp").write_text(VENDOR)
    (tmp_path / "caller.cpp").write_text(CALLER)
    includes = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}", f"-I{cuda_include}"]
    rpath = f"-Wl,-rpath,{tmp_path}"

    def cc(*args):
        res = subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O0", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]

    cc("-O2", *includes, "probe.cpp", "-o", "libprobe.so")
    cc("vendor.cpp", "-o", "libcublas.so.99", "-L.", "-l:libprobe.so", rpath)
    cc("caller.cpp", "-o", "fx_caller.so", "-L.", "-l:libprobe.so", "-l:libcublas.so.99", rpath)
    assert torch is not None  # the probe's pybind11 code resolves against this interpreter's libraries
    lib = ctypes.CDLL(str(tmp_path / "fx_caller.so"))
    chains = {}
    for name in ("call_direct", "call_through_vendor", "call_own_stub", "call_vendor_stub"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_char_p
        chains[name] = fn().decode()
    caller = str((tmp_path / "fx_caller.so").resolve())
    assert issuer_of(chains["call_direct"]) == (caller, None), chains
    assert issuer_of(chains["call_through_vendor"]) == (caller, "libcublas.so.99"), chains
    assert chains["call_own_stub"] == caller, chains   # the stub's image, no walk
    assert issuer_of(chains["call_vendor_stub"]).library == caller, chains
    assert "libprobe" not in "".join(chains.values()), chains   # the observer's own frames are skipped
