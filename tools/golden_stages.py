"""Record (or check) every named stage output of both voices on the CPU, so that a change
that is meant to move code without changing behaviour can be held to it.

    python tools/golden_stages.py            # check against tests/data/golden_stages.npz
    python tools/golden_stages.py --write    # record it anew (after a change meant to alter output)

For each voice (piper:joe, kokoro:jf_alpha) and a sentence with a clause break, with the noise
off and 2 threads: the audio, and each intermediate the engine names (``Engine.output``;
the last chunk's). The check prints, per output, whether it is bit-identical and else the
largest difference relative to its peak; tests/test_golden_stages.py asserts the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "data" / "golden_stages.npz"
VOICES = {
    "piper:joe": ("m_p", "logs_p", "logw", "z"),
    "kokoro:jf_alpha": ("bert", "duration_logits", "durations", "F0", "N", "text_encoder", "decoder", "har"),
}
SENTENCES = ("Is it ready, or shall we wait a minute?",)


SIMD_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "amx_tile", "neon", "asimd", "sve")  # fmt: skip


def cpu_signature() -> str:
    """The SIMD extensions this CPU has that ggml's kernels choose between: where they
    differ from the recording machine's, sums run in another order."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return "unknown"
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags |= set(line.split(":", 1)[1].split())
    return " ".join(f for f in SIMD_FLAGS if f in flags)


def record() -> dict[str, np.ndarray]:
    """Every output, keyed "<voice>/<sentence index>/<name>"."""
    from app.engine.engine import Engine

    out = {}
    for voice, names in VOICES.items():
        with Engine.open(voice, device="cpu", threads=2) as engine:
            for i, text in enumerate(SENTENCES):
                take = engine.synthesize(text=text, noise_scale=0.0, noise_w=0.0)
                out[f"{voice}/{i}/audio"] = np.asarray(take.audio, dtype=np.float32).copy()
                for name in names:
                    out[f"{voice}/{i}/{name}"] = engine.output(name).copy()
    return out


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> list[tuple[str, str, float]]:
    """(key, "identical" | "differs" | "shape" | "missing", largest difference / peak) for each output."""
    rows = []
    for key in sorted(want):
        if key not in got:
            rows.append((key, "missing", float("inf")))
        elif got[key].shape != want[key].shape:
            rows.append((key, "shape", float("inf")))
        elif np.array_equal(got[key], want[key]):
            rows.append((key, "identical", 0.0))
        else:
            peak = max(float(np.abs(want[key]).max()), 1e-12)
            rows.append((key, "differs", float(np.abs(got[key] - want[key]).max()) / peak))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"record {GOLDEN.relative_to(ROOT)} anew")
    args = parser.parse_args()
    got = record()
    if args.write:
        np.savez_compressed(GOLDEN, cpu=np.array(cpu_signature()), **got)
        print(f"wrote {GOLDEN.relative_to(ROOT)}: {len(got)} outputs, {GOLDEN.stat().st_size:,} bytes")
        return 0
    with np.load(GOLDEN) as npz:
        want = {k: npz[k] for k in npz.files if k != "cpu"}
        print(f"recorded on a CPU with: {npz['cpu']}; this one has: {cpu_signature()}")
    rows = compare(got, want)
    for key, state, rel in rows:
        print(f"{key:<40} {state:<9} {rel:.3g}")
    identical = sum(state == "identical" for _, state, _ in rows)
    print(
        f"{identical} of {len(rows)} outputs bit-identical; largest difference {max(r for *_, r in rows):.3g} of peak"
    )
    return 0 if all(state in ("identical", "differs") for _, state, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
