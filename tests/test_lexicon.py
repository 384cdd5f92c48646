"""Pronunciation lexicons: matching, respellings, IPA read as phonemes, files (plain and PLS),
a project's staleness following exactly the entries its sentences use, and synth --lexicon."""

import numpy as np
import pytest
import soundfile

from app.core import lexicon
from app.core.project import Project, ProjectFileError, Take

ENTRIES = {"nguyen": "/ŋwˈɪn/", "GIF": "jif", "Tolkien": "/tˈɒlkiːn/"}


def fake_phonemize(text):
    """Stands in for an engine's: each word upper-cased, one line."""
    return [" ".join(w.upper() for w in text.split())] if text.strip() else []


def test_words_match_whole_and_by_case_rules():
    text = "Mr. Nguyen and NGUYEN like the GIF format, not the gif; Nguyens and Tolkiens are other words."
    assert lexicon.used(text, ENTRIES) == {"GIF": "jif", "nguyen": "/ŋwˈɪn/"}
    assert lexicon.respelled(text, ENTRIES) == text.replace("the GIF", "the jif")
    assert lexicon.used("tolkien wrote it", ENTRIES) == {}  # a capital in the entry: that case alone


def test_ipa_entries_become_phonemes_around_the_voices_own():
    got = lexicon.phonemes("Tolkien met Mr. Nguyen, who likes a GIF.", ENTRIES, fake_phonemize)
    assert got == "tˈɒlkiːn MET MR. ŋwˈɪn, WHO LIKES A JIF."
    assert lexicon.phonemes("Nothing to change.", ENTRIES, fake_phonemize) is None
    assert lexicon.phonemes("The GIF.", ENTRIES, fake_phonemize) is None  # a respelling alone: text


HOMOGRAPHS = {"record (noun)": "/ɹˈɛkɚd/", "record (verb)": "/ɹɪkˈɔːɹd/", "present (noun)": "prezzent"}


@pytest.mark.parametrize(
    "text, want",
    [
        ("I want to record a record.", ["/ɹɪkˈɔːɹd/", "/ɹˈɛkɚd/"]),
        ("Record the song; they record it, we don't record.", ["/ɹɪkˈɔːɹd/"] * 3),
        ("My record of this record.", ["/ɹˈɛkɚd/"] * 2),
        ("Records and recorders: recorded.", []),  # other words
        ("Off the record.", ["/ɹˈɛkɚd/"]),
        ("A new record.", []),  # the word before does not tell, and no entry is for any part of speech
    ],
)
def test_a_part_of_speech_applies_where_the_word_before_tells(text, want):
    got = lexicon.phonemes(text, HOMOGRAPHS, fake_phonemize) or ""
    assert [w.strip(".,;") for w in got.split() if "ˈ" in w] == [p[1:-1] for p in want]  # the entries, in order
    entries = HOMOGRAPHS | {"record": "/ɹˈɛkɔːɹd/"}  # an entry for any part of speech, where none tells
    assert lexicon.used("A new record.", entries) == {"record": "/ɹˈɛkɔːɹd/"}
    assert lexicon.used("To record.", entries) == {"record (verb)": "/ɹɪkˈɔːɹd/"}


def test_a_part_of_speech_is_written_after_the_word_and_round_trips(tmp_path):
    assert lexicon.check_entry("Present(Noun) ", " prezzent") == ("Present (noun)", "prezzent")
    assert lexicon.respelled("Please present the present.", HOMOGRAPHS) == "Please present the prezzent."
    path = lexicon.write(tmp_path / "lex.txt", HOMOGRAPHS)
    assert lexicon.read(path) == HOMOGRAPHS
    with pytest.raises(lexicon.LexiconError, match="word \\(noun\\), word \\(verb\\)"):
        lexicon.check_entry("record (adverb)", "x")
    project = Project("They record a record. Records.")  # staleness follows the part of speech used
    project.lexicon = dict(HOMOGRAPHS)
    project.add_take(0, take(project, 0))
    project.add_take(1, take(project, 1))
    assert project.sentences[0].take.settings["lexicon"] == {
        k: HOMOGRAPHS[k] for k in ("record (noun)", "record (verb)")
    }
    project.lexicon["record (noun)"] = "/ɹˈɛkəɹd/"
    assert project.stale() == [0]
    project.lexicon["present (noun)"] = "presence"
    assert project.stale() == [0]


def test_files_round_trip_and_bad_lines_are_named(tmp_path):
    path = lexicon.write(tmp_path / "lex.txt", ENTRIES)
    assert lexicon.read(path) == ENTRIES
    path.write_text("# mine\nok\t/oʊkˈeɪ/\ntwo words\tx\n", encoding="utf-8")
    with pytest.raises(lexicon.LexiconError, match="line 3: 'two words': an entry is one word"):
        lexicon.read(path)
    path.write_text("word without a tab\n", encoding="utf-8")
    with pytest.raises(lexicon.LexiconError, match="line 1: the word, a tab"):
        lexicon.read(path)


def test_pls_dictionaries_import():
    pls = """<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" xml:lang="en-US">
  <lexeme><grapheme>Nguyen</grapheme><grapheme>nguyen</grapheme><phoneme>ŋwˈɪn</phoneme></lexeme>
  <lexeme><grapheme>UN</grapheme><alias>United Nations</alias></lexeme>
</lexicon>"""
    assert lexicon.parse(pls) == {"Nguyen": "/ŋwˈɪn/", "nguyen": "/ŋwˈɪn/", "UN": "United Nations"}
    with pytest.raises(lexicon.LexiconError, match="entities"):
        lexicon.parse('<!DOCTYPE l [<!ENTITY a "aaaa">]><lexicon>&a;</lexicon>')


def take(project, i, **extra):
    return Take(np.zeros(10, np.float32), 22050, project.sentences[i].text, project.voice,
                dict(project.sentence_settings(i)), **extra)  # fmt: skip


def test_changing_an_entry_makes_exactly_the_sentences_that_use_it_stale(tmp_path):
    project = Project("Tolkien wrote. Nguyen read. Nobody else.")
    project.lexicon = dict(ENTRIES)
    for i in range(3):
        project.add_take(i, take(project, i))
    assert project.stale() == []
    assert project.sentences[1].take.settings["lexicon"] == {"nguyen": "/ŋwˈɪn/"}
    assert "lexicon" not in project.sentences[2].take.settings
    project.lexicon["nguyen"] = "/nwˈɪn/"
    assert project.stale() == [1]
    project.lexicon["nobody"] = "/nˈoʊbɑdi/"
    assert project.stale() == [1, 2]
    project.user_lexicon = {"tolkien": "/x/"}  # the project's "Tolkien", of that very case, wins
    assert project.stale() == [1, 2]
    project.user_lexicon = {"wrote": "/ɹˈoʊt/"}
    assert project.stale() == [0, 1, 2]
    loaded = Project.open(project.save(tmp_path / "p.vsproj"))  # the project's lexicon is saved, the user's not
    assert loaded.lexicon == project.lexicon and loaded.user_lexicon == {}
    assert loaded.stale() == [1, 2]  # without the user's entry, sentence 0 reads as its take did


def test_a_malformed_lexicon_in_a_project_file_is_refused(tmp_path):
    import json
    import zipfile

    project = Project("Hello.")
    project.lexicon = {"hello": "/hɛlˈoʊ/"}
    path = project.save(tmp_path / "p.vsproj")
    with zipfile.ZipFile(path) as zf:
        meta = json.loads(zf.read("project.json"))
    for bad in ({"two words": "x"}, {"hello": 5}, ["hello"]):
        meta["lexicon"] = bad
        with zipfile.ZipFile(tmp_path / "bad.vsproj", "w") as zf:
            zf.writestr("project.json", json.dumps(meta))
        with pytest.raises(ProjectFileError, match="lexicon"):
            Project.open(tmp_path / "bad.vsproj")


def test_synth_reads_the_text_through_a_lexicon(tmp_path, joe_path, cli):
    (tmp_path / "lex.txt").write_text("Nguyen\t/ɡˈɑːbəlɡʊk/\n", encoding="utf-8")
    takes = {}
    for name, extra in (("plain", []), ("lexicon", ["--lexicon", str(tmp_path / "lex.txt")])):
        cli("synth", "--text", "Mister Nguyen is here.", "--out", str(tmp_path / f"{name}.wav"), "--seed", "2",
            "--noise-w", "0", *extra)  # fmt: skip
        takes[name] = soundfile.read(str(tmp_path / f"{name}.wav"), dtype="float32")[0]
    cli("synth", "--phonemes", "mˈɪstɚ ɡˈɑːbəlɡʊk ɪz hˈɪɹ.", "--out", str(tmp_path / "ipa.wav"), "--seed", "2",
        "--noise-w", "0")  # fmt: skip
    ipa = soundfile.read(str(tmp_path / "ipa.wav"), dtype="float32")[0]
    assert np.array_equal(takes["lexicon"], ipa) and not np.array_equal(takes["plain"], ipa)
    (tmp_path / "bad.txt").write_text("Nguyen\n", encoding="utf-8")
    result = cli("synth", "--text", "Hi.", "--out", str(tmp_path / "x.wav"), "--lexicon", str(tmp_path / "bad.txt"),
                 check=False)  # fmt: skip
    assert result.returncode != 0 and "bad.txt, line 1" in result.stderr
