"""Reference embeddings of tests/data/speaker/*.flac from resemblyzer's own implementation.

Needs torch and resemblyzer (with librosa and webrtcvad), which the project does not use;
run it in a separate environment:

    python -m venv /tmp/golden
    /tmp/golden/bin/pip install torch==2.13.0 resemblyzer==0.1.4 soundfile "setuptools<81"
    /tmp/golden/bin/python tools/golden_speaker_encoder.py

Writes tests/data/speaker/golden.npz: per clip, ``<clip>.embedding`` (embed_utterance of the
file's samples), ``<clip>.partials`` (the partial embeddings) and ``<clip>.preprocessed``
(embed_utterance after preprocess_wav, i.e. with webrtcvad's silence trimming); for the first
clip also ``<clip>.mel`` (wav_to_mel_spectrogram of the padded clip).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import soundfile as sf

warnings.filterwarnings("ignore")

from resemblyzer import VoiceEncoder, preprocess_wav  # noqa: E402
from resemblyzer.audio import wav_to_mel_spectrogram  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "speaker"


def main() -> None:
    encoder = VoiceEncoder("cpu", verbose=False)
    out = {}
    for i, path in enumerate(sorted(DATA.glob("*.flac"))):
        wav, rate = sf.read(path, dtype="float32")
        assert rate == 16000, path
        embedding, partials, slices = encoder.embed_utterance(wav, return_partials=True)
        out[f"{path.stem}.embedding"] = embedding
        out[f"{path.stem}.partials"] = partials
        out[f"{path.stem}.preprocessed"] = encoder.embed_utterance(preprocess_wav(wav))
        if i == 0:
            stop = slices[-1].stop
            padded = np.pad(wav, (0, stop - len(wav))) if stop >= len(wav) else wav
            out[f"{path.stem}.mel"] = wav_to_mel_spectrogram(padded)
        print(path.name, len(wav) / rate, "s,", len(partials), "partials")
    np.savez_compressed(DATA / "golden.npz", **out)


if __name__ == "__main__":
    main()
