"""WAV files: written atomically through libsndfile (soundfile)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path

SUBTYPES = {"pcm16": "PCM_16", "pcm24": "PCM_24", "float": "FLOAT"}


def write_wav(path: Path | str, audio: np.ndarray, sample_rate: int, *, subtype: str = "pcm16") -> Path:
    import soundfile

    if subtype not in SUBTYPES:
        raise ValueError(f"subtype must be one of {sorted(SUBTYPES)}")
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    with atomic_path(path) as tmp:
        soundfile.write(str(tmp), samples, sample_rate, subtype=SUBTYPES[subtype], format="WAV")
    return Path(path)


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    return data, rate
