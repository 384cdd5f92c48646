"""Chatterbox's vocoder (HiFT), the engine against the reference implementation, side by side on
the same machine, weights (tools/chatterbox/weights.py) and log-mel (10 s by default). Prints
each one's best milliseconds of `--runs` and the engine's time as a fraction of the reference's.

    .venv/bin/python -m tools.chatterbox.bench_hift --reference-python /tmp/cbref/bin/python \\
        [--threads 2] [--frames 500] [--weights f32 f16] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from app.engine.chatterbox import ChatterboxModel
from app.models.convert import chatterbox as convert
from tools.chatterbox import weights
from tools.chatterbox.bench_t3 import run_reference

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-python", required=True, help="python of the reference environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reference-device", default="cpu", help="the reference's torch device: cpu or cuda")
    ap.add_argument("--weights", nargs="*", default=["f32"], choices=["f32", "f16", "q8_0"])
    ap.add_argument("--cache", type=Path, default=REPO / "build" / "test-models")
    args = ap.parse_args()
    official = args.cache / "chatterbox"
    weights.write(official, weights.TURBO)
    mel = (np.random.default_rng(3).standard_normal((80, args.frames)) * 1.5 - 4.0).astype(np.float32)
    np.save(official / "bench_mel.npy", mel)
    seconds = args.frames / 50
    print(f"{os.cpu_count()} CPUs here; {args.threads} threads; a log-mel of {args.frames} frames ({seconds:.0f} s)")
    reference = run_reference(
        args.reference_python,
        "reference_hift",
        official,
        threads=args.threads,
        frames=args.frames,
        runs=args.runs,
        device=args.reference_device,
    )
    print(f"reference (PyTorch, F32, {args.reference_device}): {reference['ms']:8.0f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.weights:
            path = convert.convert(official / "turbo", Path(tmp) / f"turbo-{kind}.gguf", weights=kind)
            times = []
            with ChatterboxModel.open(path, device=args.device, threads=args.threads) as m:
                for _ in range(1 + args.runs):
                    t0 = time.perf_counter()
                    audio = m.vocode(mel, seed=1)
                    times.append((time.perf_counter() - t0) * 1000)
            path.unlink()
            best = min(times[1:])
            print(
                f"engine ({args.device}, {kind.upper():4}):    {best:8.0f} ms  ({len(audio) / 24000:.1f} s of audio)"
                f"  {best / reference['ms']:.2f}x the reference's time; first call {times[0]:.0f} ms"
            )


if __name__ == "__main__":
    main()
