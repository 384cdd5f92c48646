"""Speak text with libespeak-ng's own synthesizer (from the espeakng-loader wheel) into a WAV.

    python tools/espeak_say.py VOICE OUT.wav "text"      # VOICE e.g. en-us+m3, en-gb+f2

Used to make reference recordings that are no stock voice of ours. Runs in its own process:
the engine keeps its own espeak-ng instance for phonemes.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine.espeak import espeak_paths  # noqa: E402

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
CHARS_UTF8 = 1
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def say(voice: str, text: str) -> tuple[np.ndarray, int]:
    library, data = espeak_paths()
    lib = ctypes.CDLL(library)
    rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), 0)
    if rate <= 0:
        raise RuntimeError("espeak-ng did not start")
    chunks: list[np.ndarray] = []

    def collect(wav, n, _events):
        if n > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    callback = CALLBACK(collect)
    lib.espeak_SetSynthCallback(callback)
    if lib.espeak_SetVoiceByName(voice.encode()) != 0:
        raise RuntimeError(f"espeak-ng has no voice '{voice}'")
    raw = text.encode()
    status = lib.espeak_Synth(raw, len(raw) + 1, 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
    if status != 0:
        raise RuntimeError(f"espeak_Synth failed ({status})")
    lib.espeak_Synchronize()
    audio = np.concatenate(chunks).astype(np.float32) / 32768.0 if chunks else np.zeros(0, np.float32)
    return audio, rate


def main() -> None:
    voice, out, text = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    audio, rate = say(voice, text)
    sf.write(out, audio, rate)
    print(f"{out}: {len(audio) / rate:.2f} s at {rate} Hz")


if __name__ == "__main__":
    main()
