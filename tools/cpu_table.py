"""The CPU table of docs/performance.md: the engine against onnxruntime on the same weights and
phonemes, at 1, 2 and all threads, on a quiet machine and with other processes keeping cores
busy, in one command.

    python tools/cpu_table.py [--busy 2] [--runs 2] [--out table.md] [--isa avx2]

Each row is one `python main.py bench --compare onnxruntime` run in a process of its own
(Piper on the sentences of tests/data/sentences.txt, Kokoro on the first --kokoro-lines of
them; each sentence timed for both runtimes in turn, medians of --runs after --warmup). A
row under load runs with `--busy N`: N processes each spinning a core while both runtimes
run. The table's header names the CPU, the instruction sets the engine's kernels choose
from, and the cores.

--isa avx2 measures a CPU without AVX-512 on one that has it: every run preloads
build/native/libvs-isa-mask.so, which hides AVX-512 (and AVX-VNNI, AMX) from CPUID, so that
onnxruntime, numpy and the engine's kernels take their AVX2 paths, and ggml is the build of
`make ggml-avx2` (AVX2 and FMA, not this CPU's native instructions). The instructions are an
AVX2 CPU's; the cores (their caches, clocks and execution units) are still this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ROOT / "tests" / "data" / "sentences.txt"


def cpu_summary() -> str:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = [
        name for name in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx2", "fma", "asimd") if name in flags
    ]
    return f"{model}; {', '.join(isa) or 'no vector extensions listed'}; {len(os.sched_getaffinity(0))} cores"


def isa_env(isa: str) -> dict[str, str]:
    """The environment of a run on this CPU as it is (""), or as one with AVX2 and FMA alone."""
    if not isa:
        return dict(os.environ)
    mask, ggml = ROOT / "build" / "native" / "libvs-isa-mask.so", ROOT / "build" / "ggml-avx2"
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "cpuid_fault" not in flags:
        sys.exit("--isa avx2 needs CPUID faulting (Linux on x86-64; /proc/cpuinfo lists cpuid_fault)")
    if not mask.exists() or not (ggml / "libggml-cpu.so").exists():
        sys.exit("--isa avx2 needs `make engine ggml-avx2` first")
    return dict(
        os.environ,
        LD_PRELOAD=str(mask),
        LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(ggml), os.environ.get("LD_LIBRARY_PATH", "")])),
        # The C library chose its string functions before the preload: turn its AVX-512 ones off too.
        GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL",
    )


def bench(voice: str, text: Path, threads: int, busy: int, runs: int, warmup: int, env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [
            sys.executable, str(ROOT / "main.py"), "bench", "--voice", voice, "--text-file", str(text),
            "--threads", str(threads), "--runs", str(runs), "--warmup", str(warmup), "--compare", "onnxruntime",
            "--busy", str(busy), "--json-out", str(out),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--voices", nargs="+", default=["piper:joe", "kokoro:jf_alpha"])
    ap.add_argument("--kokoro-lines", type=int, default=4, help="sentences Kokoro speaks (it is slower)")
    ap.add_argument("--busy", type=int, default=2, help="processes that keep a core busy in the loaded rows")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--isa", choices=["", "avx2"], default="", help="emulate a CPU with these instructions alone")
    args = ap.parse_args(argv)
    env = isa_env(args.isa)

    cores = len(os.sched_getaffinity(0))
    threads = sorted({1, min(2, cores), cores})
    lines = SENTENCES.read_text(encoding="utf-8").splitlines()
    rows = [
        f"CPU: {cpu_summary()}."
        + (
            " AVX-512 hidden: AVX2 and FMA alone (--isa avx2), for the engine, ggml and onnxruntime."
            if args.isa
            else ""
        ),
        "",
        "| voice | threads | engine, quiet | onnxruntime, quiet | ratio | "
        f"engine, {args.busy} cores busy | onnxruntime, {args.busy} cores busy | ratio | "
        "engine's slowdown | onnxruntime's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        kokoro_text = Path(tmp) / "kokoro.txt"
        kokoro_text.write_text("\n".join(lines[: args.kokoro_lines]) + "\n", encoding="utf-8")
        for voice in args.voices:
            text = kokoro_text if voice.startswith("kokoro:") else SENTENCES
            for n in threads:
                quiet = bench(voice, text, n, 0, args.runs, args.warmup, env)
                loaded = bench(voice, text, n, args.busy, args.runs, args.warmup, env)
                eq, rq = quiet["total_compute_ms"], quiet["reference"]["total_compute_ms"]
                el, rl = loaded["total_compute_ms"], loaded["reference"]["total_compute_ms"]
                audio = quiet["total_audio_s"]
                rows.append(
                    f"| {voice} ({audio:.1f} s of audio) | {n} | {eq:.0f} ms | {rq:.0f} ms | **{eq / rq:.2f}×** | "
                    f"{el:.0f} ms | {rl:.0f} ms | {el / rl:.2f}× | {el / eq:.2f}× | {rl / rq:.2f}× |"
                )
                print(rows[-1], flush=True)
    table = "\n".join(rows) + "\n"
    print()
    print(table)
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
