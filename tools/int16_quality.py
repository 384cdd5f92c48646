"""The CPU kernels' 16-bit integer convolutions against their float ones (and ggml's ops), on
the same phonemes: log-mel cosine, level and the largest sample difference of each sentence.

    python tools/int16_quality.py [--voice piper:joe] [--lines 12] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.audio.dsp import log_mel_cosine  # noqa: E402
from app.engine.engine import Engine, EngineDebug  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--voice", default="kokoro:jf_alpha")
    ap.add_argument("--lines", type=int, default=6, help="sentences of tests/data/sentences.txt")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    lines = (ROOT / "tests" / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()[: args.lines]
    runs = {
        "int16": EngineDebug(),
        "float": EngineDebug(int16_kernels=False),
        "ggml": EngineDebug(engine_kernels=False),
    }
    audio = {}
    for name, debug in runs.items():
        with Engine.open(args.voice, device="cpu", threads=args.threads, debug=debug) as e:
            noise = {"noise_scale": 0.0, "noise_w": 0.0} if args.voice.startswith("piper:") else {}
            audio[name] = [e.synthesize(phonemes="\n".join(e.phonemize(line)), **noise).audio for line in lines]
            rate = e.sample_rate
    for a, b in (("int16", "float"), ("int16", "ggml"), ("float", "ggml")):
        cos = [log_mel_cosine(x, y, rate) for x, y in zip(audio[a], audio[b], strict=True)]
        level = [float(np.std(x) / np.std(y)) for x, y in zip(audio[a], audio[b], strict=True)]
        worst = [float(np.abs(x - y).max() / np.abs(y).max()) for x, y in zip(audio[a], audio[b], strict=True)]
        print(
            f"{args.voice}, {a} against {b}, {len(lines)} sentences: log-mel cosine {min(cos):.7f} or more, "
            f"level {min(level):.5f}..{max(level):.5f}, largest sample difference {max(worst):.2e} of the peak"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
