"""Raw tensor transport: JSON metadata plus bytes in a shared region, no pickle.

The region is either a memoryview (the host DataPlane) or a flat uint8 tensor (GPU memory shared
with cudaipc): tensors are copied into it on their own device, and read back as views of it.
"""

from __future__ import annotations

import math

import torch

DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_DIMS = 16


class TransportError(ValueError):
    """Values that cannot be carried (unsupported type, too large, inconsistent metadata)."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TransportError(f"unsupported dtype {dtype}") from None


Region = "memoryview | torch.Tensor"


def pack(values, view: Region, base: int, limit: int) -> list[dict]:
    """Write `values` (tensors or JSON scalars, possibly nested one level in tuples) at `base`.

    Returns metadata; tensors are written contiguous, 64-byte aligned.
    """
    meta = []
    offset = base
    on_tensor = isinstance(view, torch.Tensor)
    for value in values:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if t.device.type != "cpu" and not on_tensor:
                t = t.cpu()
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            offset = (offset + 63) // 64 * 64
            if offset + nbytes > base + limit:
                raise TransportError(f"values exceed the {limit >> 20} MiB transport limit")
            if nbytes and on_tensor:
                view[offset: offset + nbytes].copy_(t.reshape(-1).view(torch.uint8))
            elif nbytes:
                view[offset: offset + nbytes] = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            meta.append({"t": "tensor", "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                         "offset": offset, "nbytes": nbytes})
            offset += nbytes
        elif isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
            meta.append({"t": "scalar", "value": value})
        elif isinstance(value, (list, tuple)) and all(not isinstance(v, (list, tuple)) for v in value):
            inner = pack(value, view, offset, base + limit - offset)
            meta.append({"t": "list", "items": inner})
            ends = [m["offset"] + m["nbytes"] for m in inner if m["t"] == "tensor"]
            offset = max([offset, *ends])
        else:
            raise TransportError(f"unsupported value of type {type(value).__name__}")
    return meta


def unpack(meta, view: Region, base: int, limit: int, device: str | torch.device = "cpu", *,
           share: bool = False) -> list:
    """Rebuild values from metadata, validating every field (the metadata may be hostile).

    From a tensor region on `device` the tensors are views of the region (no copy). From a host
    memoryview they are private copies, unless `share` (CPU tensors only): then they are views, so
    a write to them shows in the region."""
    if not isinstance(meta, list) or len(meta) > 256:
        raise TransportError("bad value list")
    out = []
    for m in meta:
        if not isinstance(m, dict):
            raise TransportError("bad value record")
        kind = m.get("t")
        if kind == "scalar":
            value = m.get("value")
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise TransportError("bad scalar")
            out.append(value)
        elif kind == "list":
            out.append(tuple(unpack(m.get("items"), view, base, limit, device, share=share)))
        elif kind == "tensor":
            out.append(_tensor(m, view, base, limit, device, share))
        else:
            raise TransportError(f"bad value kind {kind!r}")
    return out


def _tensor(m: dict, view: Region, base: int, limit: int, device, share: bool = False) -> torch.Tensor:
    dtype = DTYPES.get(m.get("dtype"))
    shape = m.get("shape")
    offset, nbytes = m.get("offset"), m.get("nbytes")
    if dtype is None:
        raise TransportError(f"unsupported dtype {m.get('dtype')!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise TransportError("bad shape")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (offset, nbytes)):
        raise TransportError("bad offset")
    element = torch.empty((), dtype=dtype).element_size()
    expected = math.prod(shape) * element
    if nbytes != expected or offset < base or offset + nbytes > base + limit:
        raise TransportError("tensor bytes out of range or inconsistent with its shape")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    if isinstance(view, torch.Tensor):
        t = view[offset: offset + nbytes].view(dtype).reshape(shape)
        return t if t.device == torch.device(device) else t.to(device)
    if share and str(device) == "cpu":
        return torch.frombuffer(view[offset: offset + nbytes], dtype=torch.uint8).view(dtype).reshape(shape)
    flat = torch.frombuffer(bytearray(view[offset: offset + nbytes]), dtype=torch.uint8)
    t = flat.view(dtype).reshape(shape)
    return t.to(device) if str(device) != "cpu" else t


def nbytes_of(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size() + 64
        elif isinstance(v, (list, tuple)):
            total += nbytes_of(v)
    return total
