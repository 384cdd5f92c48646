"""The Qt-free project: segmentation, takes and staleness, files, autosave and recovery."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile

from app.core.export import Silences, export_audio
from app.core.project import Project, ProjectFileError, Take, pending_recoveries, timeline
from app.core.script import canonical_tags, segment, tags

SETTINGS = {"speed": 1.0, "noise_scale": None, "noise_w": None, "seed": 0}


def texts(script):
    return [span.text(script) for span in segment(script)]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("Hello world. How are you?", ["Hello world.", "How are you?"]),
        ("Dr. Smith met Mrs. Jones at 3.30 p.m. today.", ["Dr. Smith met Mrs. Jones at 3.30 p.m. today."]),
        ('"Really?" she asked. Yes!', ['"Really?" she asked.', "Yes!"]),
        ("J. R. R. Tolkien wrote it… Then he slept.", ["J. R. R. Tolkien wrote it…", "Then he slept."]),
        ("A hard-wrapped\nline. Next one", ["A hard-wrapped\nline.", "Next one"]),
        ("Wait!!! What?!", ["Wait!!!", "What?!"]),
        ("   \n\n  ", []),
        ("No final punctuation", ["No final punctuation"]),
    ],
)
def test_sentences(script, expected):
    assert texts(script) == expected


def test_markdown_markup_is_not_read_aloud():
    from app.core.script import markdown_to_script

    md = (
        "# Title\n\nSome **bold** and _light_ words, a [link](http://x.org) and `code`.\n\n"
        "- one item\n1. two\n> quoted\n"
    )
    assert markdown_to_script(md) == (
        "# Title\n\nSome bold and light words, a link and code.\n\none item\ntwo\nquoted\n"
    )


def test_headings_are_sentences_of_their_own_and_start_chapters():
    from app.core.script import chapters

    script = "Before any.\n# Chapter One ##\nIt was cold. It rained.\n## A part\nMore.\n\n#hashtag is text.\n# Two\nEnd"
    assert texts(script) == ["Before any.", "Chapter One", "It was cold.", "It rained.", "A part", "More.",
                             "#hashtag is text.", "Two", "End"]  # fmt: skip
    assert [c.title for c in chapters(script)] == ["Chapter One", "A part", "Two"]
    project = Project(script, settings=SETTINGS)
    assert project.chapter_marks(list(range(9))) == [(1, "Chapter One"), (4, "A part"), (7, "Two")]
    # Among some sentences only: a chapter starts at its first one there; one with none is left out.
    assert project.chapter_marks([0, 2, 3, 8]) == [(1, "Chapter One"), (3, "Two")]


def test_paragraphs_and_spans():
    script = "One. Two.\n\n  Three.\n \nFour"
    spans = segment(script)
    assert [s.paragraph for s in spans] == [0, 0, 1, 2]
    assert all(script[s.start : s.end] == s.text(script) and s.text(script) == s.text(script).strip() for s in spans)


def test_long_chapter():
    chapter = ("It was a bright cold day in April, and the clocks were striking thirteen. " * 20 + "\n\n") * 300
    spans = segment(chapter)
    assert len(spans) == 6000 and spans[-1].paragraph == 299


def take_for(sentence, voice="piper:joe", settings=SETTINGS, n=100, value=0.1):
    return Take(np.full(n, value, dtype=np.float32), 22050, sentence.text, voice, dict(settings))


def test_takes_survive_edits_and_staleness_follows_text_voice_settings():
    project = Project("First one. Second one. Third one.", settings=SETTINGS)
    for i, sentence in enumerate(project.sentences):
        project.add_take(i, take_for(sentence))
    assert project.stale() == []
    project.sentences[2].locked = True

    project.set_script("First one. Second one, changed. Third one. New fourth.")
    assert [s.take is not None for s in project.sentences] == [True, False, True, False]
    assert project.stale() == [1, 3]
    assert project.sentences[2].locked
    assert project.to_synthesize("stale") == [1, 3]
    assert project.to_synthesize("all") == [0, 1, 3]  # the locked sentence is skipped

    project.voice = "piper:other"
    assert project.stale() == [0, 1, 2, 3]
    project.voice = "piper:joe"
    project.settings = dict(SETTINGS, seed=7)
    assert project.stale() == [0, 1, 2, 3]


def test_several_takes_and_switching():
    project = Project("Only sentence.", settings=SETTINGS)
    sentence = project.sentences[0]
    project.add_take(0, take_for(sentence, value=0.1))
    project.add_take(0, take_for(sentence, value=0.2))
    assert sentence.active == 1 and sentence.take.audio[0] == np.float32(0.2)
    sentence.active = 0
    assert sentence.take.audio[0] == np.float32(0.1)


def test_save_and_open_round_trip_takes_bit_for_bit(tmp_path):
    project = Project("One. Two.\n\nThree.", settings=SETTINGS)
    rng = np.random.default_rng(0)
    for i, sentence in enumerate(project.sentences):
        take = take_for(sentence)
        take.audio = rng.standard_normal(2000).astype(np.float32) * 0.3
        take.timings = {"stages_ms": {"decoder": 12.5}}
        project.add_take(i, take)
    project.sentences[1].locked = True
    path = project.save(tmp_path / "story.vsproj")
    assert not project.dirty and not list(tmp_path.glob("*.part"))

    loaded = Project.open(path)
    assert loaded.script == project.script and loaded.voice == project.voice and loaded.settings == project.settings
    assert [s.locked for s in loaded.sentences] == [False, True, False]
    for a, b in zip(project.sentences, loaded.sentences, strict=True):
        assert a.take.audio.tobytes() == b.take.audio.tobytes()
        assert a.take.meta() == b.take.meta()
    assert loaded.stale() == []


def test_damaged_or_newer_project_files_are_refused(tmp_path):
    bad = tmp_path / "bad.vsproj"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ProjectFileError, match="bad.vsproj"):
        Project.open(bad)
    with pytest.raises(ProjectFileError):
        Project.open(tmp_path / "missing.vsproj")
    path = Project("Hi.").save(tmp_path / "ok.vsproj")
    data = path.read_bytes()
    with pytest.raises(ProjectFileError):
        Project.from_bytes(data[: len(data) // 2])


def test_save_without_a_path_says_so():
    with pytest.raises(ProjectFileError, match="choose where"):
        Project("Hi.").save()


def test_autosave_of_a_killed_session_is_recovered(tmp_path, monkeypatch):
    env = dict(os.environ, VOICESTUDIO_DATA_DIR=str(tmp_path))
    code = textwrap.dedent(
        f"""
        import os, signal
        import numpy as np
        from app.core.project import Project, Take
        p = Project("Kept sentence. Another one.")
        p.path = None
        t = Take(np.arange(500, dtype=np.float32) / 1000, 22050, p.sentences[0].text, p.voice, dict(p.settings))
        p.add_take(0, t)
        p.save({str(tmp_path / "work.vsproj")!r})
        p.set_script("Kept sentence. Another one. Typed after the last save.")
        p.autosave()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).parent.parent)
    assert proc.returncode == -signal.SIGKILL

    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    recoveries = pending_recoveries()
    assert len(recoveries) == 1
    recovered = recoveries[0].load()
    assert recovered.path == tmp_path / "work.vsproj" and recovered.dirty
    assert recovered.script.endswith("Typed after the last save.")
    assert recovered.sentences[0].take.audio.tobytes() == (np.arange(500, dtype=np.float32) / 1000).tobytes()
    recovered.close()
    assert pending_recoveries() == []


def test_a_live_session_is_not_offered_for_recovery(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    project = Project("Still open.")
    project.autosave()
    assert pending_recoveries() == []  # this process is alive
    project.close()
    assert not list((tmp_path / "autosave").iterdir())


PAUSES = (
    'One. [pause 1.5s] Two<break time="250ms"/> three. [Pause] Four. [pause 2s][pause 500ms] Five. [pause 90s]'
    "\n[pause .2s]"
)


def test_pause_tags_end_sentences_are_never_read_and_set_the_silence_between_them():
    assert texts(PAUSES) == ["One.", "Two", "three.", "Four.", "Five."]
    found = tags(PAUSES)
    assert [t.seconds for t in found] == [1.5, 0.25, None, 2.0, 0.5, None, 0.2]
    assert "[pause 1.5s]" in found[2].problem and "at most 60 s" in found[5].problem
    assert canonical_tags(PAUSES) == PAUSES.replace('<break time="250ms"/>', "[pause 250ms]")
    project = Project(PAUSES, settings=SETTINGS)
    # Between sentences: the tags' sum, or the usual gap where none (or only malformed) are.
    assert project.silences(list(range(5)), 0.3) == Silences(0.0, (1.5, 0.25, 0.3, 2.5), 0.2)
    assert project.silences([0, 2], 0.3) == Silences(0.0, (1.75,), 0.0)  # every tag between the two
    assert project.silences([2, 3], 0.3) == Silences(0.0, (0.3,), 0.0)  # a malformed tag alone: the gap


def test_pauses_are_exact_to_the_sample_in_the_timeline_and_the_export_and_survive_saving(tmp_path):
    project = Project("[pause 0.5s] " + PAUSES, settings=SETTINGS)
    rng = np.random.default_rng(1)
    for i, sentence in enumerate(project.sentences):
        take = take_for(sentence)
        take.audio = (rng.uniform(0.1, 0.5, 1000 + 37 * i) * rng.choice([-1, 1], 1000 + 37 * i)).astype(np.float32)
        take.sample_rate = 24000
        project.add_take(i, take)
    loaded = Project.open(project.save(tmp_path / "p.vsproj"))
    audio, rate, segments = timeline(loaded, gap_s=0.3)
    silences = [0.5, 1.5, 0.25, 0.3, 2.5, 0.2]  # before, between, after
    assert rate == 24000 and len(audio) == sum(1000 + 37 * i for i in range(5)) + sum(round(s * rate) for s in silences)
    at = round(0.5 * rate)
    for k, seg in enumerate(segments):
        start = round(seg.start_s * rate)
        assert start == at and not audio[at - round(silences[k] * rate) : at].any()
        assert np.array_equal(audio[start : start + 1000 + 37 * k], loaded.sentences[k].take.audio)
        at = start + 1000 + 37 * k + round(silences[k + 1] * rate)
    # Written at twice the rate, the silences are counted in the written rate's samples.
    clips = [s.take.audio for s in loaded.sentences]
    report = export_audio(tmp_path / "x.wav", clips, rate, out_rate=48000, subtype="float",
                        silences=loaded.silences(list(range(5)), 0.3))  # fmt: skip
    written, _ = soundfile.read(str(report.path), dtype="float32")
    assert len(written) == 2 * sum(len(c) for c in clips) + sum(round(s * 48000) for s in silences)
    first_gap = slice(round(0.5 * 48000) + 2 * len(clips[0]), round(0.5 * 48000) + 2 * len(clips[0]) + 72000)
    assert not written[first_gap].any() and written[first_gap.stop] != 0


def test_voice_and_speed_tags_hold_until_the_next_of_their_kind():
    from app.core.script import direction

    script = (
        "Narrator. [voice kokoro:af_heart] Alice speaks. [speed 1.5] Quickly now. [voice default] The narrator, "
        "quick. [speed default] Plain again. [speed 9] [voice] [speed fast]"
    )
    assert texts(script) == ["Narrator.", "Alice speaks.", "Quickly now.", "The narrator, quick.", "Plain again."]
    bad = [t for t in tags(script) if t.problem]
    assert [t.text(script) for t in bad] == ["[speed 9]", "[voice]", "[speed fast]"]
    assert "from 0.25 to 4" in bad[0].problem and "[voice default]" in bad[1].problem
    assert direction(script, len(script)) == {}  # malformed tags change nothing
    project = Project(script, voice="piper:joe", settings=SETTINGS)
    assert [project.sentence_voice(i) for i in range(5)] == ["piper:joe", "kokoro:af_heart", "kokoro:af_heart",
                                                             "piper:joe", "piper:joe"]  # fmt: skip
    assert [project.sentence_settings(i)["speed"] for i in range(5)] == [1.0, 1.0, 1.5, 1.5, 1.0]
    for i, sentence in enumerate(project.sentences):
        project.add_take(i, take_for(sentence, voice=project.sentence_voice(i), settings=project.sentence_settings(i)))
    assert project.stale() == []
    project.set_script(project.script.replace("[speed 1.5]", "[speed 1.25]"))  # exactly its span turns stale
    assert project.stale() == [2, 3]
    project.set_script(project.script.replace("af_heart", "am_adam"))
    assert project.stale() == [1, 2, 3]


def test_say_as_tags_stand_for_a_word_and_read_as_they_say():
    from app.core.script import read_as, say_as_tags, shown

    text = "Ask [spell NASA] about the [say GIF as jif] and [say Nguyen as /ŋwˈɪn/], not [say oops]."
    assert texts(text) == [text]  # inside the sentence: it is not cut
    assert shown(text) == "Ask NASA about the GIF and Nguyen, not oops."
    assert read_as(text) == ("Ask N A S A about the jif and sayastag2, not oops.", {"sayastag2": "/ŋwˈɪn/"})
    assert read_as(text, phonemes=False)[0] == "Ask N A S A about the jif and Nguyen, not oops."
    assert [t.problem != "" for t in say_as_tags(text)] == [False, False, False, True]
