"""Fuzz what Voice Studio reads from outside, with mutations of valid seeds from a seeded
generator (a run is reproducible).

    python tools/fuzz.py [--seconds S] [--seed K] [TARGET ...]

Native targets (native/tests/fuzz-engine): the GGUF loader and each architecture's checks
(``gguf-piper``, ``gguf-kokoro``, ``gguf-ge2e``), and the text front end, phonemes and text
to the ids of bounded chunks (``phonemes-piper``, ``phonemes-kokoro``, ``text-piper``,
``text-kokoro``). Python targets: the importers of profile files (``profile-import``),
project files (``project-open``), legacy PyTorch checkpoints (``checkpoint``) and the
settings file (``settings``); each may refuse an input only with its own error, and must
leave nothing behind. A target that crashes, or raises anything else, fails the run and
leaves its input in ``fuzz-crash-input`` (the current folder).

``make test`` runs each target for a few seconds, ``make fuzz`` for ten minutes.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DRIVER = ROOT / "build" / "native" / "fuzz-engine"
CRASH_INPUT = Path("fuzz-crash-input")


def native_targets() -> dict[str, list[str]]:
    from app.engine.espeak import espeak_paths
    from app.models import manager as models

    piper, kokoro, ge2e = models.gguf_path("piper:joe"), models.kokoro_path(), models.speaker_encoder_path()
    espeak = list(espeak_paths())
    return {
        "gguf-piper": ["gguf", str(piper)],
        "gguf-kokoro": ["gguf", str(kokoro)],
        "gguf-ge2e": ["gguf", str(ge2e)],
        "phonemes-piper": ["phonemes", str(piper)],
        "phonemes-kokoro": ["phonemes", str(kokoro)],
        "text-piper": ["text", str(piper), *espeak],
        "text-kokoro": ["text", str(kokoro), *espeak],
    }


# ---------------------------------------------------------------- mutations

INTERESTING = [b"", b"\0", b"\xff" * 8, b"-1", b"0", b"1e308", b"NaN", b"[]", b"null", b"{}", b'"' * 3,
               b"[" * 2000, b"\xc3", b"\\u202e", b"9" * 40]  # fmt: skip


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A few byte-level mutations: flips, random bytes, cuts, repeats and insertions."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            at = min(at, len(out) - 1)
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            at = min(at, len(out) - 1)
            out[at] = rng.randrange(256)
        elif kind == 2:
            del out[at : at + rng.randint(1, 64)]
        elif kind == 3:
            out[at:at] = out[at : at + rng.randint(1, 64)] * rng.randint(1, 32)
        elif kind == 4:
            out[at:at] = rng.choice(INTERESTING)
        else:
            out = out[:at]
    return bytes(out)


def rezipped(members: dict[str, bytes], rng: random.Random) -> bytes:
    """The members zipped again with one of them (or the member list) mutated."""
    members = dict(members)
    name = rng.choice(sorted(members))
    choice = rng.randrange(8)
    if choice == 0:
        del members[name]
    elif choice == 1:
        members[name + rng.choice(["/../x", " ", "~"])] = members[name]
    else:
        members[name] = mutate(members[name], rng)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, blob in members.items():
            zf.writestr(member, blob)
    return buffer.getvalue()


def unzipped(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


# ---------------------------------------------------------------- Python targets


class Target:
    """One importer: ``seeds`` of valid inputs, ``run`` one input through it."""

    expected: tuple[type[BaseException], ...] = ()

    def seeds(self) -> list[bytes]:
        raise NotImplementedError

    def run(self, data: bytes) -> str:
        raise NotImplementedError

    def input(self, rng: random.Random, seeds: list[bytes]) -> bytes:
        seed = rng.choice(seeds)
        if seed[:2] == b"PK" and rng.randrange(2):
            return rezipped(unzipped(seed), rng)
        return mutate(seed, rng)


class ProfileImport(Target):
    def __init__(self, work: Path):
        from app.profiles import store as profiles

        self.profiles, self.work = profiles, work
        self.expected = (profiles.ProfileError,)

    def seeds(self) -> list[bytes]:
        import numpy as np
        import soundfile as sf

        flac, style, embedding = io.BytesIO(), io.BytesIO(), io.BytesIO()
        sf.write(flac, np.sin(np.arange(48000) / 20).astype(np.float32) * 0.1, 48000, format="FLAC", subtype="PCM_24")
        np.save(style, np.zeros(self.profiles.PACK_SHAPE, np.float32))
        np.save(embedding, np.full(256, 1 / 16, np.float32))
        meta = {"schema_version": self.profiles.SCHEMA_VERSION, "name": "seed", "scores": {"search": {"x": 1}}}
        members = {"profile.json": json.dumps(meta).encode(), "reference.flac": flac.getvalue(),
                   "style.npy": style.getvalue(), "embedding.npy": embedding.getvalue()}  # fmt: skip
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, blob in members.items():
                zf.writestr(name, blob)
        return [buffer.getvalue()]

    def run(self, data: bytes) -> str:
        path = self.work / "in.vsprofile"
        path.write_bytes(data)
        try:
            profile = self.profiles.import_file(path, name="fuzzed")
        except self.expected:
            answer = "refused"
        else:
            self.profiles.delete(profile.name)
            answer = "imported"
        left = list(self.profiles.profiles_dir().iterdir())
        if left:
            raise AssertionError(f"the import left {[p.name for p in left]} behind")
        return answer


class ProjectOpen(Target):
    def __init__(self, work: Path):
        from app.core import project

        self.project = project
        self.expected = (project.ProjectFileError,)

    def seeds(self) -> list[bytes]:
        import numpy as np

        p = self.project.Project("# One\nFirst sentence. [pause 1s] Second [spell one].", "piper:joe")
        p.lexicon = {"first": "/fˈɜːst/", "GIF": "jif"}
        timings = {"words": [[0, 5, 0.0, 0.001]], "unspoken": ["★"], "skipped_symbols": 1}
        p.add_take(1, self.project.Take(np.zeros(64, np.float32), 22050, "First sentence.", "piper:joe", {}, timings))
        return [p.to_bytes()]

    def run(self, data: bytes) -> str:
        from app.core import subtitles, words

        try:
            project = self.project.Project.from_bytes(data)
        except self.expected:
            return "refused"
        # What the studio reads of an opened project: staleness, chapters, silences, lost
        # symbols, word timings, subtitles.
        project.stale()
        project.chapter_progress()
        placed = [i for i, _ in project.takes_audio()]
        project.silences(placed, 0.3)
        for sentence in project.sentences:
            for take in sentence.takes:
                self.project.lost_symbols(take)
                words.take_words(take.timings, sentence.text, take.duration_s)
        subtitles.to_vtt(subtitles.cues(project))
        return "opened"


class EpubImport(Target):
    def __init__(self, work: Path):
        from app.core import epub

        self.epub, self.work = epub, work
        self.expected = (epub.EpubError,)

    def seeds(self) -> list[bytes]:
        container = (
            '<?xml version="1.0"?><container xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
            '<rootfile full-path="OEBPS/content.opf"/></rootfiles></container>'
        )
        opf = (
            '<package xmlns="http://www.idpf.org/2007/opf"><manifest>'
            '<item id="a" href="a.xhtml" media-type="application/xhtml+xml"/></manifest>'
            '<spine><itemref idref="a"/></spine></package>'
        )
        doc = "<html><body><h1>One</h1><p>A <em>first</em> line.</p><img alt='A map.'/><h2>Two</h2></body></html>"
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            for name, text in (
                ("META-INF/container.xml", container),
                ("OEBPS/content.opf", opf),
                ("OEBPS/a.xhtml", doc),
            ):
                zf.writestr(name, text)
        return [buffer.getvalue()]

    def run(self, data: bytes) -> str:
        path = self.work / "in.epub"
        path.write_bytes(data)
        try:
            self.epub.epub_to_script(path)
        except self.expected:
            return "refused"
        return "imported"


class LexiconFile(Target):
    def __init__(self, work: Path):
        from app.core import lexicon

        self.lexicon, self.work = lexicon, work
        self.expected = (lexicon.LexiconError,)

    def seeds(self) -> list[bytes]:
        pls = (
            '<?xml version="1.0"?><lexicon xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa">'
            "<lexeme><grapheme>Nguyen</grapheme><phoneme>ŋwˈɪn</phoneme></lexeme>"
            "<lexeme><grapheme>UN</grapheme><alias>United Nations</alias></lexeme></lexicon>"
        )
        return [self.lexicon.dumps({"nguyen": "/ŋwˈɪn/", "GIF": "jif"}).encode(), pls.encode()]

    def run(self, data: bytes) -> str:
        path = self.work / "lexicon.txt"
        path.write_bytes(data)
        try:
            entries = self.lexicon.read(path)
        except self.expected:
            return "refused"
        self.lexicon.phonemes("Mr. Nguyen likes GIF files.", entries, lambda text: [text.lower()])
        return "read"


class Checkpoint(Target):
    """Legacy checkpoints, written here with stand-ins for the torch names they refer to."""

    def __init__(self, work: Path):
        from app.models import torch_checkpoint

        self.ckpt, self.work = torch_checkpoint, work
        self.expected = (torch_checkpoint.CheckpointError,)

    def seeds(self) -> list[bytes]:
        import numpy as np

        torch = types.ModuleType("torch")
        utils = types.ModuleType("torch._utils")

        def _rebuild_tensor_v2(*args):
            return args

        _rebuild_tensor_v2.__module__ = "torch._utils"
        _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
        utils._rebuild_tensor_v2 = _rebuild_tensor_v2

        class FloatStorage:
            pass

        FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
        torch.FloatStorage, torch._utils = FloatStorage, utils
        saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
        sys.modules.update({"torch": torch, "torch._utils": utils})
        try:
            storage = ("storage", FloatStorage, "0", "cpu", 6)

            class Tensor:
                def __reduce__(self):
                    return (_rebuild_tensor_v2, (storage, 0, (2, 3), (3, 1), False, collections.OrderedDict()))

            buffer = io.BytesIO()
            for obj in (self.ckpt.MAGIC, self.ckpt.PROTOCOL, {"little_endian": True, "protocol_version": 1001}):
                pickle.dump(obj, buffer, protocol=2)
            pickler = pickle.Pickler(buffer, protocol=2)
            pickler.persistent_id = lambda obj: obj if isinstance(obj, tuple) and obj[:1] == ("storage",) else None
            pickler.dump(collections.OrderedDict(weight=Tensor()))
            pickle.dump(["0"], buffer, protocol=2)
            buffer.write(np.int64(6).tobytes() + np.arange(6, dtype=np.float32).tobytes())
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        path = self.work / "seed.pt"
        path.write_bytes(buffer.getvalue())
        loaded = self.ckpt.load(path)  # the seed itself must load
        assert loaded["weight"].shape == (2, 3), loaded
        return [buffer.getvalue()]

    def run(self, data: bytes) -> str:
        path = self.work / "in.pt"
        path.write_bytes(data)
        try:
            self.ckpt.load(path)
        except self.expected:
            return "refused"
        return "loaded"


class SettingsFile(Target):
    def __init__(self, work: Path):
        from app.core import settings

        self.settings, self.work = settings, work

    def seeds(self) -> list[bytes]:
        return [json.dumps(self.settings.DEFAULTS).encode()]

    def run(self, data: bytes) -> str:
        path = self.work / "settings.json"
        path.write_bytes(data)
        values = self.settings.Settings.load(path).values  # never raises
        for key, (low, high) in self.settings.RANGES.items():
            if not low <= values[key] <= high:
                raise AssertionError(f"{key} = {values[key]!r} passed the range check")
        return "loaded"


PYTHON_TARGETS = {
    "profile-import": ProfileImport,
    "project-open": ProjectOpen,
    "checkpoint": Checkpoint,
    "settings": SettingsFile,
    "epub": EpubImport,
    "lexicon": LexiconFile,
}


def run_python(name: str, seconds: float, seed: int) -> tuple[int, str]:
    rng = random.Random(seed)
    answers: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="vs-fuzz-") as tmp:
        os.environ["VOICESTUDIO_DATA_DIR"] = str(Path(tmp) / "data")
        target = PYTHON_TARGETS[name](Path(tmp))
        seeds = target.seeds()
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            data = target.input(rng, seeds)
            try:
                answers[target.run(data)] += 1
            except Exception as exc:  # anything but the target's own error
                CRASH_INPUT.write_bytes(data)
                return 1, f"fuzz {name}: input {n} raised {type(exc).__name__}: {exc} (saved in {CRASH_INPUT})"
            n += 1
        elapsed = time.monotonic() - t0
    detail = "; ".join(f"{k} {v}" for k, v in sorted(answers.items()))
    return 0, f"fuzz {name}: {n} inputs in {elapsed:.1f} s, 0 crashes; {detail};"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="default: every target")
    parser.add_argument("--seconds", type=float, default=10.0, help="per target (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--driver", type=Path, default=DRIVER, help="the native fuzzer (default: the release build's)")
    args = parser.parse_args()
    native = native_targets()
    names = args.targets or [*native, *PYTHON_TARGETS]
    unknown = [n for n in names if n not in native and n not in PYTHON_TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {[*native, *PYTHON_TARGETS]}")
    failed = 0
    for name in names:
        if name in native:
            cmd = [str(args.driver), *native[name], "--seconds", str(args.seconds), "--seed", str(args.seed)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            line = result.stdout.strip() or f"fuzz {name}: exit {result.returncode}"
            if result.returncode != 0:
                line += f" FAILED (exit {result.returncode}): {result.stderr.strip()[-500:]}"
                failed += 1
        else:
            code, line = run_python(name, args.seconds, args.seed)
            failed += code
        print(line.replace(f"fuzz {native[name][0]}:", f"fuzz {name}:", 1) if name in native else line, flush=True)
    print(f"fuzz: {len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
