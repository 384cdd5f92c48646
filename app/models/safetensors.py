"""Reading safetensors files with numpy: the header, and each tensor as a view of the mapped file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # widened to float32 by tensor()
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsError(ValueError):
    pass


class SafetensorsFile:
    """A safetensors file mapped read-only; ``tensor(name)`` gives its values (BF16 as float32)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"'{self.path}' is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                raise SafetensorsError(f"'{self.path}' is not a safetensors file (header of {n} bytes)")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SafetensorsError(f"'{self.path}' is not a safetensors file ({e})") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"'{self.path}' is not a safetensors file (its header is no table)")
        self.metadata = header.pop("__metadata__", {}) or {}
        self._start = 8 + n
        self._entries = header
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if size > self._start else np.zeros(0, np.uint8)
        for name, e in header.items():
            try:
                dtype, shape, (b, end) = e["dtype"], tuple(int(d) for d in e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise SafetensorsError(f"'{self.path}': tensor '{name}' has a malformed entry") from None
            if dtype not in _DTYPES:
                raise SafetensorsError(f"'{self.path}': tensor '{name}' has dtype {dtype}, which is not read here")
            count = int(np.prod(shape, dtype=np.int64))
            if end - b != count * np.dtype(_DTYPES[dtype]).itemsize or b < 0 or self._start + end > size:
                raise SafetensorsError(f"'{self.path}': tensor '{name}' lies outside the file or has the wrong size")

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def tensor(self, name: str) -> np.ndarray:
        e = self._entries[name]
        b, end = e["data_offsets"]
        raw = self._data[self._start + b : self._start + end]
        values = raw.view(_DTYPES[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return values
