"""Parity of the installed Kokoro with onnxruntime's int8 export, stage by stage.

(a) With the export's durations forced into the engine: the cosine of every named
stage against the export's intermediate, and the audio's log-mel cosine. (b) Free
running, for each stock voice: length difference and log-mel cosine. Prints the
worst and mean over the sentences of tests/data/sentences.txt; tests/test_kokoro.py
asserts the bounds:

    python tools/parity_kokoro.py [--voices all]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.audio.dsp import log_mel_cosine  # noqa: E402
from app.engine.engine import Engine  # noqa: E402
from app.models import manager as models  # noqa: E402
from tools.devkit.reference import KOKORO_STAGES, KokoroReference, kokoro_bert_float  # noqa: E402


def cosine(a, b) -> float:
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def forced(engine: Engine, ref: KokoroReference, phonemes: str, voice: str) -> dict[str, float]:
    """Stage cosines of one sentence with the export's durations forced."""
    want_audio, _, want = ref.synthesize(phonemes, voice)
    take = engine.synthesize(phonemes=phonemes, durations=want["durations"])
    out = {name: cosine(engine.output(name), want[name]) for name in KOKORO_STAGES if name != "har"}
    tokens = [0, *ref.ids(phonemes), 0]
    out["bert (float)"] = cosine(engine.output("bert"), kokoro_bert_float(models.kokoro_path(), tokens))
    out["audio log-mel"] = log_mel_cosine(take.audio, want_audio, take.sample_rate)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voices", default="jf_alpha", help="'all' or comma-separated voice packs (free running)")
    args = parser.parse_args()
    lines = (ROOT / "tests" / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line.strip() for line in lines if line.strip()]
    voices = list(models.KOKORO_VOICES) if args.voices == "all" else args.voices.split(",")
    ref = KokoroReference(threads=2, stages=True)
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as engine:
        ipa = [engine.phonemize(text) for text in sentences]
        stages: dict[str, list[float]] = {}
        for lines_ in ipa:
            for line in lines_:
                for name, value in forced(engine, ref, line, "jf_alpha").items():
                    stages.setdefault(name, []).append(value)
        print(f"(a) durations forced, {sum(len(x) for x in ipa)} sentences, voice jf_alpha:")
        for name, values in stages.items():
            print(f"    {name:<16} min {min(values):.5f}  mean {np.mean(values):.5f}")
    print("(b) free running:")
    for voice in voices:
        with Engine.open(f"kokoro:{voice}", device="cpu", threads=2) as engine:
            lengths, cosines, total = [], [], [0, 0]
            for lines_ in ipa:
                want = np.concatenate([ref.synthesize(line, voice)[0] for line in lines_])
                got = engine.synthesize(phonemes="\n".join(lines_)).audio
                lengths.append(abs(len(got) - len(want)) / len(want))
                total[0], total[1] = total[0] + len(got), total[1] + len(want)
                cosines.append(log_mel_cosine(got, want, 24000))
        print(
            f"    {voice:<14} length diff max {max(lengths):.2%}, in total {abs(total[0] - total[1]) / total[1]:.2%}"
            f"  log-mel min {min(cosines):.4f}"
            f" mean {np.mean(cosines):.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
