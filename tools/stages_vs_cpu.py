"""Kokoro on a device against the CPU, stage by stage: where the two part ways.

    python tools/stages_vs_cpu.py cuda0 [--voice kokoro:jf_alpha] [--threads 16]

Synthesizes one sentence on the CPU, then on the device with the CPU's durations (so both
have the same frames), and prints for each named intermediate (BERT, duration logits, F0,
N, text encoder, decoder, harmonics) the largest difference against the largest value
and how many values are not finite on the device; then the audio's log-mel cosine.
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

STAGES = ("bert", "duration_logits", "F0", "N", "text_encoder", "decoder", "har")
SENTENCE = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ."  # espeak-ng's, as the GPU tests give it


def run(voice: str, device: str, threads: int, durations: np.ndarray | None):
    with Engine.open(voice, device=device, threads=threads) as engine:
        take = engine.synthesize(phonemes=SENTENCE, durations=durations)
        outputs = {name: engine.output(name) for name in (*STAGES, "durations")}
        return take, outputs, engine.fallback_stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device")
    parser.add_argument("--voice", default="kokoro:jf_alpha")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    args = parser.parse_args()
    want, ref, _ = run(args.voice, "cpu", args.threads, None)
    durations = ref["durations"].reshape(-1).astype(np.int32)
    got, out, fallbacks = run(args.voice, args.device, args.threads, durations)
    print(f"{args.voice} on {args.device} against the CPU (stages on the CPU instead: {fallbacks or 'none'})")
    for name in STAGES:
        a, b = ref[name], out[name]
        if a.shape != b.shape:
            print(f"  {name:16s} shapes differ: {a.shape} on the CPU, {b.shape} on {args.device}")
            continue
        bad = int(np.count_nonzero(~np.isfinite(b)))
        diff = float(np.nanmax(np.abs(a - b))) if bad < b.size else float("nan")
        print(f"  {name:16s} largest difference {diff:.4g} of {float(np.abs(a).max()):.4g}, {bad} not finite")
    cosine = log_mel_cosine(got.audio, want.audio, want.sample_rate)
    print(f"  audio            log-mel cosine {cosine:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
