"""Parity of the installed Piper voice with onnxruntime, as numbers.

Synthesizes every sentence of tests/data/sentences.txt with the engine and with
onnxruntime on the same phonemes, noise off, and prints the lowest and mean log-mel
cosine and the largest length difference in frames. tests/test_parity_piper.py
asserts the bound; this prints where a GGUF stands against it:

    VOICESTUDIO_DATA_DIR=/tmp/vs-f16 python tools/parity_piper.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.audio.dsp import log_mel_cosine  # noqa: E402
from app.engine.engine import Engine  # noqa: E402
from tools.devkit.reference import PiperReference  # noqa: E402

HOP = 256


def main() -> int:
    lines = (ROOT / "tests" / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line.strip() for line in lines if line.strip()]
    reference = PiperReference("piper:joe", threads=2)
    cosines, frames = [], []
    with Engine.open("piper:joe", device="cpu", threads=2) as engine:
        for text in sentences:
            ipa = "\n".join(engine.phonemize(text))
            want = np.concatenate([reference.synthesize(line)[0] for line in ipa.split("\n")])
            got = engine.synthesize(phonemes=ipa, noise_scale=0.0, noise_w=0.0)
            cosines.append(log_mel_cosine(got.audio, want, got.sample_rate))
            frames.append(abs(len(got.audio) - len(want)) // HOP)
    print(
        f"{len(sentences)} sentences: min log-mel cosine {min(cosines):.4f}, mean {np.mean(cosines):.4f},"
        f" max length difference {max(frames)} frames"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
