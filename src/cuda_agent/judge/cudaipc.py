"""GPU memory shared by the judge and one candidate process (CUDA IPC).

Per-call tensors on the CUDA backend live here, never on the host: the judge writes a call's
inputs into the input half and reads the outputs from the output half, both device-to-device.
Moving them through host memory costs tens to hundreds of milliseconds per call for the
gigabyte-sized tensors a memory-bound kernel needs to run for a millisecond, and that cost, with
its jitter, would sit inside the judge's own clock, which must resolve a fraction of a millisecond
to catch a candidate lying about its time.

The judge owns the allocation (plain cudaMalloc, so that it can be exported); the candidate
process maps it once, before any of its code runs. Both sides see it as a flat uint8 tensor.
"""

from __future__ import annotations

import ctypes

import torch

IPC_HANDLE_BYTES = 64
_LAZY_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


class CudaIpcError(RuntimeError):
    pass


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


_RUNTIME: ctypes.CDLL | None = None


def _runtime() -> ctypes.CDLL:
    """The CUDA runtime torch itself loaded (same library, same primary context)."""
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    torch.cuda.init()
    candidates = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rsplit(None, 1)[-1]
            if "/libcudart.so" in path and path not in candidates:
                candidates.append(path)
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
            lib.cudaIpcGetMemHandle  # noqa: B018 - raises AttributeError if absent
        except (OSError, AttributeError):
            continue
        for fn in ("cudaMalloc", "cudaFree", "cudaIpcGetMemHandle", "cudaIpcOpenMemHandle",
                   "cudaIpcCloseMemHandle", "cudaDeviceSynchronize"):
            getattr(lib, fn).restype = ctypes.c_int
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_void_p]
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _Handle, ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        _RUNTIME = lib
        return lib
    raise CudaIpcError("the CUDA runtime library is not loaded in this process")


def _check(code: int, what: str) -> None:
    if code != 0:
        raise CudaIpcError(f"{what} failed with CUDA error {code}")


class _CudaArray:
    """The minimal `__cuda_array_interface__` for torch.as_tensor to wrap a raw device pointer."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


class SharedGpuBuffer:
    """`nbytes` of device memory, created by the judge and opened by the candidate process."""

    def __init__(self, ptr: int, nbytes: int, owner: bool, handle: bytes, lender: "SharedGpuBuffer | None" = None):
        self.ptr, self.nbytes, self.owner, self.handle = ptr, nbytes, owner, handle
        self.lender = lender  # a loan of another buffer's memory (`lend`): closing it frees nothing
        self.tensor = torch.as_tensor(_CudaArray(ptr, nbytes), device="cuda")

    def lend(self) -> "SharedGpuBuffer":
        """The same memory, zeroed (nothing of an earlier borrower's calls is left for the next), as
        a buffer whose `close` leaves it allocated: the owner keeps it for the next borrower."""
        self.tensor.zero_()
        torch.cuda.synchronize()
        return SharedGpuBuffer(self.ptr, self.nbytes, False, self.handle, lender=self)

    @classmethod
    def create(cls, nbytes: int) -> "SharedGpuBuffer":
        lib = _runtime()
        ptr = ctypes.c_void_p()
        _check(lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cudaMalloc")
        handle = _Handle()
        code = lib.cudaIpcGetMemHandle(ctypes.byref(handle), ptr)
        if code != 0:
            lib.cudaFree(ptr)
            _check(code, "cudaIpcGetMemHandle")
        # bytes(handle), not handle.reserved: a c_char array field reads as a string cut at its first NUL
        return cls(ptr.value, nbytes, True, bytes(handle))

    @classmethod
    def open(cls, handle_hex: str, nbytes: int) -> "SharedGpuBuffer":
        raw = bytes.fromhex(handle_hex)
        if len(raw) != IPC_HANDLE_BYTES:
            raise CudaIpcError("bad IPC handle")
        lib = _runtime()
        handle = _Handle()
        ctypes.memmove(ctypes.byref(handle), raw, IPC_HANDLE_BYTES)
        ptr = ctypes.c_void_p()
        _check(lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, _LAZY_PEER_ACCESS), "cudaIpcOpenMemHandle")
        return cls(ptr.value, nbytes, False, raw)

    def close(self) -> None:
        """Owner: free (call only once the other process is gone). Opener: unmap."""
        if self.ptr is None:
            return
        self.tensor = None
        if self.lender is not None:
            self.ptr = None
            return
        lib = _runtime()
        if self.owner:
            lib.cudaDeviceSynchronize()
            lib.cudaFree(ctypes.c_void_p(self.ptr))
        else:
            lib.cudaIpcCloseMemHandle(ctypes.c_void_p(self.ptr))
        self.ptr = None
