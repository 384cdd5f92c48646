"""`synth`: a script (text or phonemes) to a WAV file, a block of sentences at a time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.engine.errors import VoiceStudioError


def read_text(path: Path) -> str:
    """A text file's contents, or a one-line error: too large, unreadable, not UTF-8."""
    from app.engine.engine import MAX_INPUT_CHARS

    size = path.stat().st_size
    if size > 4 * MAX_INPUT_CHARS:
        raise VoiceStudioError(f"{path}: {size:,} bytes; the engine takes at most {MAX_INPUT_CHARS:,} characters")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VoiceStudioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_lines(path: Path) -> list[str]:
    lines = [line.strip() for line in read_text(path).splitlines()]
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


def _pieces(source: str, phonemes: bool) -> list[tuple[str, float | None] | float]:
    """Blocks of text to speak, each with the speed a [speed] tag set for it (None: --speed's),
    and between them the seconds of silence the script's pause tags ask for
    (app.core.script); a malformed tag, or a [voice] tag (synth speaks --voice alone), is an
    error naming it and its line."""
    from app.core.script import say_as_tags, tags

    if phonemes:
        return [(block, None) for block in _blocks(source, True)]
    for tag in say_as_tags(source):
        if tag.problem:
            line = source.count("\n", 0, tag.start) + 1
            raise VoiceStudioError(f"line {line}: {source[tag.start : tag.end]!r}: {tag.problem}")
    pieces: list[tuple[str, float | None] | float] = []
    at, speed = 0, None
    for tag in tags(source):
        line = source.count("\n", 0, tag.start) + 1
        if tag.problem:
            raise VoiceStudioError(f"line {line}: {tag.text(source)!r}: {tag.problem}")
        if tag.kind == "voice":
            raise VoiceStudioError(f"line {line}: {tag.text(source)!r}: synth speaks one voice (--voice); "
                                   "a script of several voices is the studio's")  # fmt: skip
        if source[at : tag.start].strip():
            pieces += [(block, speed) for block in _blocks(source[at : tag.start], False)]
        if tag.kind == "pause":
            pieces.append(tag.seconds)
        else:
            speed = tag.value
        at = tag.end
    if source[at:].strip() or not pieces:
        pieces += [(block, speed) for block in _blocks(source[at:], False)]
    return pieces


def _through_lexicon(block: str, entries: dict[str, str], engine) -> dict:
    """What the engine reads for a block of text: the block itself, its respelling, or (where it
    uses an IPA entry and the voice takes phonemes) its phonemes, a sentence a line."""
    from app.core import lexicon
    from app.core.script import say_as_tags, segment

    if not lexicon.used(block, entries) and not say_as_tags(block):
        return {"text": block}
    if not engine.takes_phonemes:
        return lexicon.engine_input(engine, block, entries)
    lines = []
    for span in segment(block):  # as the studio reads each sentence
        lines += lexicon.phoneme_lines(engine, lexicon.engine_input(engine, span.text(block), entries))
    return {"phonemes": "\n".join(lines)}


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

    from app.audio.wav import CONTAINERS, container_of, encoder_rate, file_subtype, pcm_samples
    from app.core.atomic import atomic_path
    from app.core.export import resample
    from app.engine.errors import NothingToSpeakError
    from app.profiles.voices import open_engine

    if not (math.isfinite(args.speed) and 0.05 <= args.speed <= 20.0):
        raise VoiceStudioError(f"--speed must lie from 0.05 to 20, not {args.speed}")
    if args.out is None and not args.print_phonemes:
        raise VoiceStudioError("--out is required (or --print-phonemes)")
    text = read_text(args.text_file) if args.text_file else args.text
    entries = {}
    if args.lexicon is not None:
        from app.core import lexicon

        try:
            entries = lexicon.read(args.lexicon)
        except lexicon.LexiconError as exc:
            raise VoiceStudioError(str(exc)) from None
    # The container by --out's name (WAV for a pipe or a name without a known extension).
    container = container_of(args.out) if args.out and args.out.suffix.lower() in CONTAINERS else "WAV"
    try:
        kind = file_subtype(container, args.format)
    except ValueError as exc:
        raise VoiceStudioError(str(exc)) from None
    with open_engine(args.voice, device=args.device, threads=args.threads) as engine:
        if args.print_phonemes:
            if text is None:
                raise VoiceStudioError("--print-phonemes needs --text or --text-file")
            print("\n".join(engine.phonemize(text)))
            if args.out is None:
                return 0
        source, is_phonemes = (args.phonemes, True) if args.phonemes is not None else (text, False)
        timings, warnings, samples, device, threads = None, [], 0, engine.device, engine.threads
        if not is_phonemes and (unspoken := engine.unspoken(source)):
            warnings.append(f"not read aloud: {' '.join(unspoken)}")
        rate = encoder_rate(container, engine.sample_rate)  # Opus: 22.05 kHz voices at 24 kHz
        with atomic_path(args.out) as tmp:
            with soundfile.SoundFile(str(tmp), "w", rate, 1, subtype=kind, format=container) as wav:
                for piece in _pieces(source, is_phonemes):
                    if isinstance(piece, float):  # a pause, to the sample
                        silence = np.zeros(int(round(piece * rate)), dtype=np.float32)
                        wav.write(pcm_samples(silence, kind))
                        samples += len(silence)
                        continue
                    block, speed = piece
                    try:
                        take = engine.synthesize(
                            **({"phonemes": block} if is_phonemes else _through_lexicon(block, entries, engine)),
                            noise_scale=args.noise_scale,
                            length_scale=1.0 / (speed or args.speed),
                            noise_w=args.noise_w,
                            seed=args.seed,
                            **{
                                k: getattr(args, k)
                                for k in ("language", "cfg_weight", "exaggeration")
                                if getattr(args, k, None) is not None
                            },
                        )
                    except NothingToSpeakError:
                        continue  # a block of punctuation alone; the script as a whole is judged below
                    audio = np.clip(resample(take.audio, engine.sample_rate, rate), -1.0, 1.0)
                    wav.write(pcm_samples(audio, kind))
                    samples += len(audio)
                    timings = _sum_timings(timings, take.timings)  # first_audio_ms: the first block's
                    warnings += [w for w in take.warnings if w not in warnings]
            if timings is None:
                raise NothingToSpeakError("nothing to speak in the input")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    audio_s = samples / rate
    if args.timings_json:
        rtf = timings["total_ms"] / 1000.0 / max(audio_s, 1e-9)
        report = dict(timings, device=device, threads=threads, audio_s=audio_s, rtf=rtf)
        args.timings_json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"{args.out}: {audio_s:.2f} s of audio in {timings['total_ms']:.0f} ms on {device}")
    return 0


def cmd_revoice(args) -> int:
    import numpy as np
    import soundfile

    from app.core.atomic import atomic_path
    from app.models import manager as models
    from app.profiles import speaker_reference
    from app.profiles.voices import open_engine, speaking_model

    if speaking_model(args.voice) not in models.CHATTERBOX_MODELS:
        raise VoiceStudioError(
            f"re-voicing takes a Chatterbox voice (chatterbox-turbo:default, chatterbox:default, or a clone's "
            f"profile), not '{args.voice}'"
        )
    audio, rate = speaker_reference.load(args.audio)
    with open_engine(args.voice, device=args.device, threads=args.threads) as engine:
        take = engine.revoice(audio, rate, seed=args.seed)
    with atomic_path(args.out) as tmp:
        soundfile.write(str(tmp), np.clip(take.audio, -1.0, 1.0), take.sample_rate, subtype="PCM_16", format="WAV")
    for warning in take.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    seconds = take.audio.size / take.sample_rate
    print(f"{args.out}: {seconds:.2f} s of audio in {take.timings['total_ms']:.0f} ms on {take.device}")
    return 0
