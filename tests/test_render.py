"""`render`: a book rendered unattended, saved chapter by chapter, so that a killed or stopped
render goes on where it was without redoing what it saved; one chapter alone; its export."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from app.core.project import Project

ROOT = Path(__file__).resolve().parent.parent

LAST = " ".join(f"Sentence number {n} of the last chapter is here." for n in range(1, 31))
SCRIPT = (
    "# One\n\nThe first chapter starts here. It has two sentences.\n\n"
    "# Two\n\nA second chapter follows. It is short too.\n\n"
    f"# Three\n\n{LAST}\n"
)


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.vsproj"
    Project(SCRIPT).save(path)
    return path


@pytest.fixture
def env(tmp_path):
    """The installed voices, and a settings folder of the test's own (no user lexicon)."""
    return dict(os.environ, VOICESTUDIO_CONFIG_DIR=str(tmp_path / "cfg"))


def render(*args, env):
    return subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "render", *map(str, args), "--device", "cpu", "--threads", "2"],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def start(book, env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "main.py"), "render", str(book), "--device", "cpu", "--threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


def read_until(proc: subprocess.Popen, marker: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            return lines
    _, err = proc.communicate()
    pytest.fail(f"the render ended before '{marker}': {''.join(lines)}{err}")


def take_ids(project: Project) -> dict[int, list[str]]:
    return {i: [t.id for t in s.takes] for i, s in enumerate(project.sentences)}


def test_a_killed_render_goes_on_without_redoing_what_it_saved(book, env):
    total = len(Project.open(book).sentences)
    proc = start(book, env)
    read_until(proc, "saved: chapter 'One'")
    proc.kill()  # as a crash: no chance to save anything more
    proc.communicate()
    killed = Project.open(book)  # the file is whole: saves are atomic
    first = killed.chapter_range(1)
    assert all(killed.sentences[i].take is not None and not killed.is_stale(i) for i in first)
    left = len(killed.stale())
    assert 0 < left < total - len(first) + 1  # the kill came in the middle of the render
    before = take_ids(killed)

    again = render(book, env=env)
    assert again.returncode == 0, again.stderr
    assert f"{total - left} of {total} sentences up to date; rendering {left}" in again.stdout
    done = Project.open(book)
    assert done.stale() == []
    after = take_ids(done)
    for i, ids in before.items():
        if ids:  # what was saved stays, and is not rendered again
            assert after[i] == ids
    assert all(len(ids) == 1 for ids in after.values())  # each sentence rendered once in all


def test_ctrl_c_saves_what_is_rendered_and_says_how_to_go_on(tmp_path, env):
    # A last chapter long enough that the render cannot end before the signal comes, however
    # late the test reads its progress on a busy machine.
    book = tmp_path / "long.vsproj"
    Project(SCRIPT.replace(LAST, LAST * 8)).save(book)
    proc = start(book, env)
    read_until(proc, "[8/")  # two sentences into the last chapter, past the last save at a chapter's end
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "run the same command to go on" in out
    stopped = Project.open(book)
    assert sum(s.take is not None for s in stopped.sentences) >= 8
    assert stopped.stale()


def test_one_chapter_is_rendered_alone_and_exported(book, env, tmp_path):
    out = tmp_path / "two.wav"
    result = render(book, "--chapter", 2, "--out", out, env=env)
    assert result.returncode == 0, result.stderr
    assert "0 of 3 sentences up to date in chapter 2 (Two); rendering 3" in result.stdout
    project = Project.open(book)
    rendered = [i for i, s in enumerate(project.sentences) if s.take is not None]
    assert rendered == list(project.chapter_range(2))
    audio, rate = sf.read(out)
    takes = sum(len(project.sentences[i].take.audio) for i in rendered)
    assert len(audio) == takes + 2 * round(0.3 * rate)  # the takes, with the gaps between them

    again = render(book, "--chapter", 2, env=env)
    assert "3 of 3 sentences up to date" in again.stdout and "rendering 0" in again.stdout
    assert take_ids(Project.open(book)) == take_ids(project)


def test_bad_chapters_and_files_are_refused_with_what_is_wrong(book, env, tmp_path):
    result = render(book, "--chapter", 4, env=env)
    assert result.returncode == 1
    assert "there is no chapter 4: the script's chapters are 1 to 3" in result.stderr
    plain = tmp_path / "plain.vsproj"
    Project("No headings here. Just text.").save(plain)
    assert "has no chapters" in render(plain, "--chapter", 1, env=env).stderr
    broken = tmp_path / "broken.vsproj"
    broken.write_bytes(b"not a project")
    result = render(broken, env=env)
    assert result.returncode == 1 and "broken.vsproj" in result.stderr
