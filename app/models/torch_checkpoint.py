"""Read a PyTorch checkpoint's tensors without torch.

Handles the legacy (pre-1.6, non-zip) serialization that `resemblyzer`'s pretrained.pt
uses: a magic number, the protocol version and the system info, each a pickle; then the
object, whose tensors are `torch._utils._rebuild_tensor_v2` calls over storages named by
persistent ids; then the storage keys in order, each storage stored as an int64 element
count and its raw little-endian data. And the zip serialization of torch.save since 1.6
(Chatterbox's conds.pt): the object's pickle in `<name>/data.pkl`, each storage's raw data
in `<name>/data/<key>`. Only the classes a state dict needs are allowed, so a checkpoint
cannot run code while it is read.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = 0x1950A86A20F9469CFC6C
PROTOCOL = 1001

_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class CheckpointError(ValueError):
    pass


@dataclass
class _StorageType:
    dtype: type


@dataclass
class _Storage:
    key: str
    dtype: type


@dataclass
class _TensorRef:
    storage: _Storage
    offset: int
    size: tuple
    stride: tuple


def _ints(v) -> bool:
    return isinstance(v, tuple) and all(isinstance(n, int) for n in v)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, *_):
    if not (isinstance(storage, _Storage) and isinstance(offset, int) and _ints(size) and _ints(stride)):
        raise CheckpointError("a tensor is not a storage, an offset, a size and a stride")
    return _TensorRef(storage, offset, size, stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _DTYPES:
            return _StorageType(_DTYPES[name])
        raise CheckpointError(f"the checkpoint needs {module}.{name}, which a state dict never does")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise CheckpointError(f"unknown persistent id {pid!r}")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise CheckpointError(f"unknown storage type {storage_type!r}")
        return _Storage(key, storage_type.dtype)


MAX_MEMO = 1 << 20  # a state dict's pickle memoizes a few objects a tensor


def _read_pickle(f: io.BytesIO):
    """The next pickle of ``f``, read by the restricted unpickler once its opcodes are checked
    without running them: CPython's unpickler grows its memo to any index a PUT names (one
    byte of a damaged file can ask for gigabytes)."""
    start = f.tell()
    for opcode, arg, _ in pickletools.genops(f):
        if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and not 0 <= int(arg) < MAX_MEMO:
            raise CheckpointError(f"a pickle memoizes at index {arg}")
    f.seek(start)
    return _Unpickler(f).load()


def _materialize(obj, storages: dict[str, np.ndarray]):
    if isinstance(obj, _TensorRef):
        data = storages.get(obj.storage.key)
        if data is None:
            raise CheckpointError(f"a tensor's storage {obj.storage.key!r} is not in the file")
        item = data.itemsize
        if len(obj.size) != len(obj.stride) or any(not isinstance(v, int) or v < 0 for v in obj.size + obj.stride):
            raise CheckpointError("a tensor has a malformed size or stride")
        last = obj.offset + sum((s - 1) * st for s, st in zip(obj.size, obj.stride, strict=True))
        if obj.offset < 0 or (0 not in obj.size and last >= len(data)):
            raise CheckpointError("a tensor reaches past its storage")
        if np.prod(obj.size, dtype=np.float64) > len(data):  # a state dict's tensors repeat no storage
            raise CheckpointError(f"a tensor of shape {obj.size} is larger than its storage")
        view = np.lib.stride_tricks.as_strided(
            data[obj.offset :], shape=obj.size, strides=[s * item for s in obj.stride], writeable=False
        )
        return np.array(view)  # a copy: contiguous and independent of the file's buffer
    if isinstance(obj, dict):
        return type(obj)((k, _materialize(v, storages)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_materialize(v, storages) for v in obj)
    return obj


def _collect_dtypes(obj, dtypes: dict[str, type]) -> None:
    if isinstance(obj, _TensorRef):
        dtypes[obj.storage.key] = obj.storage.dtype
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_dtypes(v, dtypes)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _collect_dtypes(v, dtypes)


_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError, KeyError,
                  MemoryError, RecursionError, OverflowError)  # fmt: skip


def _load_zip(path: Path, raw: bytes):
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise CheckpointError(f"{path.name}: a zip file that is no PyTorch checkpoint")
            prefix = pickles[0][: -len("data.pkl")]
            if prefix + "byteorder" in z.namelist() and z.read(prefix + "byteorder") != b"little":
                raise CheckpointError(f"{path.name}: not a little-endian PyTorch checkpoint")
            obj = _read_pickle(io.BytesIO(z.read(pickles[0])))
            dtypes: dict[str, type] = {}
            _collect_dtypes(obj, dtypes)
            storages = {}
            for key, dtype in dtypes.items():
                data = z.read(f"{prefix}data/{key}")
                if len(data) % np.dtype(dtype).itemsize:
                    raise CheckpointError(f"{path.name}: storage {key} is not whole values")
                storages[key] = np.frombuffer(data, dtype=dtype)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, *_PICKLE_ERRORS) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path.name}: damaged checkpoint ({exc})") from exc
    return _materialize(obj, storages)


def load(path: Path | str):
    """The checkpoint's object with every tensor as a NumPy array."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"PK":
        return _load_zip(Path(path), raw)
    f = io.BytesIO(raw)
    try:  # every pickle through the restricted unpickler: none of them may run code
        if _read_pickle(f) != MAGIC or _read_pickle(f) != PROTOCOL:
            raise CheckpointError(f"{Path(path).name}: not a legacy PyTorch checkpoint")
        info = _read_pickle(f)
        if not isinstance(info, dict) or not info.get("little_endian", True):
            raise CheckpointError(f"{Path(path).name}: not a little-endian legacy PyTorch checkpoint")
        obj = _read_pickle(f)
        keys = _read_pickle(f)
        if not isinstance(keys, list):
            raise CheckpointError(f"{Path(path).name}: damaged checkpoint (no storage keys)")
    except _PICKLE_ERRORS as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{Path(path).name}: damaged checkpoint ({exc})") from exc
    dtypes: dict[str, type] = {}
    _collect_dtypes(obj, dtypes)
    storages: dict[str, np.ndarray] = {}
    for key in keys:
        header = f.read(8)
        if len(header) != 8:
            raise CheckpointError(f"{Path(path).name}: truncated at storage {key}")
        (count,) = struct.unpack("<q", header)
        dtype = np.dtype(dtypes.get(str(key), np.float32))
        if not 0 <= count <= (len(raw) - f.tell()) // dtype.itemsize:
            raise CheckpointError(f"{Path(path).name}: storage {key} claims {count} values, past the file's end")
        data = f.read(count * dtype.itemsize)
        if len(data) != count * dtype.itemsize:
            raise CheckpointError(f"{Path(path).name}: truncated in storage {key}")
        storages[str(key)] = np.frombuffer(data, dtype=dtype)
    return _materialize(obj, storages)


class TorchStateFile:
    """A checkpoint holding a state dict (as ``torch.save(module.state_dict())`` writes it), with
    SafetensorsFile's reading interface: ``names``, ``shape``, ``in``, ``tensor``."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        state = load(self.path)
        if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
            raise CheckpointError(f"{self.path.name}: not a state dict of tensors")
        self._tensors = {str(k): v for k, v in state.items()}

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        return self._tensors[name]
