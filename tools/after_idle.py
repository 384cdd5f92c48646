"""Takes after the studio sits idle: the time a sentence takes warm, then after pauses.

    python tools/after_idle.py kokoro:jf_alpha cuda0 [--pauses 2 11 11] [--takes 3]

Opens the voice with its prewarm, synthesizes one sentence six times (the last three are
the warm times), then for each pause sleeps that many seconds and synthesizes it again
``--takes`` times. Prints each take's compute (``timings["total_ms"]``). ggml's CUDA
backend drops a captured graph that has not run for 10 s, so after a longer pause the kept
graphs run launch by launch once and are captured again on the next take.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.engine import Engine  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("voice")
    ap.add_argument("device")
    ap.add_argument("--pauses", type=float, nargs="+", default=[2.0, 11.0, 11.0], help="seconds idle, in turn")
    ap.add_argument("--takes", type=int, default=3, help="takes after each pause")
    args = ap.parse_args()

    def take(engine: Engine) -> float:
        return engine.synthesize(text=SENTENCE).timings["total_ms"]

    with Engine.open(args.voice, device=args.device, prewarm=True) as engine:
        warm = [take(engine) for _ in range(6)][3:]
        rows = []
        for pause in args.pauses:
            time.sleep(pause)
            rows.append((pause, [take(engine) for _ in range(args.takes)]))
    print(f"{args.voice} on {args.device}, ms a take: warm {' '.join(f'{ms:.1f}' for ms in warm)}")
    for pause, times in rows:
        print(f"  after {pause:g} s idle: {' '.join(f'{ms:.1f}' for ms in times)}")


if __name__ == "__main__":
    main()
