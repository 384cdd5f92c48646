"""A project: the script, its sentences and their takes, the voice and its settings.

Qt-free; the studio window renders it. A take is one synthesis of one sentence
(audio, the text, voice and settings it was made from, the engine's timings). A
sentence's current take is *stale* when its text, the voice or the settings have
changed since. Editing the script re-segments it and keeps every take whose
sentence text still exists.

A project file (``.vsproj``) is a zip: ``project.json`` plus one float32 WAV per
take under ``takes/``, so takes round-trip bit for bit. Files are written
atomically; ``autosave`` keeps a copy in the data directory until the project is
closed cleanly, and ``pending_recoveries`` finds the copies a crashed session left.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import re
import time
import uuid
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.core import lexicon, paths
from app.core.archive import read_bounded
from app.core.atomic import write_bytes_atomic
from app.core.script import chapters as script_chapters
from app.core.script import direction, pause_between, segment, tags

SCHEMA_VERSION = 1
SUFFIX = ".vsproj"
DEFAULT_SETTINGS = {"speed": 1.0, "noise_scale": None, "noise_w": None, "seed": 0}


# What a project file may hold, uncompressed: its JSON, one take's audio (float32: about
# 11 minutes at 24 kHz), all the takes together; take sample rates.
MAX_JSON_BYTES = 64 << 20
MAX_TAKE_BYTES = 64 << 20
MAX_TAKES_BYTES = 4 << 30
MIN_RATE, MAX_RATE = 1000, 384000
PROJECT_ID = re.compile(r"[0-9a-f]{32}")
TAKE_ID = re.compile(r"[0-9a-f]{12}")


class ProjectFileError(RuntimeError):
    pass


@dataclass
class Take:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    text: str
    voice: str
    settings: dict
    timings: dict = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    def meta(self) -> dict:
        return {
            "id": self.id,
            "sample_rate": self.sample_rate,
            "text": self.text,
            "voice": self.voice,
            "settings": self.settings,
            "timings": self.timings,
            "created": self.created,
        }


def lost_symbols(take: Take) -> str:
    """What a take's sentence lost, for the user, or "": the symbols of its text the voice's
    front end did not read (Engine.unspoken, recorded with the take) and the count of phoneme
    symbols the voice could not pronounce (the engine's skipped_symbols)."""
    parts = []
    unspoken, skipped = take.timings.get("unspoken"), take.timings.get("skipped_symbols")
    if isinstance(unspoken, list) and unspoken and all(isinstance(u, str) for u in unspoken):  # a file's, checked
        parts.append(" ".join(unspoken))
    if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
        parts.append(f"{skipped} phoneme symbol(s)")
    return ", ".join(parts)


@dataclass
class Sentence:
    text: str
    start: int
    end: int
    paragraph: int
    takes: list[Take] = field(default_factory=list)
    active: int = -1  # index into takes
    locked: bool = False

    @property
    def take(self) -> Take | None:
        return self.takes[self.active] if 0 <= self.active < len(self.takes) else None

    def add_take(self, take: Take) -> None:
        self.takes.append(take)
        self.active = len(self.takes) - 1

    def is_stale(self, voice: str, settings: dict) -> bool:
        take = self.take
        return take is None or take.text != self.text or take.voice != voice or take.settings != settings


def new_take(
    text: str, voice: str, settings: dict, entries: dict[str, str], audio, sample_rate: int, timings: dict
) -> Take:
    """A project's take of ``text`` from a synthesis with these settings and lexicon ``entries``:
    its settings record the entries its text used, so that changing one of them makes exactly
    the sentences that use it stale."""
    used = lexicon.sentence_entries(text, entries)
    return Take(
        np.array(audio, dtype=np.float32),
        sample_rate,
        text,
        voice,
        dict(settings) | ({"lexicon": used} if used else {}),
        dict(timings),
    )


def time_left(done_chars: int, total_chars: int, elapsed_s: float) -> float | None:
    """Seconds a render of ``total_chars`` characters of sentences still needs once those of
    ``done_chars`` took ``elapsed_s``, at the characters a second they went at (None before any
    is done)."""
    if done_chars <= 0:
        return None
    return elapsed_s / done_chars * max(total_chars - done_chars, 0)


class Project:
    def __init__(self, script: str = "", voice: str = "piper:joe", settings: dict | None = None):
        self.id = uuid.uuid4().hex
        self.path: Path | None = None
        self.voice = voice
        self.settings = dict(DEFAULT_SETTINGS if settings is None else settings)
        self.lexicon: dict[str, str] = {}  # the project's pronunciations (app.core.lexicon), saved with it
        self.user_lexicon: dict[str, str] = {}  # the studio's, set by it (not saved with the project)
        self._tags_of: tuple[str | None, list] = (None, [])  # the script's tags, for the script they are of
        self.script = ""
        self.sentences: list[Sentence] = []
        self._ends: list[int] = []
        self.dirty = False
        self.set_script(script)
        self.dirty = False

    # -- script ---------------------------------------------------------------
    def set_script(self, script: str) -> None:
        """Re-segment; sentences whose text is unchanged keep their takes and lock."""
        if script == self.script and self.sentences:
            return
        old: dict[str, list[Sentence]] = {}
        for sentence in self.sentences:
            old.setdefault(sentence.text, []).append(sentence)
        sentences = []
        for span in segment(script):
            text = span.text(script)
            sentence = Sentence(text, span.start, span.end, span.paragraph)
            if old.get(text):
                previous = old[text].pop(0)
                sentence.takes, sentence.active, sentence.locked = previous.takes, previous.active, previous.locked
            sentences.append(sentence)
        self.script, self.sentences, self.dirty = script, sentences, True
        self._ends = [sentence.end for sentence in sentences]

    def sentence_at(self, offset: int) -> int:
        """Index of the sentence containing (or nearest after) a script offset; -1 if none."""
        if not self.sentences:
            return -1
        return min(bisect.bisect_left(self._ends, offset), len(self.sentences) - 1)

    def pronunciations(self) -> dict[str, str]:
        """The lexicon entries sentences are read with: the user's and the project's."""
        return lexicon.merged(self.user_lexicon, self.lexicon)

    def sentence_voice(self, index: int) -> str:
        """The voice sentence ``index`` is read in: a [voice] tag's before it, else the project's."""
        return direction(self.script, self.sentences[index].start, self.script_tags()).get("voice", self.voice)

    def sentence_settings(self, index: int, entries: dict[str, str] | None = None) -> dict:
        """The settings sentence ``index`` is synthesized with: the project's, the speed of a
        [speed] tag before it, and the lexicon entries its text uses where it uses any (a take
        records them, so that changing an entry makes exactly the sentences that use it stale)."""
        settings = self.settings
        speed = direction(self.script, self.sentences[index].start, self.script_tags()).get("speed")
        if speed is not None:
            settings = settings | {"speed": speed}
        used = lexicon.sentence_entries(
            self.sentences[index].text, self.pronunciations() if entries is None else entries
        )
        return settings | {"lexicon": used} if used else settings

    def script_tags(self) -> list:
        """The script's tags (app.core.script.tags), parsed once per script."""
        if self._tags_of[0] != self.script:
            self._tags_of = (self.script, tags(self.script))
        return self._tags_of[1]

    def is_stale(self, index: int) -> bool:
        return self.sentences[index].is_stale(self.sentence_voice(index), self.sentence_settings(index))

    def stale(self) -> list[int]:
        entries = self.pronunciations()
        return [
            i
            for i, s in enumerate(self.sentences)
            if s.is_stale(self.sentence_voice(i), self.sentence_settings(i, entries))
        ]

    def synthesis_groups(self, indices: list[int]) -> list[tuple[str, dict, dict, list[tuple[int, str]]]]:
        """These sentences grouped by the voice and settings they are read with (the script's
        [voice] and [speed] tags), in the order each group first comes: its voice, its settings
        (without the lexicon entries: a take records those it used, ``new_take``), the engine's
        parameters for those settings, and its sentences' (index, text)."""
        groups: dict[tuple, list] = {}
        for i in indices:
            settings = {k: v for k, v in self.sentence_settings(i).items() if k != "lexicon"}
            key = (self.sentence_voice(i), tuple(sorted(settings.items(), key=lambda kv: kv[0])))
            groups.setdefault(key, []).append((i, self.sentences[i].text))
        out = []
        for (voice, settings_items), items in groups.items():
            settings = dict(settings_items)
            params = {
                "length_scale": 1.0 / settings["speed"],
                "noise_scale": settings["noise_scale"],
                "noise_w": settings["noise_w"],
                "seed": settings["seed"],
            }
            for key in ("language", "cfg_weight", "exaggeration"):  # Chatterbox Multilingual's
                if settings.get(key) is not None:
                    params[key] = settings[key]
            out.append((voice, settings, params, items))
        return out

    def chapter_range(self, number: int) -> range:
        """The sentences of chapter ``number`` (1 for the script's first heading), its heading's
        included; a ValueError naming the chapters there are where it has no such chapter."""
        chapters = self.chapters()
        if not chapters:
            raise ValueError("the script has no chapters (a chapter starts at a line that begins with #)")
        if not 1 <= number <= len(chapters):
            raise ValueError(f"there is no chapter {number}: the script's chapters are 1 to {len(chapters)}")
        return chapters[number - 1][1]

    def to_synthesize(self, which: str) -> list[int]:
        """Indices for "all" or "stale" jobs; locked sentences are skipped."""
        indices = range(len(self.sentences)) if which == "all" else self.stale()
        return [i for i in indices if not self.sentences[i].locked]

    def add_take(self, index: int, take: Take) -> None:
        self.sentences[index].add_take(take)
        self.dirty = True

    def silences(self, indices: list[int], gap_s: float):
        """The silence around these sentences' takes laid end to end (export.Silences): the
        script's pause tags between two of them where it has any, else ``gap_s``; the tags
        before the script's first sentence and after its last where those are included."""
        from app.core.export import Silences

        if not indices:
            return Silences(0.0, (), 0.0)
        script, s = self.script, self.sentences
        between = []
        for i, j in zip(indices, indices[1:], strict=False):
            pause = pause_between(script, s[i].end, s[j].start)
            between.append(gap_s if pause is None else pause)
        before = pause_between(script, 0, s[0].start) if indices[0] == 0 else None
        after = pause_between(script, s[-1].end, len(script)) if indices[-1] == len(s) - 1 else None
        return Silences(before or 0.0, tuple(between), after or 0.0)

    def chapters(self) -> list[tuple[str, range]]:
        """Each chapter's title and sentences (its heading's first)."""
        starts = {s.start: i for i, s in enumerate(self.sentences)}
        headings = [(starts[c.start], c.title) for c in script_chapters(self.script) if c.start in starts]
        ends = [first for first, _ in headings[1:]] + [len(self.sentences)] if headings else []
        return [(title, range(first, end)) for (first, title), end in zip(headings, ends, strict=True)]

    def chapter_progress(self) -> list[tuple[int, str, int, int]]:
        """Each chapter's heading sentence, title, sentences with an up-to-date take, and sentences."""
        stale = set(self.stale())
        return [
            (
                within.start,
                title,
                sum(self.sentences[i].take is not None and i not in stale for i in within),
                len(within),
            )
            for title, within in self.chapters()
        ]

    def chapter_marks(self, indices: list[int]) -> list[tuple[int, str]]:
        """Where the script's chapters start among these sentences' takes laid end to end: the
        position of each chapter's first sentence in ``indices`` (its heading's, or the next
        one's there), and its title; chapters none of whose sentences are there are left out."""
        marks = []
        for title, within in self.chapters():
            at = bisect.bisect_left(indices, within.start)
            if at < len(indices) and indices[at] < within.stop:
                marks.append((at, title))
        return marks

    def takes_audio(self, indices: list[int] | None = None) -> list[tuple[int, Take]]:
        chosen = range(len(self.sentences)) if indices is None else indices
        return [(i, self.sentences[i].take) for i in chosen if self.sentences[i].take is not None]

    # -- files ----------------------------------------------------------------
    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        meta = {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "script": self.script,
            "voice": self.voice,
            "settings": self.settings,
            "lexicon": self.lexicon,
            "sentences": [
                {
                    "text": s.text,
                    "locked": s.locked,
                    "active": s.active,
                    "takes": [t.meta() for t in s.takes],
                }
                for s in self.sentences
            ],
        }
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("project.json", json.dumps(meta, indent=1, ensure_ascii=False))
            for sentence in self.sentences:
                for take in sentence.takes:
                    zf.writestr(f"takes/{take.id}.wav", _wav_bytes(take.audio, take.sample_rate))
        return buffer.getvalue()

    def save(self, path: Path | str | None = None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ProjectFileError("the project has no file yet; choose where to save it")
        write_bytes_atomic(target, self.to_bytes())
        self.path, self.dirty = target, False
        return target

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "project") -> Project:
        """A project from a file's bytes, every part checked before any of it is used: sizes
        (uncompressed, whatever the zip's headers claim), the JSON's layout and types, each
        take's audio. A malformed file raises ProjectFileError and nothing else."""
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                meta = json.loads(read_bounded(zf, "project.json", MAX_JSON_BYTES).decode("utf-8"))
                project = cls._from_meta(meta, name)
                budget = [MAX_TAKES_BYTES]
                for sentence, stored in zip(project.sentences, meta["sentences"], strict=True):
                    for t in stored["takes"]:
                        sentence.takes.append(_take_from(zf, t, name, budget))
                    if not -1 <= sentence.active < len(sentence.takes):
                        raise ProjectFileError(f"{name}: a sentence's active take {sentence.active} does not exist")
        except ProjectFileError:
            raise
        except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, TypeError, AttributeError, RecursionError,
                RuntimeError, NotImplementedError, EOFError, OSError) as exc:  # fmt: skip
            raise ProjectFileError(f"{name}: not a readable Voice Studio project ({exc})") from exc
        project.dirty = False
        return project

    @classmethod
    def _from_meta(cls, meta, name: str) -> Project:
        if not isinstance(meta, dict):
            raise ProjectFileError(f"{name}: project.json holds no project")
        version = meta.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ProjectFileError(f"{name}: project format {version!r} is newer than this studio")
        script, voice, settings, sentences = (meta.get(k) for k in ("script", "voice", "settings", "sentences"))
        if not (isinstance(script, str) and isinstance(voice, str) and isinstance(settings, dict)):
            raise ProjectFileError(f"{name}: project.json lacks its script, voice or settings")
        if not isinstance(sentences, list) or not all(isinstance(x, dict) for x in sentences):
            raise ProjectFileError(f"{name}: project.json lacks its sentences")
        # A new id (cls() makes one): it names this session's autosave copy, and nothing a
        # file holds becomes part of a path.
        project = cls(script, voice, settings)
        entries = meta.get("lexicon", {})
        if not isinstance(entries, dict) or len(entries) > lexicon.MAX_ENTRIES:
            raise ProjectFileError(f"{name}: its lexicon is malformed")
        for word, pron in entries.items():
            if not isinstance(pron, str):
                raise ProjectFileError(f"{name}: its lexicon is malformed")
            try:
                word, pron = lexicon.check_entry(word, pron)
            except lexicon.LexiconError as exc:
                raise ProjectFileError(f"{name}: its lexicon: {exc}") from None
            project.lexicon[word] = pron
        if len(sentences) != len(project.sentences):
            raise ProjectFileError(f"{name}: its sentences do not match its script")
        for sentence, stored in zip(project.sentences, sentences, strict=True):
            if not isinstance(stored.get("takes"), list) or not isinstance(stored.get("active"), int):
                raise ProjectFileError(f"{name}: a sentence's takes are malformed")
            sentence.locked, sentence.active = bool(stored.get("locked")), stored["active"]
        return project

    @classmethod
    def open(cls, path: Path | str) -> Project:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ProjectFileError(f"{path}: {exc.strerror or exc}") from exc
        project = cls.from_bytes(data, name=path.name)
        project.path = path
        return project

    # -- autosave and recovery -----------------------------------------------
    def autosave(self) -> Path:
        """Write a recovery copy (atomically) beside a note of where the project lives."""
        directory = autosave_dir()
        copy = write_bytes_atomic(directory / f"{self.id}{SUFFIX}", self.to_bytes())
        note = {"path": str(self.path) if self.path else None, "saved": time.time(), "pid": os.getpid()}
        write_bytes_atomic(directory / f"{self.id}.json", json.dumps(note).encode("utf-8"))
        return copy

    def close(self) -> None:
        """A clean close: the recovery copy is no longer needed."""
        discard_recovery(self.id)


@dataclass
class Recovery:
    id: str
    copy: Path
    original: Path | None
    saved: float

    def load(self) -> Project:
        project = Project.open(self.copy)
        # It goes on as the project whose copy this is (an id of our own form: pending_recoveries).
        project.id, project.path, project.dirty = self.id, self.original, True
        return project


def autosave_dir() -> Path:
    directory = paths.data_dir() / "autosave"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def pending_recoveries() -> list[Recovery]:
    """Recovery copies left by sessions that did not close their project (newest first)."""
    found = []
    for note_path in autosave_dir().glob("*.json"):
        copy = note_path.with_suffix(SUFFIX)
        try:
            note = json.loads(note_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError):
            continue
        if not PROJECT_ID.fullmatch(note_path.stem) or not isinstance(note, dict):
            continue
        if not copy.exists() or _alive(note.get("pid")):
            continue
        original = Path(note["path"]) if isinstance(note.get("path"), str) and note["path"] else None
        saved = note.get("saved")
        found.append(Recovery(note_path.stem, copy, original, float(saved) if isinstance(saved, int | float) else 0.0))
    return sorted(found, key=lambda r: r.saved, reverse=True)


def discard_recovery(project_id: str) -> None:
    if not PROJECT_ID.fullmatch(project_id):  # only names this studio gave its copies
        raise ValueError(f"{project_id!r} is not a project id")
    for suffix in (SUFFIX, ".json"):
        (autosave_dir() / f"{project_id}{suffix}").unlink(missing_ok=True)


def _alive(pid) -> bool:
    if pid == os.getpid():
        return True  # this session's own copy
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take_from(zf: zipfile.ZipFile, t, name: str, budget: list[int]) -> Take:
    """A take's metadata checked and its audio read, within the project's remaining ``budget``."""
    if not isinstance(t, dict):
        raise ProjectFileError(f"{name}: a take is malformed")
    take_id, rate = t.get("id"), t.get("sample_rate")
    if not isinstance(take_id, str) or not TAKE_ID.fullmatch(take_id):
        raise ProjectFileError(f"{name}: a take's id {take_id!r} is malformed")
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise ProjectFileError(f"{name}: take {take_id} has sample rate {rate!r}")
    fields = {"text": str, "voice": str, "settings": dict, "timings": dict, "created": float | int}
    for key, kind in fields.items():
        if not isinstance(t.get(key), kind):
            raise ProjectFileError(f"{name}: take {take_id} lacks its {key}")
    blob = read_bounded(zf, f"takes/{take_id}.wav", min(MAX_TAKE_BYTES, budget[0]))
    budget[0] -= len(blob)
    audio, file_rate = _read_wav_bytes(blob)
    if file_rate != rate or audio.ndim != 1 or not np.all(np.isfinite(audio)):
        raise ProjectFileError(f"{name}: take {take_id}'s audio is not mono audio at {rate} Hz")
    return Take(audio, rate, t["text"], t["voice"], t["settings"], t["timings"], take_id, float(t["created"]))


def _wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.asarray(audio, dtype=np.float32), sample_rate, subtype="FLOAT", format="WAV")
    return buffer.getvalue()


def _read_wav_bytes(data: bytes) -> tuple[np.ndarray, int]:
    import soundfile

    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
    return audio, rate


@dataclass
class Segment:
    index: int  # sentence index
    start_s: float
    end_s: float
    take: Take


def timeline(project: Project, *, gap_s: float = 0.3) -> tuple[np.ndarray, int, list[Segment]]:
    """The current takes end to end at the first take's sample rate, ``gap_s`` apart or as the
    script's pause tags ask (Project.silences)."""
    from app.core.export import render, resample

    placed = project.takes_audio()
    if not placed:
        return np.zeros(0, dtype=np.float32), 0, []
    rate = placed[0][1].sample_rate
    clips = [resample(take.audio, take.sample_rate, rate) for _, take in placed]
    silences = project.silences([index for index, _ in placed], gap_s)
    starts = silences.starts([len(c) for c in clips], rate)
    segments = [
        Segment(index, start / rate, (start + len(clip)) / rate, take)
        for (index, take), clip, start in zip(placed, clips, starts, strict=True)
    ]
    return render(clips, rate, silences=silences), rate, segments
