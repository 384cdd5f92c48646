"""What a sentence the engine has not seen costs: each of six sentences of other lengths
synthesized once, then all of them again, in one process after the prewarm.

    python tools/new_sentences.py kokoro:jf_alpha cuda0

A GPU library may spend time on the first call of each new matrix shape (cuBLAS picks a
kernel for it), and on CUDA the engine keeps each stage's graphs by their (rounded)
shapes for the next sentence of those shapes; `bench` repeats the same sentences after a
warm-up, so it shows neither cost. Prints each sentence's compute time (ms) the first and
the second time, and how many of its graphs were built and how many kept ones it reused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.engine import Engine  # noqa: E402

SENTENCES = [
    "The first take after opening should be as quick as every other one.",
    "Tomorrow the train leaves early, so pack your bags tonight.",
    "She sells sea shells by the sea shore.",
    "A completely different sentence with its own length and its own shapes, to see what a new one costs.",
    "Short one.",
    "The first take after opening should be as quick as every other one.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    args = parser.parse_args()
    with Engine.open(args.voice, device=args.device) as engine:
        passes = [[engine.synthesize(text=s).timings for s in SENTENCES] for _ in range(2)]
    for name, timings in zip(("first time", "again"), passes, strict=True):
        times = ", ".join(f"{t['total_ms']:.1f}" for t in timings)
        graphs = ", ".join(f"{t['graphs_built']}/{t['graphs_reused']}" for t in timings)
        print(f"{args.voice} on {args.device}, {name}: {times} ms; graphs built/reused {graphs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
