"""Audio files written atomically through libsndfile (soundfile): WAV and FLAC (lossless, in
the sample formats of SUBTYPES; FLAC holds PCM only), MP3 and Opus (lossy, in an Ogg file),
the container chosen by the file name (M4B audiobooks: app.audio.m4b)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.atomic import atomic_path

SUBTYPES = {"pcm16": "PCM_16", "pcm24": "PCM_24", "float": "FLOAT"}
CONTAINERS = {".wav": "WAV", ".flac": "FLAC", ".mp3": "MP3", ".opus": "OGG", ".ogg": "OGG", ".m4b": "M4B"}
# The sample rates the lossy encoders take (MPEG-1 and -2 layer III; Opus).
LOSSY_RATES = {
    "MP3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    "OGG": (8000, 12000, 16000, 24000, 48000),
    "M4B": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),  # AAC (app.audio.m4b)
}


def container_of(path: Path | str) -> str:
    """The container a file name asks for: WAV, FLAC, MP3 or OGG (Opus)."""
    container = CONTAINERS.get(Path(path).suffix.lower())
    if container is None:
        raise ValueError(f"{Path(path).name}: the file name must end in .wav, .flac, .mp3, .opus or .m4b")
    return container


def file_subtype(container: str, subtype: str) -> str:
    """libsndfile's subtype for a container and one of SUBTYPES (the lossy ones have their own)."""
    if subtype not in SUBTYPES:
        raise ValueError(f"sample format must be one of {sorted(SUBTYPES)}")
    if container == "FLAC" and subtype == "float":
        raise ValueError("FLAC holds 16- or 24-bit PCM, not float")
    return {"MP3": "MPEG_LAYER_III", "OGG": "OPUS", "M4B": "AAC"}.get(container, SUBTYPES[subtype])


def encoder_rate(container: str, rate: int) -> int:
    """The rate a container's encoder takes for audio at ``rate``: the same, else the lowest
    it takes above (else its highest)."""
    rates = LOSSY_RATES.get(container)
    if rates is None or rate in rates:
        return rate
    return next((r for r in rates if r > rate), rates[-1])


def write_audio(path: Path | str, audio: np.ndarray, sample_rate: int, *, subtype: str = "pcm16") -> Path:
    """Write mono audio at a rate the file name's container takes (encoder_rate)."""
    import soundfile

    container = container_of(path)
    kind = file_subtype(container, subtype)
    if encoder_rate(container, sample_rate) != sample_rate:
        raise ValueError(f"{container} takes {sample_rate} Hz audio at {encoder_rate(container, sample_rate)} Hz")
    samples = pcm_samples(np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0), kind)
    with atomic_path(path) as tmp:
        soundfile.write(str(tmp), samples, sample_rate, subtype=kind, format=container)
    return Path(path)


def pcm_samples(audio: np.ndarray, kind: str) -> np.ndarray:
    """Audio in [-1, 1] as the integers a PCM subtype stores (rounded to the nearest step, full
    scale 2^15 or 2^23), so that every container holds the same ones (libsndfile scales floats
    to FLAC's integers otherwise than to WAV's); floats for the other subtypes."""
    bits = {"PCM_16": 16, "PCM_24": 24}.get(kind)
    if bits is None:
        return audio
    top = 1 << (bits - 1)
    steps = np.clip(np.rint(audio.astype(np.float64) * top), -top, top - 1)
    return steps.astype(np.int16) if bits == 16 else (steps.astype(np.int32) << 8)  # 24 bits in the top of 32


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    return data, rate
