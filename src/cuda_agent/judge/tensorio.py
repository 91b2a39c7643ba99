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


MAX_DEPTH = 8          # containers inside containers (level-3 init inputs nest two or three deep)
MAX_RECORDS = 1 << 16  # records in one value list, all levels together
_SCALARS = (bool, int, float, str, type(None))


def pack(values, view: Region, base: int, limit: int) -> list[dict]:
    """Write `values` at `base`: tensors, JSON scalars (None, bool, int, float, str) and lists,
    tuples and dicts of them, nested up to MAX_DEPTH (dict keys are scalars).

    Returns metadata (plain JSON-like data); tensors are written contiguous, 64-byte aligned.
    `view` None: the metadata only, nothing written (the same layout a later write will have).
    """
    state = {"offset": base, "records": 0}
    return [_pack_one(v, view, base, limit, state, 0) for v in values]


def _pack_one(value, view: Region, base: int, limit: int, state: dict, depth: int) -> dict:
    state["records"] += 1
    if state["records"] > MAX_RECORDS:
        raise TransportError(f"more than {MAX_RECORDS} values to carry")
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu" and view is not None and not isinstance(view, torch.Tensor):
            t = t.cpu()
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        offset = (state["offset"] + 63) // 64 * 64
        if offset + nbytes > base + limit:
            raise TransportError(f"values exceed the {limit >> 20} MiB transport limit")
        if nbytes and isinstance(view, torch.Tensor):
            view[offset: offset + nbytes].copy_(t.reshape(-1).view(torch.uint8))
        elif nbytes and view is not None:
            view[offset: offset + nbytes] = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        state["offset"] = offset + nbytes
        return {"t": "tensor", "dtype": dtype_name(t.dtype), "shape": list(t.shape), "offset": offset,
                "nbytes": nbytes}
    if isinstance(value, _SCALARS):
        return {"t": "scalar", "value": value}
    if isinstance(value, (list, tuple, dict)):
        if depth >= MAX_DEPTH:
            raise TransportError(f"containers nested deeper than {MAX_DEPTH}")
        if isinstance(value, dict):
            keys = list(value)
            if not all(isinstance(k, _SCALARS) for k in keys):
                raise TransportError("dict keys must be None, bool, int, float or str")
            return {"t": "dict", "keys": keys,
                    "items": [_pack_one(value[k], view, base, limit, state, depth + 1) for k in keys]}
        return {"t": "list", "kind": "list" if isinstance(value, list) else "tuple",
                "items": [_pack_one(v, view, base, limit, state, depth + 1) for v in value]}
    raise TransportError(f"unsupported value of type {type(value).__name__}")


def packed_end(meta) -> int:
    """One past the last byte that `pack` wrote for `meta` (0 when it wrote no tensor)."""
    end = 0
    for m in meta:
        if m["t"] == "tensor":
            end = max(end, m["offset"] + m["nbytes"])
        elif m["t"] in ("list", "dict"):
            end = max(end, packed_end(m["items"]))
    return end


def unpack(meta, view: Region, base: int, limit: int, device: str | torch.device = "cpu", *,
           share: bool = False) -> list:
    """Rebuild values from metadata, validating every field (the metadata may be hostile).

    From a tensor region on `device` the tensors are views of the region (no copy). From a host
    memoryview they are private copies, unless `share` (CPU tensors only): then they are views, so
    a write to them shows in the region. Lists come back as lists, tuples as tuples (a "list"
    record without a kind, as older judges wrote it, as a tuple)."""
    return _unpack_list(meta, view, base, limit, device, share, 0, [0])


def _unpack_list(meta, view: Region, base: int, limit: int, device, share: bool, depth: int,
                 count: list[int]) -> list:
    if not isinstance(meta, list) or len(meta) > MAX_RECORDS or depth > MAX_DEPTH:
        raise TransportError("bad value list")
    count[0] += len(meta)
    if count[0] > MAX_RECORDS:
        raise TransportError("bad value list")
    out = []
    for m in meta:
        if not isinstance(m, dict):
            raise TransportError("bad value record")
        kind = m.get("t")
        if kind == "scalar":
            value = m.get("value")
            if not isinstance(value, _SCALARS):
                raise TransportError("bad scalar")
            out.append(value)
        elif kind == "list":
            items = _unpack_list(m.get("items"), view, base, limit, device, share, depth + 1, count)
            seq = m.get("kind", "tuple")
            if seq not in ("list", "tuple"):
                raise TransportError("bad sequence kind")
            out.append(items if seq == "list" else tuple(items))
        elif kind == "dict":
            keys = m.get("keys")
            items = _unpack_list(m.get("items"), view, base, limit, device, share, depth + 1, count)
            if (not isinstance(keys, list) or len(keys) != len(items)
                    or not all(isinstance(k, _SCALARS) for k in keys)):
                raise TransportError("bad dict keys")
            out.append(dict(zip(keys, items)))
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


def _map_tensors(fn, value):
    """`value` with `fn` applied to every tensor in it, through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(fn, v) for k, v in value.items()}
    return value


def moved(t: torch.Tensor, seed: int, delta: float, signs_on: str | torch.device = "cpu") -> torch.Tensor:
    """`t` with each element moved by `delta` relative, up or down as a generator seeded with `seed`
    draws on `signs_on` (the precision probe, compare.PROBE_DELTA). The same seed gives the same
    moves in any process where the signs are drawn on the CPU (the judge and the candidate process
    moving their copies of a parameter alike)."""
    g = torch.Generator(device=signs_on)
    g.manual_seed(seed)
    signs = torch.randint(0, 2, tuple(t.shape), generator=g, device=signs_on, dtype=torch.int8).to(t.device)
    return t * (1.0 + delta * (2 * signs.to(t.dtype) - 1))


def perturbed(inputs: list, seed: int, delta: float) -> list:
    """`inputs` with every floating tensor (nested ones too) moved by `delta` relative, each element
    up or down at random (`seed`, then one more per tensor, signs drawn where the tensor is): the
    second half of a precision-probe pair (compare.PROBE_DELTA). Other values are kept as they are."""
    count = [0]

    def move(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t
        count[0] += 1
        return moved(t, seed + count[0], delta, t.device)

    return [_map_tensors(move, x) for x in inputs]


def move_state(targets: dict, originals: dict, keys: list[str], seed: int | None, delta: float) -> None:
    """The precision probe's move of a model's state: each floating tensor of `targets` named in
    `keys` set to its value in `originals` moved by `moved` (signs from `seed` + the key's position in
    `keys`, drawn on the CPU, so the judge's reference and the candidate process's copies move alike),
    or to that value itself when `seed` is None."""
    with torch.no_grad():
        for n, key in enumerate(keys):
            orig, target = originals.get(key), targets.get(key)
            if orig is None or target is None or not orig.is_floating_point():
                continue
            value = orig if seed is None else moved(orig, seed + n, delta)
            target.copy_(value.to(device=target.device, dtype=target.dtype))


def leaves(value) -> list[torch.Tensor]:
    """Every tensor in `value`, through lists, tuples and dicts."""
    found: list[torch.Tensor] = []
    _map_tensors(found.append, value)
    return found


def snapshot(value):
    """`value` with every tensor in it (containers included) copied: a private copy of outputs that
    are still views of memory the candidate can write."""
    return _map_tensors(torch.Tensor.clone, value)


def staged(value):
    """`value` with every tensor in it (containers included) copied to page-locked host memory,
    contiguous: written later into GPU memory by the copy engines (an H2D copy), with no kernel
    of the writer's CUDA context."""
    return _map_tensors(lambda t: t.detach().to("cpu").contiguous().pin_memory(), value)


def nbytes_of(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size() + 64
        elif isinstance(v, (list, tuple)):
            total += nbytes_of(v)
        elif isinstance(v, dict):
            total += nbytes_of(list(v.values()))
    return total
