"""What the prewarm buys: open a voice with and without it, then time the first takes.

    python tools/first_take.py kokoro:jf_alpha cuda0 [--runs 3]

Each run is a new process (so the device's runtime starts cold, as when the studio
starts): it opens the voice without the prewarm or with it, synthesizes the same sentence
three times, and reports the time to open, the first take's compute and the third's. One
run first, not counted, puts the model file in the page cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.engine import Engine  # noqa: E402

SENTENCE = "The first take after opening should be as quick as every other one."


def one_run(voice: str, device: str, prewarm: bool) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    with Engine.open(voice, device=device, prewarm=prewarm) as engine:
        open_ms = (time.perf_counter() - t0) * 1e3
        takes = [engine.synthesize(text=SENTENCE).timings["total_ms"] for _ in range(3)]
    return open_ms, takes[0], takes[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one", choices=["off", "on"], help=argparse.SUPPRESS)  # a run, in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.voice, args.device, args.one == "on")))
        return 0

    def fresh(prewarm: bool) -> tuple[float, float, float]:
        cmd = [sys.executable, __file__, args.voice, args.device, "--one", "on" if prewarm else "off"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return tuple(json.loads(out.strip().splitlines()[-1]))

    fresh(False)  # the model file in the page cache
    for prewarm in (False, True):
        rows = [fresh(prewarm) for _ in range(args.runs)]
        open_ms, first, third = (statistics.median(col) for col in zip(*rows, strict=True))
        print(
            f"{args.voice} on {args.device}, prewarm {'on ' if prewarm else 'off'}: open {open_ms:.0f} ms,"
            f" first take {first:.1f} ms, third take {third:.1f} ms (medians of {args.runs})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
