"""A device against the CPU node by node, on the device's own graphs: which op parts ways.

    python tools/nodes_vs_cpu.py vulkan0 [--voice kokoro:jf_alpha] [--threads 16] [--top 15]

Synthesizes one sentence on the device with node tracing on (EngineDebug.node_trace),
then on the CPU building that device's graphs (EngineDebug.device_graphs and the device's
limits) with the same durations, and compares the two traces node by node. Prints each
graph's largest error, then the nodes where an error appears that their sources do not
have. On CUDA the engine's own kernels are off, so that both runs are ggml graphs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stages_vs_cpu import SENTENCE  # noqa: E402  (this folder, the script's, comes first on the path)

from app.engine.engine import Engine, EngineDebug  # noqa: E402
from tools.devkit import node_trace  # noqa: E402

SENTENCES = {"kokoro": SENTENCE, "piper": "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ."}


def traced(voice: str, device: str, threads: int, path: Path, durations: np.ndarray | None, limits: str = ""):
    """One traced synthesis and the trace; Kokoro's durations, from an untraced one first
    where none are given (Piper's, without noise, come out the same where its graphs agree).
    Both with op profiling on, so every node runs on its own (Mesa's lavapipe crashes on
    whole graphs), and without a prewarm, which this does not need."""
    kokoro = voice.startswith("kokoro")
    ipa = SENTENCES["kokoro" if kokoro else "piper"]
    if kokoro and durations is None:
        with Engine.open(voice, device=device, threads=threads, prewarm=False) as engine:
            engine.set_op_profiling(True)
            engine.synthesize(phonemes=ipa)
            durations = engine.output("durations").reshape(-1).astype(np.int32)
    on_cpu = device == "cpu"
    debug = EngineDebug(node_trace=path, engine_kernels=False, device_graphs=on_cpu, device_limits=limits)
    with Engine.open(voice, device=device, threads=threads, prewarm=False, debug=debug) as engine:
        engine.set_op_profiling(True)
        options = {"durations": durations} if kokoro else {"noise_scale": 0.0, "noise_w": 0.0}
        engine.synthesize(phonemes=ipa, **options)
    return node_trace.read(path), durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device")
    parser.add_argument("--voice", default="kokoro:jf_alpha")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    parser.add_argument("--top", type=int, default=15, help="nodes to list")
    parser.add_argument("--threshold", type=float, default=1e-2, help="error that counts as parting ways")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        got, durations = traced(args.voice, args.device, args.threads, Path(tmp) / "device.txt", None)
        want, _ = traced(args.voice, "cpu", args.threads, Path(tmp) / "cpu.txt", durations, got.limits)

    print(f"{args.voice} on {got.device} (limits {got.limits}) against the CPU building the same graphs")
    diffs, problems = node_trace.compare(got, want)
    for problem in problems:
        print(f"  does not line up: {problem}")
    for graph in got.graphs:
        mine = [d for d in diffs if d.graph is graph]
        if mine:
            worst = max(mine, key=lambda d: d.error)
            print(
                f"  graph {graph.index:3d} {graph.stage:14s} {len(graph.nodes):5d} nodes, largest error "
                f"{worst.error:.3g} ({worst.node.op} #{worst.node.id}), last node {mine[-1].error:.3g}"
            )
    print(f"where the error appears (above {args.threshold:g}, sources at most a tenth of it):")
    for d in node_trace.introduced(diffs, args.threshold)[: args.top]:
        n = d.node
        print(
            f"  graph {d.graph.index} {d.graph.stage}: #{n.id} {n.op} {n.name} {n.type}{list(n.shape)} "
            f"error {d.error:.3g}, sources {d.src_error:.3g}"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
