"""Startup benchmark: process start to a shown studio window.

Runs ``main.py --quit-when-shown`` (which returns as soon as the window has been
shown) several times and prints the wall time of each run and the median, from
process creation to exit, so interpreter start and imports are included.

    QT_QPA_PLATFORM=offscreen python tools/bench_startup.py [--runs 5] [--warmup 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    times = []
    for i in range(args.warmup + args.runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, str(ROOT / "main.py"), "--quit-when-shown"],
            check=True,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    platform = os.environ.get("QT_QPA_PLATFORM", "default")
    print(
        f"startup to a shown window ({platform} platform, {os.cpu_count()} cores): "
        + ", ".join(f"{t:.0f}" for t in times)
        + f" ms; median {statistics.median(times):.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
