"""The GE2E speaker encoder's weights, read from resemblyzer's checkpoint without torch."""

import pickle
import sys

import numpy as np
import pytest

from app.models import manager as models
from app.models import torch_checkpoint


@pytest.fixture(scope="module")
def weights():
    return models.speaker_encoder_weights()


def test_state_dict_has_the_encoder_in_pytorch_shapes(weights):
    assert "torch" not in sys.modules
    for layer, inputs in ((0, 40), (1, 256), (2, 256)):
        assert weights[f"lstm.weight_ih_l{layer}"].shape == (1024, inputs)
        assert weights[f"lstm.weight_hh_l{layer}"].shape == (1024, 256)
        assert weights[f"lstm.bias_ih_l{layer}"].shape == (1024,)
        assert weights[f"lstm.bias_hh_l{layer}"].shape == (1024,)
    assert weights["linear.weight"].shape == (256, 256) and weights["linear.bias"].shape == (256,)
    # The LSTM's tensors share one flattened storage at different offsets: they must differ.
    assert not np.array_equal(weights["lstm.weight_hh_l1"], weights["lstm.weight_hh_l2"])
    for name, value in weights.items():
        assert value.dtype == np.float32 and np.all(np.isfinite(value)), name
        assert 0.0 < np.abs(value).mean() < 1.0, name


def test_damaged_or_hostile_checkpoints_are_refused(tmp_path):
    (tmp_path / "short.pt").write_bytes(b"\x80\x02")
    with pytest.raises(torch_checkpoint.CheckpointError):
        torch_checkpoint.load(tmp_path / "short.pt")
    # A pickle that would run a command: its class is refused before anything runs.
    hostile = b"".join(pickle.dumps(x, protocol=2) for x in (torch_checkpoint.MAGIC, torch_checkpoint.PROTOCOL, {}))
    hostile += b"cos\nsystem\n(S'echo owned'\ntR."
    (tmp_path / "hostile.pt").write_bytes(hostile)
    with pytest.raises(torch_checkpoint.CheckpointError, match="os.system"):
        torch_checkpoint.load(tmp_path / "hostile.pt")
