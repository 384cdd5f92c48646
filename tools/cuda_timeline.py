"""Where a call's wall time goes on a CUDA device, stage by stage: the GPU's busy time against
the host's CUDA calls, from a CUPTI timeline that PyTorch's profiler records.

    python tools/cuda_timeline.py kokoro:jf_alpha cuda0 [--batch 13] [--trace-out trace.json.gz]

Opens the voice and warms it up with two rounds of the sentences of tests/data/sentences.txt,
each round one sentence a call and then all of them in one call (``--batch`` a graph). A
third round runs under ``torch.profiler`` (CUPTI: every kernel, copy and CUDA call of the
process, the engine's too). A stage's window runs from the end of the stage before it to
its own end (the engine's ``on_stage``, marked in the timeline). Prints, per stage, summed
over the one-a-call sentences and then for the batch: the wall time; the GPU's busy time
(kernels, copies and memsets, overlaps counted once) and the rest, when it had nothing to
run; the host's time inside CUDA calls and the calls that took longest; with ``--kernels
N``, the N kernels that took the GPU longest (by name, launches and ms). The profiler makes
every CUDA call slower, so the walls are longer than ``bench``'s: compare trees and stages
under this tool, not with ``bench``. A round's one-a-call sentences come after the batch of the
round before, and after a batch some kept graphs are captured again (ggml's captures in the
round after a batch, none in a round after one a call): the profiled round
counts those instantiations (``cudaGraphInstantiate`` among the generator's calls), which a
``bench`` of sentences alone does not make. Needs PyTorch, which the project does not depend on,
and a CUDA device.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CALLS = ("cuda_runtime", "cuda_driver")


def record(voice: str, device: str, batch: int, trace: Path) -> None:
    """The third round's timeline, as a Chrome trace at `trace`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from app.engine.engine import Engine

    if not torch.cuda.is_available():
        sys.exit("PyTorch sees no CUDA device")
    torch.cuda.init()
    lines = [s for s in (ROOT / "tests/data/sentences.txt").read_text().splitlines() if s.strip()]

    def mark(stage: str, chunk: int, ms: float) -> None:
        del ms
        with record_function(f"end {stage} {chunk}"):
            pass

    def one_round(on_stage=None) -> None:
        for i, text in enumerate(lines):
            with record_function(f"call {i}"):
                e.synthesize(text=text, on_stage=on_stage)
        with record_function("batch"):
            e.synthesize_many(lines, batch=batch, on_stage=on_stage)

    with Engine.open(voice, device=device) as e:
        for _ in range(2):
            one_round()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            one_round(mark)
        prof.export_chrome_trace(str(trace))


def union(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Length of the union of `spans` (sorted by start) within [t0, t1)."""
    total, reach = 0.0, t0
    for a, b in spans:
        a, b = max(a, reach), min(b, t1)
        if b > a:
            total += b - a
            reach = b
    return total


def summarize(events: list[dict]) -> dict[str, dict[str, dict]]:
    """Per kind of call ("one a call", "batch") and stage, summed over its calls: "wall",
    "busy" and "in_calls" (ms), "calls" (name -> [count, ms]) and "kernels" (name ->
    [launches, ms]), from a Chrome trace's complete events."""
    events = [e for e in events if e.get("ph") == "X"]
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_EVENTS)
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    calls = sorted((e for e in events if e.get("cat") in HOST_CALLS), key=lambda e: e["ts"])
    notes = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    ends = [e for e in notes if e["name"].startswith("end ")]

    # Each stage's windows: per call, from the end of the stage before (or the call's start).
    windows: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for call in (e for e in notes if e["name"].startswith("call ") or e["name"] == "batch"):
        kind = "batch" if call["name"] == "batch" else "one a call"
        start, stop = call["ts"], call["ts"] + call["dur"]
        for end in (e for e in ends if start <= e["ts"] <= stop):
            windows[(kind, end["name"].split()[1])].append((start, end["ts"]))
            start = end["ts"]

    table: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for (kind, stage), spans in windows.items():
        by_call: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for e in calls:
            if any(a <= e["ts"] < b for a, b in spans):
                by_call[e["name"]][0] += 1
                by_call[e["name"]][1] += e["dur"] / 1e3
        by_kernel: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for e in kernels:
            if any(a <= e["ts"] < b for a, b in spans):
                by_kernel[e["name"]][0] += 1
                by_kernel[e["name"]][1] += e["dur"] / 1e3
        table[kind][stage] = {
            "wall": sum(b - a for a, b in spans) / 1e3,
            "busy": sum(union(gpu, a, b) for a, b in spans) / 1e3,
            "in_calls": sum(v[1] for v in by_call.values()),
            "calls": dict(by_call),
            "kernels": dict(by_kernel),
        }
    return table


def report(trace: Path, top: int, top_kernels: int = 0) -> None:
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        table = summarize(json.load(f)["traceEvents"])
    for kind in ("one a call", "batch"):
        print(f"== {kind}: ms (wall, GPU busy, GPU idle, in CUDA calls)")
        wall = busy = in_calls = 0.0
        for stage, row in table[kind].items():
            wall, busy, in_calls = wall + row["wall"], busy + row["busy"], in_calls + row["in_calls"]
            idle = row["wall"] - row["busy"]
            print(f"{stage:<13} {row['wall']:8.1f} {row['busy']:8.1f} {idle:8.1f} {row['in_calls']:8.1f}")
            for name, (n, ms) in sorted(row["calls"].items(), key=lambda kv: -kv[1][1])[:top]:
                print(f"    {name:<28} {n:6d} calls {ms:8.2f} ms")
            for name, (n, ms) in sorted(row["kernels"].items(), key=lambda kv: -kv[1][1])[:top_kernels]:
                print(f"      kernel {name[:70]:<70} {n:6d} {ms:8.2f} ms")
        print(f"{'all':<13} {wall:8.1f} {busy:8.1f} {wall - busy:8.1f} {in_calls:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("voice")
    parser.add_argument("device")
    parser.add_argument("--batch", type=int, default=13, help="sentences a graph in the batch call")
    parser.add_argument("--top", type=int, default=3, help="CUDA calls shown for each stage")
    parser.add_argument("--kernels", type=int, default=0, help="kernels shown for each stage")
    parser.add_argument("--trace-out", type=Path, help="keep the Chrome trace here (.json or .json.gz)")
    parser.add_argument("--trace-in", type=Path, help="report on a trace kept before, recording nothing")
    args = parser.parse_args()
    if args.trace_in:
        report(args.trace_in, args.top, args.kernels)
        return
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        record(args.voice, args.device, args.batch, trace)
        report(trace, args.top, args.kernels)
        if args.trace_out:
            if args.trace_out.suffix == ".gz":
                with open(trace, "rb") as src, gzip.open(args.trace_out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(trace, args.trace_out)


if __name__ == "__main__":
    main()
