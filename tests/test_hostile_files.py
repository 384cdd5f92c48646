"""Hostile files and settings: nothing is deleted, overwritten or written where it must not
be, nothing malformed is accepted, and every failure is a clear error."""

import io
import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from app.core.atomic import write_bytes_atomic
from app.core.project import Project, ProjectFileError, autosave_dir, pending_recoveries
from app.core.settings import DEFAULTS, Settings
from app.models import torch_checkpoint
from app.profiles import store as profiles

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def _project_file(meta: dict, members: dict | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("project.json", json.dumps(meta))
        for name, data in (members or {}).items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _meta(**changes) -> dict:
    project = Project("One sentence.")
    meta = json.loads(zipfile.ZipFile(io.BytesIO(project.to_bytes())).read("project.json"))
    meta.update(changes)
    return meta


def test_a_project_id_never_names_a_path(data_dir, tmp_path):
    victim = tmp_path / "victim"
    for suffix in (".vsproj", ".json"):
        victim.with_suffix(suffix).write_text("precious", encoding="utf-8")
    for hostile in [str(victim), "../../victim", "../" * 8 + str(victim).lstrip("/")]:
        project = Project.from_bytes(_project_file(_meta(id=hostile)))
        assert project.id != hostile
        copy = project.autosave()
        assert copy.parent == autosave_dir()
        project.close()
    for suffix in (".vsproj", ".json"):
        assert victim.with_suffix(suffix).read_text(encoding="utf-8") == "precious"


def test_a_hostile_autosave_note_is_ignored(data_dir):
    (autosave_dir() / "x.json").write_text("[]", encoding="utf-8")
    (autosave_dir() / "x.vsproj").write_bytes(b"")
    (autosave_dir() / ("0" * 32 + ".json")).write_text("null", encoding="utf-8")
    assert pending_recoveries() == []


@pytest.mark.parametrize("payload", ["[]", "null", '"text"', "1"])
def test_project_json_that_is_not_a_project_is_a_project_error(payload):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("project.json", payload)
    with pytest.raises(ProjectFileError):
        Project.from_bytes(buffer.getvalue())


@pytest.mark.parametrize("rate", [0, -5, "22050", 10**9, True])
def test_takes_with_an_impossible_sample_rate_are_refused(rate):
    project = Project("One sentence.")
    from app.core.project import Take

    project.add_take(0, Take(np.zeros(100, np.float32), 22050, "One sentence.", "piper:joe", {}))
    data = project.to_bytes()
    zin = zipfile.ZipFile(io.BytesIO(data))
    meta = json.loads(zin.read("project.json"))
    meta["sentences"][0]["takes"][0]["sample_rate"] = rate
    members = {n: zin.read(n) for n in zin.namelist() if n != "project.json"}
    with pytest.raises(ProjectFileError, match="sample rate"):
        Project.from_bytes(_project_file(meta, members))


def test_a_take_id_that_is_a_path_is_refused():
    meta = _meta()
    meta["sentences"][0]["takes"] = [
        {"id": "../../etc", "sample_rate": 22050, "text": "", "voice": "", "settings": {}, "timings": {}, "created": 0}
    ]
    meta["sentences"][0]["active"] = 0
    with pytest.raises(ProjectFileError, match="id"):
        Project.from_bytes(_project_file(meta))


def test_a_project_of_compressed_whitespace_is_refused():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("project.json", "w") as fh:
            block = b" " * (1 << 20)
            for _ in range(80):  # 80 MB of whitespace in about 80 KB
                fh.write(block)
            fh.write(json.dumps(_meta()).encode())
    assert len(buffer.getvalue()) < 1 << 20
    with pytest.raises(ProjectFileError, match="larger than"):
        Project.from_bytes(buffer.getvalue())


def test_a_symbolic_link_target_is_replaced_not_the_link(tmp_path):
    target = tmp_path / "real.wav"
    target.write_bytes(b"old")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    write_bytes_atomic(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_bytes_atomic(fifo, b"through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_folder_is_not_replaced(tmp_path):
    folder = tmp_path / "out.wav"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        write_bytes_atomic(folder, b"x")
    assert folder.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_full_device_is_written_through_and_stays_a_device(tmp_path):
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # what /dev/full is
    result = subprocess.run(
        [sys.executable, "main.py", "synth", "--voice", "piper:joe", "--device", "cpu", "--threads", "2",
         "--text", "Hi.", "--out", str(full)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1 and "No space left" in result.stderr and "Traceback" not in result.stderr
    assert stat.S_ISCHR(os.stat(full).st_mode)


def _profile_zip(tmp_path, **members) -> Path:
    exported = tmp_path / "p.vsprofile"
    with zipfile.ZipFile(exported, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if isinstance(data, bytes):
                zf.writestr(name, data)
            else:  # a generator of blocks
                with zf.open(name, "w") as fh:
                    for block in data:
                        fh.write(block)
    return exported


def _good_members() -> dict:
    import soundfile as sf

    flac = io.BytesIO()
    sf.write(flac, np.zeros(48000, np.float32), 48000, format="FLAC", subtype="PCM_24")
    style, embedding = io.BytesIO(), io.BytesIO()
    np.save(style, np.zeros(profiles.PACK_SHAPE, np.float32))
    np.save(embedding, np.full(256, 1 / 16, np.float32))
    meta = {"schema_version": profiles.SCHEMA_VERSION, "name": "someone"}
    return {
        "profile.json": json.dumps(meta).encode(),
        "reference.flac": flac.getvalue(),
        "style.npy": style.getvalue(),
        "embedding.npy": embedding.getvalue(),
    }


def _leftovers(data_dir) -> list:
    return list(profiles.profiles_dir().iterdir())


def test_a_good_profile_file_imports(data_dir, tmp_path):
    profile = profiles.import_file(_profile_zip(tmp_path, **_good_members()))
    assert profile.name == "someone"


def test_a_profile_with_a_gigabyte_reference_is_refused(data_dir, tmp_path):
    members = dict(_good_members(), **{"reference.flac": (b"\0" * (1 << 20) for _ in range(1024))})
    with pytest.raises(profiles.ProfileError, match="larger than"):
        profiles.import_file(_profile_zip(tmp_path, **members))
    assert _leftovers(data_dir) == []


@pytest.mark.parametrize(
    ("member", "data", "reason"),
    [
        ("reference.flac", b"not audio at all" * 100, "reference.flac"),
        ("profile.json", b"[" * 100000 + b"]" * 100000, "profile.json"),
        ("profile.json", json.dumps({"schema_version": 1, "name": "a\u202eb"}).encode(), "invisible"),
    ],
)
def test_a_profile_with_a_malformed_member_is_refused(data_dir, tmp_path, member, data, reason):
    members = dict(_good_members(), **{member: data})
    with pytest.raises(profiles.ProfileError, match=reason):
        profiles.import_file(_profile_zip(tmp_path, **members))
    assert _leftovers(data_dir) == []


def test_a_style_header_claiming_a_terabyte_is_refused(data_dir, tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    members = dict(_good_members(), **{"style.npy": header.getvalue() + b"\0" * 64})
    with pytest.raises(profiles.ProfileError):
        profiles.import_file(_profile_zip(tmp_path, **members))
    assert _leftovers(data_dir) == []


@pytest.mark.parametrize("name", ["evil\u202etxt.exe", "two\u2028lines", "zero\u200bwidth", "bell\x07"])
def test_profile_names_that_hide_or_spoof_are_refused(name):
    with pytest.raises(profiles.ProfileError, match="invisible|control"):
        profiles.check_name(name)


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


def test_no_pickle_of_a_checkpoint_runs_code(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(_Marker(marker), protocol=2))
    with pytest.raises(torch_checkpoint.CheckpointError):
        torch_checkpoint.load(path)
    assert not marker.exists()


@pytest.mark.parametrize("value", [1e308, -5.0, float("nan"), "0.3", True])
def test_out_of_range_settings_fall_back_to_the_default(tmp_path, value):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"gap_s": value, "threads": -3, "autosave_s": 0}), encoding="utf-8")
    settings = Settings.load(path)
    assert settings["gap_s"] == DEFAULTS["gap_s"]
    assert settings["threads"] == DEFAULTS["threads"] and settings["autosave_s"] == DEFAULTS["autosave_s"]


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "nan"], "--speed"),
        (["--speed", "inf"], "--speed"),
        (["--noise-scale", "nan"], "noise_scale"),
        (["--threads", "-5"], "threads"),
        (["--threads", "100000"], "threads"),
    ],
)
def test_cli_refuses_parameters_with_one_line(tmp_path, args, message):
    result = _cli("synth", "--voice", "piper:joe", "--device", "cpu", "--text", "Hi.", "--out", str(tmp_path / "o.wav"),
                  *args)  # fmt: skip
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**70)])
def test_cli_refuses_seeds_outside_64_bits(tmp_path, seed):
    result = _cli("synth", "--text", "Hi.", "--out", str(tmp_path / "o.wav"), "--seed", seed)
    assert result.returncode == 2 and "seed" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("content", "message"), [(b"caf\xe9 au lait", "not UTF-8"), (b"Hello.\0 More.", "NUL")])
def test_cli_text_files_that_are_not_text_are_one_line_errors(tmp_path, content, message):
    text = tmp_path / "in.txt"
    text.write_bytes(content)
    result = _cli("synth", "--voice", "piper:joe", "--device", "cpu", "--threads", "2", "--text-file", str(text),
                  "--out", str(tmp_path / "o.wav"))  # fmt: skip
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_cli_writes_a_long_script_block_by_block_as_one_take(engine, tmp_path, monkeypatch):
    import soundfile as sf

    from app.cli import main as cli
    from app.cli import synth

    script = "The first sentence. A second one follows it. Then a third, and last, sentence.\n\nA new paragraph."
    monkeypatch.setattr(synth, "BLOCK_CHARS", 30)
    assert len(synth._blocks(script, phonemes=False)) >= 3
    out = tmp_path / "o.wav"
    assert cli.main(["synth", "--voice", "piper:joe", "--device", "cpu", "--threads", "2", "--text", script,
                     "--out", str(out), "--format", "float"]) == 0  # fmt: skip
    written, _ = sf.read(out, dtype="float32")
    whole = engine.synthesize(text=script).audio
    np.testing.assert_array_equal(written, np.clip(whole, -1, 1))


def test_cli_block_of_punctuation_alone_is_skipped_not_fatal(tmp_path, monkeypatch):
    from app.cli import main as cli
    from app.cli import synth

    monkeypatch.setattr(synth, "BLOCK_CHARS", 12)
    out = tmp_path / "o.wav"
    script = "Hello there. ?! ... !! ?? Goodbye now."
    assert any(not any(c.isalpha() for c in b) for b in synth._blocks(script, phonemes=False))
    assert cli.main(["synth", "--voice", "piper:joe", "--device", "cpu", "--threads", "2", "--text", script,
                     "--out", str(out)]) == 0  # fmt: skip
    assert cli.main(["synth", "--voice", "piper:joe", "--device", "cpu", "--threads", "2", "--text", "?! ...",
                     "--out", str(tmp_path / "none.wav")]) == 1  # fmt: skip
    assert not (tmp_path / "none.wav").exists()


def test_a_tensor_whose_storage_is_not_a_storage_is_refused(tmp_path):
    # _rebuild_tensor_v2(("x",), 0, (1,), (1,)): a tuple where the storage belongs.
    tensor = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(X\x01\x00\x00\x00x\x85K\x00K\x01\x85K\x01\x85tR."
    head = b"".join(pickle.dumps(x, protocol=2) for x in (torch_checkpoint.MAGIC, torch_checkpoint.PROTOCOL, {}))
    path = tmp_path / "odd.pt"
    path.write_bytes(head + tensor + pickle.dumps([], protocol=2))
    with pytest.raises(torch_checkpoint.CheckpointError, match="storage"):
        torch_checkpoint.load(path)
