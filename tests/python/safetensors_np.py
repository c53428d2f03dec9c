#!/usr/bin/python3
"""Minimal safetensors reader/writer built on numpy (no `safetensors` package needed).

Format (see ../../../shared/REFERENCE.md, "safetensors"):
  8 bytes little-endian u64 N, then N bytes of UTF-8 JSON, then the raw data.
  The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
  (offsets relative to the start of the data section, packed without gaps,
  little-endian, row-major) plus an optional "__metadata__" {str: str}.
  The writer pads the JSON with spaces so the data section starts 8-byte aligned and
  writes tensors sorted by name.

Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, BOOL.
BF16 is stored as uint16 bit patterns and converted to/from torch.bfloat16 by a view.

API:
  load(path) -> dict name -> torch.Tensor       (metadata: load_with_metadata)
  save(path, tensors, metadata=None)             (written to a temp name, then renamed)
  load_np(path) -> dict name -> numpy array (BF16 kept as uint16 bits)

Command line: `/usr/bin/python3 safetensors_np.py FILE...` lists the tensors of each file.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import torch
except ImportError:  # numpy-only use is still possible
    torch = None

# safetensors dtype -> (numpy dtype, itemsize)
_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "BOOL": np.dtype("?"),
}

_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


def _torch_maps():
    t2s = {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
    }
    return t2s


def _read_header(buf, path):
    if len(buf) < 8:
        raise SafetensorsError(f"{path}: file too short for a safetensors header")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > _MAX_HEADER or 8 + n > len(buf):
        raise SafetensorsError(f"{path}: header length {n} exceeds file size {len(buf)}")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: bad JSON header: {e}")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    return header, 8 + n


def _parse(buf, path):
    header, start = _read_header(buf, path)
    data_len = len(buf) - start
    meta = header.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise SafetensorsError(f"{path}: entry {name!r} is not an object")
        dt = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if dt not in _NP:
            raise SafetensorsError(f"{path}: tensor {name!r}: unsupported dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs)):
            raise SafetensorsError(f"{path}: tensor {name!r}: bad data_offsets {offs!r}")
        b, e = offs
        if b < 0 or e < b or e > data_len:
            raise SafetensorsError(
                f"{path}: tensor {name!r}: data_offsets [{b}, {e}] out of range "
                f"(data section is {data_len} bytes)")
        nbytes = int(np.prod(shape, dtype=np.int64)) * _NP[dt].itemsize
        if e - b != nbytes:
            raise SafetensorsError(
                f"{path}: tensor {name!r}: {e - b} bytes but {dt} x {shape} needs {nbytes}")
        entries.append((b, e, name, dt, shape))
    entries.sort()
    for (b0, e0, n0, _, _), (b1, e1, n1, _, _) in zip(entries, entries[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{path}: tensors {n0!r} and {n1!r} overlap")
    return entries, start, meta or {}


def load_np(path, with_metadata=False):
    """Read a safetensors file into numpy arrays (BF16 stays as uint16 bit patterns)."""
    with open(path, "rb") as f:
        buf = f.read()
    entries, start, meta = _parse(buf, path)
    out = {}
    dtypes = {}
    for b, e, name, dt, shape in entries:
        arr = np.frombuffer(buf, dtype=_NP[dt], count=(e - b) // _NP[dt].itemsize,
                            offset=start + b).reshape(tuple(shape)).copy()
        out[name] = arr
        dtypes[name] = dt
    if with_metadata:
        return out, meta, dtypes
    return out


def load_with_metadata(path):
    """Read a safetensors file: (dict name -> torch.Tensor, metadata dict)."""
    arrs, meta, dtypes = load_np(path, with_metadata=True)
    out = {}
    for name, a in arrs.items():
        dt = dtypes[name]
        if dt == "BF16":
            out[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        elif dt == "U16":
            # torch 1.13 has no uint16; widen to int32 (values are preserved).
            out[name] = torch.from_numpy(a.astype(np.int32))
        else:
            out[name] = torch.from_numpy(a)
    return out, meta


def load(path):
    """Read a safetensors file into a dict name -> torch.Tensor (CPU)."""
    return load_with_metadata(path)[0]


def _to_np(name, t):
    """Return (safetensors dtype, numpy array little-endian contiguous)."""
    if torch is not None and isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return "BF16", t.view(torch.int16).numpy().view(np.uint16)
        t2s = _torch_maps()
        if t.dtype not in t2s:
            raise SafetensorsError(f"tensor {name!r}: unsupported torch dtype {t.dtype}")
        return t2s[t.dtype], t.numpy()
    a = np.asarray(t)
    for k, v in _NP.items():
        if k == "BF16":
            continue
        if a.dtype.kind == v.kind and a.dtype.itemsize == v.itemsize:
            return k, a
    raise SafetensorsError(f"tensor {name!r}: unsupported numpy dtype {a.dtype}")


def save(path, tensors, metadata=None, dtypes=None):
    """Write dict name -> tensor (torch or numpy) as safetensors, sorted by name.

    dtypes: optional dict name -> safetensors dtype overriding the inferred one; use it to
    write a numpy uint16 array as "BF16" bits or "U16" (numpy uint16 defaults to U16).
    The file is written to PATH.tmp.<pid> and renamed, so no partial file is left.
    """
    dtypes = dtypes or {}
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is not a valid tensor name")
        dt, a = _to_np(name, tensors[name])
        if name in dtypes:
            dt = dtypes[name]
            if _NP[dt].itemsize != a.dtype.itemsize:
                raise SafetensorsError(f"tensor {name!r}: cannot write {a.dtype} as {dt}")
        a = np.asarray(a, order="C").astype(_NP[dt], copy=False)
        raw = a.tobytes()
        header[name] = {"dtype": dt, "shape": [int(d) for d in a.shape],
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(js)))
            f.write(js)
            for raw in blobs:
                f.write(raw)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    ap = argparse.ArgumentParser(description="List the tensors of safetensors files.")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    rc = 0
    for p in args.files:
        try:
            arrs, meta, dts = load_np(p, with_metadata=True)
        except (OSError, SafetensorsError) as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 2
            continue
        print(f"{p}: {len(arrs)} tensors" + (f", metadata {meta}" if meta else ""))
        for n in sorted(arrs):
            print(f"  {n}: {dts[n]} {list(arrs[n].shape)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
