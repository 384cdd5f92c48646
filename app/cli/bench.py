"""`bench`: the engine timed on a script, per stage, against onnxruntime when asked."""

from __future__ import annotations

import json
import os
import resource
import statistics
import time

from app.cli.synth import read_lines
from app.engine.errors import VoiceStudioError


def _peak_rss_mb() -> float:
    """This process's peak resident set. Linux: VmHWM, which starts afresh at exec (ru_maxrss
    carries the peak of the process that forked us, e.g. a large test runner)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _BusyCores:
    """N processes that each keep a core busy (a pure-Python spin, as a browser tab or a build
    would), from entry to exit: the benchmark then measures the engine and onnxruntime on a loaded
    machine."""

    def __init__(self, n: int):
        if n < 0:
            raise VoiceStudioError(f"--busy takes 0 or more processes, not {n}")
        self.n, self.procs = n, []

    def __enter__(self) -> _BusyCores:
        import subprocess
        import sys

        for _ in range(self.n):
            spin = [sys.executable, "-c", "while True: pass"]
            quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            self.procs.append(subprocess.Popen(spin, **quiet))
        time.sleep(0.2 if self.n else 0.0)  # each on a core before the first timed run
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def cmd_bench(args) -> int:
    with _BusyCores(args.busy):
        return _bench(args)


def _bench(args) -> int:
    from app.engine.engine import STAGES_BY_FAMILY
    from app.profiles.voices import open_engine

    phonemes_input = args.phonemes_file is not None
    items = read_lines(args.phonemes_file or args.text_file)
    if not items:
        raise VoiceStudioError("the input file has no lines")
    rss_before_engine = _peak_rss_mb()  # the interpreter and the app's imports
    engine = open_engine(args.voice, device=args.device, threads=args.threads, workers=args.workers)
    with engine:
        # Chatterbox reads text (its comparison with the reference: tools/chatterbox/bench_*.py).
        chatterbox = engine.stages == STAGES_BY_FAMILY["chatterbox"]
        if chatterbox and (phonemes_input or args.compare or args.streams > 1):
            raise VoiceStudioError("Chatterbox is benchmarked on text, one call a line, without --compare")
        if args.stream_tokens and not chatterbox:
            raise VoiceStudioError("--stream-tokens streams Chatterbox's speech tokens; other voices have none")

        def synthesize(item: str):
            if chatterbox:  # the same seed each run: the same tokens, so runs compare
                options = {"language": args.language} if args.language else {}
                options["batch"] = args.batch
                if args.stream_tokens:
                    options["stream_tokens"] = args.stream_tokens
                return engine.synthesize(text=item, seed=0, **options)
            return engine.synthesize(phonemes=item, noise_scale=0.0, noise_w=0.0, batch=args.batch)

        # Both runtimes get identical phonemes: text is phonemized once, up front.
        ipa = items if phonemes_input or chatterbox else ["\n".join(engine.phonemize(t)) for t in items]
        if args.batch > 1:  # each call takes `batch` sentences (a line can hold several), synthesized together
            sentences = [s for item in ipa for s in item.split("\n")]
            ipa = ["\n".join(sentences[i : i + args.batch]) for i in range(0, len(sentences), args.batch)]
        results = []
        for i, item in enumerate(ipa):
            runs = []
            for r in range(args.warmup + args.runs):
                take = synthesize(item)
                if r >= args.warmup:
                    runs.append(take)
            compute = [t.timings["total_ms"] - t.timings["stages_ms"].get("phonemize", 0.0) for t in runs]
            results.append(
                {
                    "index": i,
                    "phonemes": item,
                    "compute_ms": statistics.median(compute),
                    "first_audio_ms": statistics.median(t.timings["first_audio_ms"] for t in runs),
                    "audio_s": runs[0].duration_s,
                    "stages_ms": {s: statistics.median(t.timings["stages_ms"][s] for t in runs) for s in engine.stages},
                    # On CUDA, graphs are kept between calls: the repeated runs reuse them.
                    "graphs_built": statistics.median(t.timings["graphs_built"] for t in runs),
                    "graphs_reused": statistics.median(t.timings["graphs_reused"] for t in runs),
                    # On CUDA, a sentence's residual stacks captured by an earlier run and replayed.
                    "captures_replayed": statistics.median(t.timings["captures_replayed"] for t in runs),
                    "workers_ms": [
                        statistics.median(w) for w in zip(*(t.timings["workers_ms"] for t in runs), strict=True)
                    ],
                }
            )
        profile = None
        if args.profile_ops:
            engine.set_op_profiling(True)
            for item in ipa:
                synthesize(item)
            engine.set_op_profiling(False)
            profile = engine.op_profile()
        device, threads, workers, load_ms = engine.device, engine.threads, engine.workers, engine.load_ms
        prewarm_ms, fallback = engine.prewarm_ms, {s: ops for s, ops in engine.fallback_ops.items() if ops}
    report = {
        "voice": args.voice,
        "device": device,
        "threads": threads,
        "batch": args.batch,
        "workers": workers,
        "runs": args.runs,
        "warmup": args.warmup,
        "busy": args.busy,  # processes that kept a core busy throughout (engine and reference alike)
        "load_ms": load_ms,
        "prewarm_ms": prewarm_ms,
        "fallback_ops": fallback,  # per stage, ops the device could not run (empty: all on it)
        "peak_rss_mb": _peak_rss_mb(),
        "engine_rss_mb": _peak_rss_mb() - rss_before_engine,  # what the engine added to the peak
        "items": results,
        "total_compute_ms": sum(r["compute_ms"] for r in results),
        "total_audio_s": sum(r["audio_s"] for r in results),
    }
    report["rtf"] = report["total_compute_ms"] / 1000.0 / report["total_audio_s"]
    report["audio_s_per_s"] = 1.0 / report["rtf"]
    report["first_audio_ms_median"] = statistics.median(r["first_audio_ms"] for r in results)
    if profile is not None:
        report["op_profile"] = profile
    if args.streams > 1:
        report["streams"] = _bench_streams(args, ipa)
    if args.compare == "onnxruntime":
        report["reference"] = _bench_reference(args, ipa, results, device)
        report["ratio"] = report["total_compute_ms"] / report["reference"]["total_compute_ms"]
    args.json_out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    line = f"{device} x{threads}" + (f", {workers} workers" if workers > 1 else "")
    line += f", {args.busy} busy processes" if args.busy else ""
    line += f": {report['total_compute_ms']:.0f} ms for {report['total_audio_s']:.2f} s of audio"
    line += f" (RTF {report['rtf']:.3f}, load {load_ms:.0f} ms, peak RSS {report['peak_rss_mb']:.0f} MB"
    line += f", {report['engine_rss_mb']:.0f} MB of it the engine's)"
    line += f"; {report['audio_s_per_s']:.1f} audio-s/s, first audio {report['first_audio_ms_median']:.1f} ms (median)"
    if "ratio" in report:
        ref = report["reference"]
        line += f"; onnxruntime {ref['version']} ({ref['providers'][0]}) {ref['total_compute_ms']:.0f} ms"
        line += f"; ratio {report['ratio']:.2f}"
    print(line)
    stages = sorted({s for r in results for s in r["stages_ms"]}, key=list(results[0]["stages_ms"]).index)
    overlap = " (each the workers' together: they overlap)" if workers > 1 else ""
    print("  " + ", ".join(f"{s} {sum(r['stages_ms'][s] for r in results):.0f} ms" for s in stages) + overlap)
    if workers > 1:  # how evenly the batches were divided, and what the calls spent outside the workers
        busy = [sum(r["workers_ms"][w] for r in results) for w in range(workers)]
        print("  each worker's runs: " + ", ".join(f"{ms:.0f}" for ms in busy) + " ms")
    built, reused = (sum(r[k] for r in results) for k in ("graphs_built", "graphs_reused"))
    if reused:
        print(f"  graphs a run: {built:.0f} built, {reused:.0f} kept from an earlier run of the same shapes")
    if replayed := sum(r["captures_replayed"] for r in results):
        print(f"  the engine's kernels a run: {replayed:.0f} captured sequences replayed")
    for stage, ops in fallback.items():
        print(f"  on the CPU instead of {device}: {stage}: {', '.join(ops)}")
    if "streams" in report:
        st = report["streams"]
        print(
            f"  {st['n']} engines at once: {st['wall_ms']:.0f} ms for {st['audio_s']:.2f} s of audio"
            f" (median of {st['runs']}); {st['audio_s_per_s']:.1f} audio-s/s together"
        )
    if profile is not None:
        print("  costliest ops (each node timed alone, launch and sync included):")
        for row in profile[:15]:
            print(f"    {row['stage']:<13} {row['op']:<18} {row['count']:>6} nodes {row['ms']:9.1f} ms")
    return 0


def _bench_streams(args, ipa: list[str]) -> dict:
    """N engines, a thread each, all synthesizing every line at once: wall time and audio per second."""
    import threading

    from app.profiles.voices import open_engine

    def one_run(engines: list) -> tuple[float, float]:
        start = threading.Barrier(len(engines) + 1)
        audio = [0.0] * len(engines)
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                start.wait()
                for item in ipa:
                    take = engines[k].synthesize(phonemes=item, noise_scale=0.0, noise_w=0.0, batch=args.batch)
                    audio[k] += take.duration_s
            except BaseException as e:  # raised below, once every thread is done
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(engines))]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall_ms = (time.perf_counter() - t0) * 1000.0
        if errors:
            raise errors[0]
        return wall_ms, sum(audio)

    engines = [
        open_engine(args.voice, device=args.device, threads=args.threads, workers=args.workers)
        for _ in range(args.streams)
    ]
    try:
        timed = [one_run(engines) for _ in range(args.warmup + args.runs)][args.warmup :]
    finally:
        for e in engines:
            e.close()
    wall_ms = statistics.median(w for w, _ in timed)
    audio_s = timed[0][1]
    return {
        "n": args.streams,
        "runs": args.runs,
        "wall_ms": wall_ms,
        "audio_s": audio_s,
        "audio_s_per_s": audio_s / (wall_ms / 1000.0),
    }


def _bench_reference(args, ipa: list[str], ours: list[dict], device: str) -> dict:
    from app.models import manager as models
    from tools.devkit.reference import KokoroReference, PiperReference

    threads = args.threads if args.threads > 0 else len(os.sched_getaffinity(0))
    # The engine on a CUDA device is compared with onnxruntime's CUDA provider.
    device = "cuda" if device.startswith("cuda") else "cpu"
    if models.is_kokoro(args.voice):
        kokoro, style = KokoroReference(threads=threads, device=device), models.style_name(args.voice)
        if models.is_kokoro_hub(args.voice):  # a catalogue voice's pack, beside the packaged ones
            style = args.voice.split(":", 1)[1]
            kokoro.voices[style] = models.kokoro_pack(args.voice)[:, None, :]
        ref, synthesize = kokoro, lambda line: kokoro.synthesize(line, style)[:2]
    else:
        ref = PiperReference(args.voice, threads=threads, device=device)
        synthesize = ref.synthesize
    items = []
    for item, mine in zip(ipa, ours, strict=True):
        times, audio = [], None
        for r in range(args.warmup + args.runs):
            # One sentence a line: the reference runs each line as its own utterance, as the engine does.
            chunks = [synthesize(line) for line in item.split("\n") if line.strip()]
            if r >= args.warmup:
                times.append(sum(ms for _, ms in chunks))
                audio = sum(len(a) for a, _ in chunks)
        items.append(
            {"index": mine["index"], "compute_ms": statistics.median(times), "audio_s": audio / ref.sample_rate}
        )
    total = sum(i["compute_ms"] for i in items)
    import onnxruntime

    ort_version = onnxruntime.__version__
    return {
        "runtime": "onnxruntime",
        "version": ort_version,
        "providers": ref.session.get_providers(),
        "threads": threads,
        "load_ms": ref.load_ms,
        "items": items,
        "total_compute_ms": total,
        "total_audio_s": sum(i["audio_s"] for i in items),
    }
