"""S3Gen's flow (speech tokens to a mel: the conformer encoder and Turbo's two mean-flow steps, or
Multilingual's ten guided ones with --variant multilingual), the engine against the reference
implementation, side by side on the same machine, weights (tools/chatterbox/weights.py), speech
tokens (10 s by default) and voice (a 10 s prompt, as the reference conditions on at most).
Prints each one's best milliseconds of `--runs` and the engine's time as a fraction of the
reference's.

    .venv/bin/python -m tools.chatterbox.bench_flow --reference-python /tmp/cbref/bin/python \\
        [--threads 2] [--tokens 250] [--prompt-tokens 250] [--weights f32 f16 q8_0] [--device cpu] \\
        [--variant multilingual]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from app.engine.chatterbox import ChatterboxModel, Conditionals
from app.models.convert import chatterbox as convert
from tools.chatterbox import weights
from tools.chatterbox.bench_t3 import run_reference

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-python", required=True, help="python of the reference environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--prompt-tokens", type=int, default=250)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reference-device", default="cpu", help="the reference's torch device: cpu or cuda")
    ap.add_argument("--weights", nargs="*", default=["f32"], choices=["f32", "f16", "q8_0"])
    ap.add_argument("--cache", type=Path, default=REPO / "build" / "test-models")
    ap.add_argument("--variant", choices=["turbo", "multilingual"], default="turbo")
    args = ap.parse_args()
    official = args.cache / "chatterbox"
    weights.write(official, weights.TURBO if args.variant == "turbo" else weights.MULTILINGUAL)
    rng = np.random.default_rng(5)
    inputs = {
        "tokens": rng.integers(0, 6561, args.tokens).astype(np.int32),
        "prompt_tokens": rng.integers(0, 6561, args.prompt_tokens).astype(np.int32),
        "prompt_mel": (rng.standard_normal((80, 2 * args.prompt_tokens)) - 5.0).astype(np.float32),
        "xvector": rng.standard_normal(192).astype(np.float32),
    }
    np.savez(official / "bench_flow.npz", **inputs)
    print(
        f"{os.cpu_count()} CPUs here; {args.threads} threads; {args.tokens} speech tokens ({args.tokens / 25:.0f} s)"
        f" after a prompt of {args.prompt_tokens} ({args.prompt_tokens / 25:.0f} s)"
    )
    reference = run_reference(args.reference_python, "reference_flow", official, threads=args.threads, runs=args.runs,
                              device=args.reference_device, variant=args.variant)  # fmt: skip
    print(f"reference (PyTorch, F32, {args.reference_device}): {reference['ms']:8.0f} ms")
    voice = Conditionals(np.zeros(256), [], inputs["prompt_tokens"], inputs["prompt_mel"], inputs["xvector"])
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.weights:
            path = convert.convert(official / args.variant, Path(tmp) / f"{args.variant}-{kind}.gguf", weights=kind,
                                   variant=args.variant)  # fmt: skip
            times = []
            with ChatterboxModel.open(path, device=args.device, threads=args.threads) as m:
                for _ in range(1 + args.runs):
                    t0 = time.perf_counter()
                    m.decode(inputs["tokens"], voice, seed=1)
                    total = (time.perf_counter() - t0) * 1000
                    stages = m.timings()["stages_ms"]
                    times.append((stages["encoder"] + stages["flow"], total))
            path.unlink()
            best = min(t[0] for t in times[1:])
            print(
                f"engine ({args.device}, {kind.upper():4}):    {best:8.0f} ms  (encoder and flow; with the vocoder"
                f" {min(t[1] for t in times[1:]):.0f} ms)  {best / reference['ms']:.2f}x the reference's time;"
                f" first call {times[0][0]:.0f} ms"
            )


if __name__ == "__main__":
    main()
