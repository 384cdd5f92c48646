"""What the prewarm buys: open a voice with and without it, then time the first takes.

    python tools/first_take.py kokoro:jf_alpha cuda0 [--runs 3] [--workers 4]

Each run is a new process (so the device's runtime starts cold, as when the studio
starts): it opens the voice without the prewarm or with it, synthesizes the same sentence
three times, and reports the time to open, the first take's compute (and each stage's
part of it) and the third's, and the device memory the open engine holds (the device's
free memory before opening less after the takes). One run first, not counted, puts the
model file in the page cache. With ``--workers N`` the engine opens N workers (contexts a
batch is divided between).
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

from app.engine.engine import Engine, devices  # noqa: E402

SENTENCE = "The first take after opening should be as quick as every other one."


def _free_mib(device: str) -> float:
    return next(d["memory_free"] for d in devices() if d["id"] == device) / 2**20


def one_run(voice: str, device: str, prewarm: bool, workers: int) -> tuple[float, float, float, float, dict]:
    free = _free_mib(device)
    t0 = time.perf_counter()
    with Engine.open(voice, device=device, prewarm=prewarm, workers=workers) as engine:
        open_ms = (time.perf_counter() - t0) * 1e3
        takes = [engine.synthesize(text=SENTENCE).timings for _ in range(3)]
        held = free - _free_mib(device)
    return open_ms, takes[0]["total_ms"], takes[2]["total_ms"], held, takes[0]["stages_ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--one", choices=["off", "on"], help=argparse.SUPPRESS)  # a run, in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.voice, args.device, args.one == "on", args.workers)))
        return 0

    def fresh(prewarm: bool) -> tuple[float, ...]:
        cmd = [sys.executable, __file__, args.voice, args.device, "--one", "on" if prewarm else "off"]
        cmd += ["--workers", str(args.workers)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return tuple(json.loads(out.strip().splitlines()[-1]))

    fresh(False)  # the model file in the page cache
    for prewarm in (False, True):
        rows = [fresh(prewarm) for _ in range(args.runs)]
        open_ms, first, third, held = (statistics.median(row[i] for row in rows) for i in range(4))
        stages = {name: statistics.median(row[4][name] for row in rows) for name in rows[0][4]}
        print(
            f"{args.voice} on {args.device}, {args.workers} worker(s), prewarm {'on ' if prewarm else 'off'}:"
            f" open {open_ms:.0f} ms, first take {first:.1f} ms, third take {third:.1f} ms,"
            f" device memory held {held:.0f} MiB (medians of {args.runs})"
        )
        print("  first take by stage: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in stages.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
