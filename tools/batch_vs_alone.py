"""What the studio's batching buys: a script's sentences one call each, against one call for all.

    python tools/batch_vs_alone.py piper:joe cuda0 [--batch 16] [--rounds 3]

The lines of tests/data/sentences.txt are the script, synthesized as the studio does with
the voice's own noise (seed 1): first each line in its own `synthesize` call, then all of
them through one `synthesize_many` call with `--batch` sentences at a time. The first
round warms the device up; the last one is reported. Prints the wall time of both, and
for each line the length difference in frames and the log-mel cosine of the two takes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.audio.dsp import log_mel_cosine  # noqa: E402
from app.engine.engine import Engine  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("voice")
    ap.add_argument("device")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    lines = [line for line in (ROOT / "tests/data/sentences.txt").read_text(encoding="utf-8").splitlines() if line]
    with Engine.open(args.voice, device=args.device, threads=args.threads) as engine:
        for _ in range(max(1, args.rounds)):
            t0 = time.perf_counter()
            alone = [engine.synthesize(text=line, seed=1) for line in lines]
            t1 = time.perf_counter()
            together = engine.synthesize_many(lines, seed=1, batch=args.batch)
            t2 = time.perf_counter()
        hop = 256 if args.voice.startswith("piper") else 600
        audio_s = sum(t.duration_s for t in alone)
        print(
            f"{args.voice} on {engine.device}: {audio_s:.1f} s of audio; one call a line {1e3 * (t1 - t0):.0f} ms,"
            f" one call for all (batch {args.batch}) {1e3 * (t2 - t1):.0f} ms"
        )
        print("  frames moved:", [(len(b.audio) - len(a.audio)) // hop for a, b in zip(alone, together, strict=True)])
        cosines = [log_mel_cosine(b.audio, a.audio, engine.sample_rate) for a, b in zip(alone, together, strict=True)]
        print("  log-mel cosine:", [round(c, 4) for c in cosines])
    return 0


if __name__ == "__main__":
    sys.exit(main())
