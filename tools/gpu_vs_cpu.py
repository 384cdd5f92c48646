"""A voice on a GPU against the CPU: timings per stage, first audio, and how alike the audio is.

    python tools/gpu_vs_cpu.py kokoro:jf_alpha cuda0 [--threads 16]

Synthesizes the 12 sentences of tests/data/sentences.txt on each device (one warm-up,
then the median of 3 runs), prints compute time, RTF, audio seconds per second, the
median time to first audio, per-stage sums, the stages that fell back to the CPU, and
the lowest log-mel cosine between the two devices' audio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.audio.dsp import log_mel_cosine  # noqa: E402
from app.engine.engine import Engine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    args = parser.parse_args()
    lines = (ROOT / "tests" / "data" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line.strip() for line in lines if line.strip()]
    results = {}
    for device in (args.device, "cpu"):
        with Engine.open(args.voice, device=device, threads=args.threads) as engine:
            ipa = ["\n".join(engine.phonemize(s)) for s in sentences]
            [engine.synthesize(phonemes=p, noise_scale=0.0, noise_w=0.0) for p in ipa]  # warm-up
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                takes = [engine.synthesize(phonemes=p, noise_scale=0.0, noise_w=0.0) for p in ipa]
                runs.append((time.perf_counter() - t0) * 1e3)
            stages = {k: sum(t.timings["stages_ms"][k] for t in takes) for k in engine.stages}
            first = statistics.median(t.timings["first_audio_ms"] for t in takes)
            results[device] = (takes, statistics.median(runs), stages, first, engine.fallback_stages)
    audio_s = sum(t.duration_s for t in results["cpu"][0])
    for device, (_, ms, stages, first, fallback) in results.items():
        per_stage = ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
        print(
            f"{device}: {ms:.0f} ms for {audio_s:.2f} s of audio, RTF {ms / 1e3 / audio_s:.4f},"
            f" {audio_s / ms * 1e3:.0f} audio-s/s, first audio {first:.1f} ms; {per_stage}; on the CPU: {fallback}"
        )
    pairs = list(zip(results[args.device][0], results["cpu"][0], strict=True))
    cosines = [log_mel_cosine(a.audio, b.audio, a.sample_rate) for a, b in pairs]
    frames = max(abs(len(a.audio) - len(b.audio)) for a, b in pairs)
    print(f"{args.device} vs cpu: lowest log-mel cosine {min(cosines):.4f}, largest length difference {frames} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
