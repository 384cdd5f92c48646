"""GPU time by kernel for one call, timed by Nsight Compute (ncu).

    python tools/kernel_profile.py kokoro:jf_alpha cuda0 [--batch 13] [--top 25]

Opens the voice and makes two calls of the sentences of tests/data/sentences.txt (as
phonemes, ``--batch`` sentences a graph), then a third between cuProfilerStart and
cuProfilerStop. At the end of each stage (the engine's ``on_stage``) the child launches an
empty kernel named for the stage, loaded from PTX through the driver: a stage's kernels are
those since the mark before its own. The tool runs itself under ``ncu --profile-from-start
off --metrics gpu__time_duration.sum``, so every kernel of that third call is timed, one at
a time and at the clocks ncu locks: their sum is the call's GPU work, not its wall time,
and the shares are what to compare. Prints the sum, its parts (the engine's own CUDA
kernels, GEMMs, the rest of ggml's kernels), the stages and the costliest kernels. With
``--as-run`` ncu neither flushes the caches before each kernel nor locks the clocks, so a
small kernel counts about as long as it runs among the others. Needs ncu on PATH and a
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
MARK = "vs_stage_end_"  # the marks' names: this, then the stage's


class StageMarks:
    """An on_stage callback that launches an empty kernel ``MARK + stage`` through the driver
    API, in the device's primary context (the one the engine's runtime API calls use)."""

    def __init__(self, ordinal: int) -> None:
        import ctypes

        self.ct = ctypes
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.context = ctypes.c_void_p()
        check(self.cuda.cuInit(0), "cuInit")
        check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), ordinal), "cuDevicePrimaryCtxRetain")
        self.functions: dict[str, object] = {}

    def __call__(self, stage: str, chunk: int, ms: float) -> None:
        del chunk, ms
        ct = self.ct
        check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        if stage not in self.functions:  # its module, loaded in the engine's context
            ptx = f".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry {MARK}{stage}()\n{{\nret;\n}}\n"
            module, fn = ct.c_void_p(), ct.c_void_p()
            check(self.cuda.cuModuleLoadData(ct.byref(module), ct.c_char_p(ptx.encode())), "cuModuleLoadData")
            check(self.cuda.cuModuleGetFunction(ct.byref(fn), module, (MARK + stage).encode()), "cuModuleGetFunction")
            self.functions[stage] = fn
        null = ct.c_void_p()
        check(self.cuda.cuLaunchKernel(self.functions[stage], 1, 1, 1, 1, 1, 1, 0, null, null, null), "cuLaunchKernel")


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: CUDA driver error {status}")


def child(voice: str, device: str, batch: int) -> None:
    from app.engine.engine import Engine

    lines = [s for s in (ROOT / "tests/data/sentences.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    with Engine.open(voice, device=device) as engine:
        ipa = "\n".join(p for line in lines for p in engine.phonemize(line))
        marks = StageMarks(int(device.removeprefix("cuda") or 0))
        for _ in range(2):
            engine.synthesize(phonemes=ipa, batch=batch, on_stage=marks)
        marks.cuda.cuProfilerStart()
        engine.synthesize(phonemes=ipa, batch=batch, on_stage=marks)
        marks.cuda.cuProfilerStop()


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


def report(title: str, rows: list[tuple[str, float]], total: float, top: int) -> None:
    """Rows (key, ns) summed by key, the largest `top` printed with their share of `total`."""
    ns, count = collections.defaultdict(float), collections.Counter()
    for key, t in rows:
        ns[key] += t
        count[key] += 1
    print(f"  {title}:")
    for key, t in sorted(ns.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {t / 1e6:8.2f} ms {100 * t / total:5.1f}% {count[key]:6d}  {key[:90]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--batch", type=int, default=13)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--stage-top", type=int, default=8, help="kernels shown for each stage")
    parser.add_argument(
        "--as-run",
        action="store_true",
        help="time each kernel at the clocks it runs at and with warm caches (ncu's --cache-control none"
        " --clock-control none) rather than ncu's locked clocks and flushed caches",
    )
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
    if args.as_run:
        cmd += ["--cache-control", "none", "--clock-control", "none"]
    cmd += [sys.executable, __file__, args.voice, args.device, "--batch", str(args.batch), "--child"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    times = kernel_times(run.stdout.splitlines())
    if run.returncode != 0 or not times:
        print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
        print(f"kernel_profile: ncu exited {run.returncode} with {len(times)} kernels timed", file=sys.stderr)
        return 1
    marked, pending = [], []  # (stage, kernel, ns): a kernel's stage is the next mark's
    for name, t in times:
        if short(name).startswith(MARK):
            marked += [(short(name).removeprefix(MARK), n, ns) for n, ns in pending]
            pending = []
        else:
            pending.append((name, t))
    times = marked + [("(after the last stage)", n, ns) for n, ns in pending]
    total = sum(t for _, _, t in times)
    how = "as run (warm caches, free clocks)" if args.as_run else "at ncu's clocks, caches flushed"
    print(f"{args.voice} on {args.device}, batch {args.batch}: {total / 1e6:.2f} ms in {len(times)} kernels, {how}")
    report("parts", [(part(name), t) for _, name, t in times], total, args.top)
    report("stages", [(stage, t) for stage, _, t in times], total, args.top)
    for stage in dict.fromkeys(stage for stage, _, _ in times):
        report(f"{stage}'s kernels", [(short(name), t) for s, name, t in times if s == stage], total, args.stage_top)
    report("kernels", [(short(name), t) for _, name, t in times], total, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
