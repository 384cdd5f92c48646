"""GPU time by kernel for one call, timed by Nsight Compute (ncu).

    python tools/kernel_profile.py kokoro:jf_alpha cuda0 [--batch 13] [--top 25]

Opens the voice and makes two calls of the sentences of tests/data/sentences.txt (as
phonemes, ``--batch`` sentences a graph), then a third between cuProfilerStart and
cuProfilerStop. The tool runs itself under ``ncu --profile-from-start off --metrics
gpu__time_duration.sum``, so every kernel of that third call is timed, one at a time and
at the clocks ncu locks: their sum is the call's GPU work, not its wall time, and the
shares are what to compare. Prints the sum, its parts (the engine's own CUDA kernels,
GEMMs, the rest of ggml's kernels) and the costliest kernels. Needs ncu on PATH and a
CUDA device.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GEMM = re.compile(r"nvjet|gemm|cutlass|xmma", re.IGNORECASE)


def child(voice: str, device: str, batch: int) -> None:
    import ctypes

    from app.core.engine import Engine

    cuda = ctypes.CDLL("libcuda.so.1")
    lines = [s for s in (ROOT / "tests/data/sentences.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    with Engine.open(voice, device=device) as engine:
        ipa = "\n".join(p for line in lines for p in engine.phonemize(line))
        for _ in range(2):
            engine.synthesize(phonemes=ipa, batch=batch)
        cuda.cuProfilerStart()
        engine.synthesize(phonemes=ipa, batch=batch)
        cuda.cuProfilerStop()


def kernel_times(lines: list[str]) -> list[tuple[str, float]]:
    """(kernel name, ns) for each row of ncu's --csv report among other output lines."""
    header, rows = None, []
    for row in csv.reader(line for line in lines if line.startswith('"')):
        if header is None:
            header = row if "Kernel Name" in row else None
            continue
        if len(row) == len(header) and row[header.index("Metric Name")] == "gpu__time_duration.sum":
            rows.append((row[header.index("Kernel Name")], float(row[header.index("Metric Value")].replace(",", ""))))
    return rows


def short(name: str) -> str:
    """A kernel's function name, without its parameters."""
    name = name.split("(")[0]
    return name.removeprefix("void ")


def part(name: str) -> str:
    if "vs::" in name:
        return "the engine's CUDA kernels"
    return "GEMMs (cuBLAS)" if GEMM.search(name) else "ggml's other kernels"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--batch", type=int, default=13)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the profiled process
    args = parser.parse_args()
    if args.child:
        child(args.voice, args.device, args.batch)
        return 0
    ncu = shutil.which("ncu")
    if not ncu:
        print("kernel_profile: ncu (Nsight Compute) is not on PATH", file=sys.stderr)
        return 2
    cmd = [ncu, "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base"]
    cmd += [sys.executable, __file__, args.voice, args.device, "--batch", str(args.batch), "--child"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    times = kernel_times(run.stdout.splitlines())
    if run.returncode != 0 or not times:
        print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
        print(f"kernel_profile: ncu exited {run.returncode} with {len(times)} kernels timed", file=sys.stderr)
        return 1
    total = sum(ns for _, ns in times)
    print(f"{args.voice} on {args.device}, batch {args.batch}: {total / 1e6:.2f} ms in {len(times)} kernels")
    for title, key in (("parts", part), ("kernels", short)):
        ns, count = collections.defaultdict(float), collections.Counter()
        for name, t in times:
            k = key(name)
            ns[k] += t
            count[k] += 1
        print(f"  {title}:")
        for name, t in sorted(ns.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {t / 1e6:8.2f} ms {100 * t / total:5.1f}% {count[name]:6d}  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
