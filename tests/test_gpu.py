"""The engine on a GPU backend, where this ggml build has one (skipped elsewhere, as in CI)."""

import numpy as np
import pytest

from app.core.dsp import log_mel_cosine
from app.core.engine import Engine, devices

GPUS = [d["id"] for d in devices() if d["type"] in ("gpu", "igpu")]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPUS, reason="this ggml build reports no GPU")]


@pytest.mark.parametrize("device", GPUS)
def test_gpu_speaks_like_the_cpu_with_every_stage_on_the_device(device, sentences, joe_path):
    with Engine.open("piper:joe", device="cpu", threads=2) as cpu, Engine.open("piper:joe", device=device) as gpu:
        assert gpu.device == device
        for text in sentences[:6]:
            ipa = "\n".join(cpu.phonemize(text))
            want = cpu.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
            got = gpu.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
            # Durations are rounded to frames; another summation order may move one by a frame or two.
            assert abs(len(got.audio) - len(want.audio)) <= 2 * 256, text
            assert np.isfinite(got.audio).all()
            assert log_mel_cosine(got.audio, want.audio, want.sample_rate) >= 0.99, text
        assert gpu.fallback_stages == []
