"""Write the speech clips that pin the speaker encoder's parity (tests/data/speaker/*.flac).

Run once, then tools/golden_speaker_encoder.py computes the reference embeddings of these
exact files with resemblyzer's own code. The clips are our engine's voices at 16 kHz,
16-bit; regenerating them changes the files, so regenerate the golden values after.

    python tools/make_speaker_clips.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.export import resample  # noqa: E402
from app.engine.engine import Engine  # noqa: E402

OUT = ROOT / "tests" / "data" / "speaker"
CLIPS = {
    "piper_joe": ("piper:joe", "A small boat drifted past the harbour lights. Nobody on the pier looked up."),
    "kokoro_jf_alpha": ("kokoro:jf_alpha", "Please leave the parcel by the green door, and ring the bell twice."),
    "kokoro_jm_kumo": ("kokoro:jm_kumo", "The museum opens at nine, but the garden stays closed until spring."),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (voice, text) in CLIPS.items():
        with Engine.open(voice, device="cpu") as engine:
            take = engine.synthesize(text=text)
        audio = resample(take.audio, take.sample_rate, 16000)
        sf.write(OUT / f"{name}.flac", audio, 16000, subtype="PCM_16")
        print(f"{name}: {len(audio) / 16000:.2f} s")


if __name__ == "__main__":
    main()
