"""Chatterbox-Turbo's token model, the engine against the reference implementation, side by side
on the same machine, weights (tools/chatterbox/weights.py) and inputs: the prompt and text
through the model, then a fixed number of speech tokens one at a time (the repetition penalty,
then the most likely token, so that both make the same tokens). Prints each run's milliseconds
and the engine's time as a fraction of the reference's: the reference's best run; the engine's
first sentence on a new context, and its next sentence in the same voice, whose conditioning
the engine keeps in its cache (the reference computes it again each time).

    .venv/bin/python -m tools.chatterbox.bench_t3 --reference-python /tmp/cbref/bin/python \\
        [--threads 2] [--tokens 200] [--weights f16 q8_0] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from app.engine.chatterbox import ChatterboxModel, Conditionals
from app.models.convert import chatterbox as convert
from tools.chatterbox import weights

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "chatterbox" / "golden_turbo.npz"


def run_reference(python: str, module: str, official: Path, **options) -> dict:
    """The JSON line tools.chatterbox.<module> prints, run by the reference environment's python."""
    cmd = [python, "-m", f"tools.chatterbox.{module}", "--weights", str(official)]
    for key, value in options.items():
        cmd += [f"--{key}", str(value)]
    ref = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if ref.returncode:
        sys.exit(f"the reference failed:\n{ref.stderr[-2000:]}")
    return json.loads(ref.stdout.strip().splitlines()[-1])


def engine_ms(path: Path, device: str, threads: int, tokens: int, runs: int, variant: str = "turbo") -> dict:
    """The first call on a new context, and the best of the next ``runs`` in the same voice
    (whose conditioning the context's cache keeps). Multilingual: the reference's draws as
    reference_t3 makes them (the most likely token after its penalty; guidance and exaggeration
    as golden_multilingual.npz's)."""
    if variant == "multilingual":
        g = {k[4:]: v for k, v in np.load(GOLDEN.with_name("golden_multilingual.npz")).items() if k.startswith("mtl_")}
        options = {"exaggeration": float(g["exaggeration"]), "cfg_weight": float(g["cfg_weight"])}
        options |= {"repetition_penalty": 2.0, "min_p": 0.05, "top_p": 1.0}
    else:
        g, options = np.load(GOLDEN), {}
    voice = Conditionals(g["speaker_emb"], g["prompt_tokens"])
    times = []
    with ChatterboxModel.open(path, device=device, threads=threads) as t3:
        for _ in range(1 + runs):
            t0 = time.perf_counter()
            out = t3.generate(g["text_tokens"], voice, max_tokens=tokens, temperature=0, **options)
            times.append((time.perf_counter() - t0) * 1000)
    return {"first_ms": times[0], "next_ms": min(times[1:]), "tokens": len(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-python", required=True, help="python of the reference environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reference-device", default="cpu", help="the reference's torch device: cpu or cuda")
    ap.add_argument("--weights", nargs="*", default=["f16", "q8_0"], choices=["f32", "f16", "q8_0"])
    ap.add_argument("--cache", type=Path, default=REPO / "build" / "test-models")
    ap.add_argument("--variant", choices=["turbo", "multilingual"], default="turbo")
    args = ap.parse_args()
    official = args.cache / "chatterbox"
    weights.write(official, weights.TURBO if args.variant == "turbo" else weights.MULTILINGUAL)
    print(f"{os.cpu_count()} CPUs here; {args.threads} threads; {args.tokens} speech tokens after the prompt and text")

    reference = run_reference(
        args.reference_python, "reference_t3", official, threads=args.threads, tokens=args.tokens, runs=args.runs,
        device=args.reference_device, variant=args.variant,
    )  # fmt: skip
    print(
        f"reference (PyTorch, F32, {args.reference_device}): {reference['total_ms']:8.0f} ms"
        f"  ({reference['tokens']} tokens)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.weights:
            path = convert.convert(official / args.variant, Path(tmp) / f"{args.variant}-{kind}.gguf", weights=kind,
                                   variant=args.variant)  # fmt: skip
            ours = engine_ms(path, args.device, args.threads, args.tokens, args.runs, args.variant)
            path.unlink()
            first, later = ours["first_ms"] / reference["total_ms"], ours["next_ms"] / reference["total_ms"]
            print(
                f"engine ({args.device}, {kind.upper():4}):    {ours['first_ms']:8.0f} ms  ({ours['tokens']} tokens)"
                f"  {first:.2f}x the reference's time; the next sentence in that voice {ours['next_ms']:.0f} ms,"
                f" {later:.2f}x"
            )


if __name__ == "__main__":
    main()
