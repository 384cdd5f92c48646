"""Loading: damaged, truncated, foreign and missing files fail with a clear error."""

import gguf
import numpy as np
import pytest

from app.engine.engine import Engine
from app.engine.errors import DeviceError, ModelFileError


def _open(path, **kw):
    return Engine.open("piper:joe", model_path=path, **kw)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="cannot open"):
        _open(tmp_path / "absent.gguf")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelFileError, match="not a GGUF"):
        _open(path)


def test_truncated(tmp_path, joe_path):
    path = tmp_path / "half.gguf"
    data = joe_path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated"):
        _open(path)


def test_damaged_header(tmp_path, joe_path):
    path = tmp_path / "damaged.gguf"
    data = bytearray(joe_path.read_bytes()[:65536])
    data[8:24] = b"\xff" * 16  # tensor and key counts
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError):
        _open(path)


def test_other_architecture(tmp_path):
    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match="architecture 'llama'"):
        _open(path)


def test_unknown_voice():
    with pytest.raises(ModelFileError, match="unknown voice"):
        Engine.open("piper:nobody")


def test_unknown_device(joe_path):
    with pytest.raises(DeviceError, match="unknown device 'warp9'.*cpu"):
        _open(joe_path, device="warp9")


def test_loading_can_be_cancelled(joe_path):
    from app.engine.errors import CancelledError

    with pytest.raises(CancelledError):
        _open(joe_path, progress=lambda fraction: fraction < 0.5)


def test_load_is_fast_and_shares_weights(joe_path):
    with _open(joe_path, device="cpu", threads=1) as a, _open(joe_path, device="cpu", threads=1) as b:
        assert a.load_ms < 1000
        assert a.sample_rate == b.sample_rate == 22050
