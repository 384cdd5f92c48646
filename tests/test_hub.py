"""Voices from the Hugging Face Hub: huggingface_hub's real client against a server on 127.0.0.1
that answers as the hub does (tests/hubserver.py), serving the joe voice's own ONNX and JSON as a
catalogue voice: a fresh download and conversion, a resume after the connection breaks, a wrong
checksum refused, offline with and without the files cached, a revision bump, cancellation."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hubserver import Blob, FakeHub
from PySide6.QtCore import Qt

from app.engine.engine import Engine
from app.engine.errors import CancelledError, ModelFileError
from app.models import hub
from app.models import manager as models

REPO = "test/piper-voices"
ONNX = "en/en_US/test/medium/en_US-test-medium.onnx"
CONFIG = ONNX + ".json"
VOICE = "piper:en_US-test-medium"


@pytest.fixture(scope="module")
def joe_files(joe_path):
    pkg = models.lookup("piper:joe")
    with zipfile.ZipFile(models.fetch_wheel(pkg)) as zf:
        return {ONNX: zf.read(pkg.onnx_member), CONFIG: zf.read(pkg.config_member)}


@pytest.fixture
def server(tmp_path, monkeypatch, joe_files):
    """The fake hub with the voice's repository, its catalogue, and a user of their own."""
    fake = FakeHub()
    commit = fake.commit(REPO, joe_files)
    catalogue = tmp_path / "catalogue.json"
    catalogue.write_text(json.dumps({"voices": [fake.entry(VOICE, REPO, commit, [ONNX, CONFIG])]}))
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("VOICESTUDIO_CATALOGUE", str(catalogue))
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    fake.catalogue, fake.first = catalogue, commit
    yield fake
    fake.close()


def resolves(fake):
    return [(m, p.rsplit("/", 1)[-1], r) for m, p, r in fake.requests if m == "GET" and "/resolve/" in p]


IPA = "ðə kwˈɪk bɹˈaʊn fˈɑːks."


@pytest.fixture(scope="module")
def joe_audio(joe_path):
    with Engine.open("piper:joe", device="cpu", threads=2) as engine:
        return engine.synthesize(phonemes=IPA, noise_scale=0.0, noise_w=0.0).audio


def test_a_catalogue_voice_downloads_converts_and_speaks_as_its_source(joe_audio, server):
    assert VOICE in models.voice_ids()
    info = models.voice_info(VOICE)
    assert (
        not info.installed
        and info.licence == "test voice, MIT"
        and info.source_package == f"{REPO}@{server.first[:12]}"
    )
    steps = []
    path = models.install(VOICE, progress=lambda f, m: steps.append(f))
    assert steps == sorted(steps) and steps[-1] == 1.0 and len(steps) > 3
    assert models.is_installed(VOICE) and models.installed_path(VOICE) == path
    manifest = json.loads(path.with_suffix(".json").read_text())
    assert manifest["repo"] == REPO and manifest["revision"] == server.first
    # In huggingface_hub's cache layout, under the pinned commit.
    snapshot = os.path.join(os.environ["HF_HUB_CACHE"], "models--test--piper-voices", "snapshots", server.first)
    assert os.path.isfile(os.path.join(snapshot, ONNX))
    # The same voice as joe's package gives.
    with Engine.open(VOICE, device="cpu", threads=2) as engine:
        got = engine.synthesize(phonemes=IPA, noise_scale=0.0, noise_w=0.0).audio
    np.testing.assert_array_equal(got, joe_audio)
    # Installed: nothing fetched again.
    before = len(server.requests)
    assert models.install(VOICE) == path and len(server.requests) == before


def test_a_broken_transfer_resumes_where_it_stopped(server, joe_files):
    cut = len(joe_files[ONNX]) // 3
    server.break_after[ONNX] = cut
    models.install(VOICE)
    ranges = [r[2] for r in resolves(server) if r[1].endswith(".onnx")]
    # The second request asks for the rest from what the first wrote (whole blocks of what came).
    assert len(ranges) == 2 and ranges[0] is None
    assert 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) <= cut
    assert models.is_installed(VOICE)


def test_a_file_that_is_not_the_catalogues_is_refused_and_deleted(server, joe_files):
    bad = bytearray(joe_files[ONNX])
    bad[5000] ^= 1
    server.commits[(REPO, server.first)][ONNX] = Blob(bytes(bad))
    with pytest.raises(hub.HubError, match="sha256 .* not the catalogue's .* refused and deleted"):
        models.install(VOICE)
    assert not models.is_installed(VOICE) and not models.gguf_path(VOICE).exists()
    blobs = os.path.join(os.environ["HF_HUB_CACHE"], "models--test--piper-voices", "blobs")
    assert all(os.path.getsize(os.path.join(blobs, b)) < 10_000 for b in os.listdir(blobs))
    # The hub's file mended, the next install takes it.
    server.commits[(REPO, server.first)][ONNX] = Blob(joe_files[ONNX])
    models.install(VOICE)
    assert models.is_installed(VOICE)


def test_offline_uses_the_cache_and_says_what_to_do_without_it(server, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFileError, match="not in the download cache and HF_HUB_OFFLINE is set.*models install"):
        models.install(VOICE)
    assert server.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    models.install(VOICE)
    models.remove(VOICE)
    assert not models.is_installed(VOICE)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(server.requests)
    path = models.install(VOICE)  # converted again from the cached, checked files
    assert models.is_installed(VOICE) and path.is_file() and len(server.requests) == before


def test_a_revision_bump_installs_the_new_commit(server, joe_files):
    models.install(VOICE)
    config = json.loads(joe_files[CONFIG])
    config["audio"]["sample_rate"] = 16000
    second = server.commit(REPO, {CONFIG: json.dumps(config).encode()})
    server.catalogue.write_text(json.dumps({"voices": [server.entry(VOICE, REPO, second, [ONNX, CONFIG])]}))
    assert not models.is_installed(VOICE)  # the catalogue pins another commit now
    models.install(VOICE)
    assert models.is_installed(VOICE) and models.sample_rate(VOICE) == 16000
    # Only the file that changed is fetched.
    assert [r[1] for r in resolves(server)][-1:] == [CONFIG.rsplit("/", 1)[-1]]
    assert sum(r[1].endswith(".onnx") for r in resolves(server)) == 1


def test_cancelling_stops_the_download_and_leaves_nothing_half_written(server, joe_files):
    """Cancelled part-way (the fourth progress report): no model, no blob, no part left in the
    cache; the next install downloads the file again (huggingface_hub resumes within a call, and
    starts a file afresh in a new one)."""
    seen = []

    def cancelled() -> bool:
        seen.append(1)
        return len(seen) > 3

    with pytest.raises(CancelledError, match="cancelled"):
        models.install(VOICE, cancelled=cancelled)
    assert not models.is_installed(VOICE) and not models.gguf_path(VOICE).exists()
    blobs = os.path.join(os.environ["HF_HUB_CACHE"], "models--test--piper-voices", "blobs")
    assert all(os.path.getsize(os.path.join(blobs, b)) < 10_000 for b in os.listdir(blobs))
    models.install(VOICE)
    assert models.is_installed(VOICE)
    assert [r[2] for r in resolves(server) if r[1].endswith(".onnx")] == [None, None]


def test_the_pin_tool_reads_what_the_catalogue_holds(server):
    from tools.hub_pin import pin

    entry = json.loads(server.catalogue.read_text())["voices"][0]
    got = pin(REPO, "main", [ONNX, CONFIG])
    assert got == {"repo": REPO, "revision": server.first, "files": entry["files"]}
    assert "sha256" in got["files"][0] and "git_sha1" in got["files"][1]


def test_a_bad_catalogue_is_refused_with_a_reason(server):
    entry = json.loads(server.catalogue.read_text())["voices"][0]
    for change, reason in (
        ({"revision": "main"}, "not a commit"),
        ({"family": "tortoise"}, "family"),
        ({"files": [{"path": "../x.onnx", "size": 1, "sha256": "0" * 64}]}, "not a path inside"),
        ({"files": [{"path": ONNX, "size": 1}]}, "one digest"),
    ):
        server.catalogue.write_text(json.dumps({"voices": [entry | change]}))
        with pytest.raises(ModelFileError, match=reason):
            hub.catalogue()


def test_the_shipped_catalogue_pins_every_file(monkeypatch):
    monkeypatch.delenv("VOICESTUDIO_CATALOGUE", raising=False)
    entries = hub.catalogue()
    assert entries and all(e.licence and e.size > 0 and e.voice_id in models.voice_ids() for e in entries.values())


def test_the_cli_lists_installs_and_removes_a_catalogue_voice(server, cli):
    env = dict(os.environ)
    rows = {r["voice"]: r for r in json.loads(cli("models", "list", "--json", env=env).stdout)}
    row = rows[VOICE]
    assert (
        not row["installed"] and row["download_bytes"] == 63201294 + server.commits[(REPO, server.first)][CONFIG].size
    )
    assert row["licence"] == "test voice, MIT" and row["source"] == f"{REPO}@{server.first[:12]}"
    done = cli("models", "install", VOICE, env=env)
    assert f"{VOICE}: " in done.stdout and "[100%]" in done.stderr
    assert "installed" in cli("models", "list", env=env).stdout.split(VOICE)[1].splitlines()[0]
    assert "removed" in cli("models", "remove", VOICE, env=env).stdout
    assert not models.is_installed(VOICE)
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HUB_CACHE"] = env["HF_HUB_CACHE"] + "-empty"
    failed = cli("models", "install", VOICE, env=env, check=False)
    assert failed.returncode != 0 and "HF_HUB_OFFLINE is set" in failed.stderr and "Traceback" not in failed.stderr


def test_the_voice_library_filters_installs_with_progress_cancels_and_removes(server, qtbot):
    from app.ui.panels import VoicesPanel

    panel = VoicesPanel()
    qtbot.addWidget(panel)
    rows = {
        panel.tree.topLevelItem(i).text(0): panel.tree.topLevelItem(i) for i in range(panel.tree.topLevelItemCount())
    }
    row = rows[VOICE]
    assert [row.text(c) for c in (1, 2, 3, 5, 6)] == ["piper", "en_US", "medium", "test voice, MIT", "not installed"]
    assert row.text(4) == "60 MiB"
    # Filters: by words, by language, installed only.
    panel.filter.setText("test medium")
    assert [v for v, it in rows.items() if not it.isHidden()] == [VOICE]
    panel.filter.clear()
    panel.language.setCurrentIndex(panel.language.findData("ja"))
    assert rows[VOICE].isHidden() and not rows["kokoro:jf_alpha"].isHidden()
    panel.language.setCurrentIndex(0)
    panel.only_installed.setChecked(True)
    assert rows[VOICE].isHidden()
    panel.only_installed.setChecked(False)

    panel.tree.setCurrentItem(rows[VOICE])
    asked = []
    panel.ask = lambda title, text: asked.append(text) or False  # the user declines
    assert not panel.install_selected() and "test voice, MIT" in asked[0] and "60 MiB" in asked[0]
    # Cancelled (at its next progress report, within the first block): nothing installed.
    panel.ask = lambda title, text: True
    assert panel.install_selected() and panel.cancel_install.isEnabled() and not panel.install.isEnabled()
    panel._cancel_install()
    qtbot.waitUntil(lambda: panel.job is None, timeout=60_000)
    assert panel.progress.format() == f"{VOICE}: cancelled" and not models.is_installed(VOICE)
    # Installed, its progress rising to the end.
    assert panel.tree.currentItem().text(0) == VOICE
    seen = []
    panel.progress.valueChanged.connect(seen.append)
    with qtbot.waitSignal(panel.installed_changed, timeout=120_000):
        assert panel.install_selected()
    assert len(seen) > 3 and seen[-1] == 1000 and seen == sorted(seen)
    assert models.is_installed(VOICE) and panel.progress.format() == f"{VOICE}: installed"
    current = panel.tree.currentItem()
    assert current.text(0) == VOICE and current.text(6) == "installed" and panel.remove.isEnabled()
    assert panel.remove_selected() and not models.is_installed(VOICE)
    assert panel.tree.currentItem().text(6) == "not installed"


def test_chatterbox_comes_from_the_catalogues_files_on_the_hub(server, tmp_path):
    """A Chatterbox entry names a model's official files (here the official layout drawn by
    tools/chatterbox/weights.py): installed from the hub, converted from huggingface_hub's
    snapshot of the pinned commit, the commit recorded."""
    import shutil

    from app.engine.chatterbox import ChatterboxModel
    from tools.chatterbox import weights

    cache = Path(os.environ.get("VS_TEST_CACHE", Path(__file__).resolve().parents[1] / "build" / "test-models"))
    weights.write(cache / "chatterbox", weights.TURBO)
    folder = cache / "chatterbox" / "turbo"
    shutil.copyfile(Path(__file__).parent / "data" / "chatterbox" / "conds.pt", folder / "conds.pt")
    names = ["t3_turbo_v1.safetensors", "ve.safetensors", "s3gen_meanflow.safetensors", "tokenizer.json", "conds.pt"]
    repo = "ResembleAI/chatterbox-turbo"
    commit = server.commit(repo, {name: folder / name for name in names})
    entry = server.entry("chatterbox-turbo:default", repo, commit, names, family="chatterbox", language="en")
    voices = json.loads(server.catalogue.read_text())["voices"]
    server.catalogue.write_text(json.dumps({"voices": [*voices, entry]}))
    assert models.voice_ids().count("chatterbox-turbo:default") == 1
    assert not models.chatterbox_installed("chatterbox-turbo")
    steps = []
    path = models.install("chatterbox-turbo:default", progress=lambda f, m: steps.append(f))
    assert steps == sorted(steps) and steps[-1] == 1.0
    manifest = json.loads(path.with_suffix(".json").read_text())
    assert (manifest["repo"], manifest["revision"], manifest["weights"]) == (repo, commit, "q8_0")
    assert models.voice_info("chatterbox-turbo:default").source_package == f"{repo}@{commit[:12]}"
    with ChatterboxModel.open(models.installed_path("chatterbox-turbo:default"), device="cpu", threads=2) as cb:
        assert cb.variant == "turbo"
    # Not in the catalogue: the folder is asked for.
    server.catalogue.write_text(json.dumps({"voices": voices}))
    with pytest.raises(ModelFileError, match="give --from <folder>"):
        models.install_chatterbox("chatterbox", None)


def test_a_gated_repository_says_how_to_get_in_and_takes_a_token(server, monkeypatch):
    server.gated[REPO] = "hf_test_token"
    with pytest.raises(hub.HubError, match="gated: accept its terms on the hub, then log in .* or set HF_TOKEN"):
        models.install(VOICE)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    models.install(VOICE)
    assert models.is_installed(VOICE)


KOKORO_REPO = "test/kokoro-voices"


@pytest.fixture(scope="module")
def stock_kokoro():
    """The packaged Kokoro model and its jf_alpha pack as raw float32, the hub's layout."""
    if not models.kokoro_installed():
        pytest.skip("Kokoro is not installed (python main.py models install kokoro)")
    return models.kokoro_path(), models.kokoro_packs()["jf_alpha"][:, 0, :].astype("<f4").tobytes()


@pytest.fixture
def kokoro_hub(stock_kokoro, server):
    """Three catalogue Kokoro voices whose packs are the packaged jf_alpha's, an American, a
    British and a Spanish one, beside the packaged model (linked into this user's models)."""
    stock, pack = stock_kokoro
    for src in (stock, stock.with_suffix(".json")):
        (models.paths.models_dir() / src.name).symlink_to(src)
    files = {f"voices/{name}.bin": pack for name in ("af_twin", "bf_twin", "ef_twin")}
    commit = server.commit(KOKORO_REPO, files)
    voices = json.loads(server.catalogue.read_text())["voices"]
    for name in ("af_twin", "bf_twin", "ef_twin"):
        voices.append(server.entry(f"kokoro:{name}", KOKORO_REPO, commit, [f"voices/{name}.bin"],
                                   licence="Apache-2.0"))  # fmt: skip
    server.catalogue.write_text(json.dumps({"voices": voices}))
    return files


def test_a_catalogue_kokoro_voice_installs_its_pack_and_speaks_with_it(kokoro_hub, server):
    assert {"kokoro:af_twin", "kokoro:bf_twin"} <= set(models.voice_ids())
    info = models.voice_info("kokoro:af_twin")
    assert info.family == "kokoro" and not info.installed and info.licence == "Apache-2.0"
    with pytest.raises(ModelFileError, match="models install kokoro:af_twin"):
        Engine.open("kokoro:af_twin", device="cpu", threads=2)
    models.install("kokoro:af_twin")
    assert models.is_installed("kokoro:af_twin") and not models.is_installed("kokoro:bf_twin")
    assert models.voice_info("kokoro:af_twin").sample_rate == 24000
    text = "Go home before the rain."
    # The same pack as the packaged voice: the same audio, to the sample.
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as engine:
        want = engine.synthesize(text=text).audio
        american = engine.phonemize(text)
    with Engine.open("kokoro:af_twin", device="cpu", threads=2) as engine:
        np.testing.assert_array_equal(engine.synthesize(text=text).audio, want)
    # A British voice reads British English: "go home" with Kokoro's British "əʊ" (Q), not O.
    models.install("kokoro:bf_twin")
    with Engine.open("kokoro:bf_twin", device="cpu", threads=2) as engine:
        british = engine.phonemize(text)
        take = engine.synthesize(text=text)
    assert "O" in american[0] and "Q" not in american[0]
    assert "Q" in british[0] and "O" not in british[0]
    assert take.timings["skipped_symbols"] == 0 and len(take.audio) > 24000 // 2
    # A Spanish voice reads Spanish: espeak-ng's Spanish, its affricates as Kokoro's symbols.
    models.install("kokoro:ef_twin")
    with Engine.open("kokoro:ef_twin", device="cpu", threads=2) as engine:
        spanish = engine.phonemize("Mucho calor en la estación.")
        take = engine.synthesize(text="Mucho calor en la estación.")
    assert spanish == ["mˈuʧo kalˈoɾ en la ˌestaθjˈon."] and take.timings["skipped_symbols"] == 0
    # A damaged pack is refused, and removing the voice leaves the model installed.
    path = models.kokoro_pack_path("kokoro:bf_twin")
    path.write_bytes(path.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ModelFileError, match="damaged .*models install kokoro:bf_twin --force"):
        Engine.open("kokoro:bf_twin", device="cpu", threads=2)
    assert models.remove("kokoro:bf_twin") == [path.with_suffix(".json"), path]
    assert models.kokoro_installed() and not models.is_installed("kokoro:bf_twin")


def test_a_kokoro_pack_that_is_not_one_is_refused(kokoro_hub, server):
    commit = server.commit(KOKORO_REPO, {"voices/af_twin.bin": b"\xff\xff\xff\x7f" * (510 * 256)})  # NaNs
    voices = [v for v in json.loads(server.catalogue.read_text())["voices"] if v["id"] != "kokoro:af_twin"]
    voices.append(server.entry("kokoro:af_twin", KOKORO_REPO, commit, ["voices/af_twin.bin"]))
    server.catalogue.write_text(json.dumps({"voices": voices}))
    with pytest.raises(ModelFileError, match="not a Kokoro voice pack"):
        models.install("kokoro:af_twin")
    assert not models.kokoro_pack_path("kokoro:af_twin").exists()
    # The language a context reads in is Kokoro's alone.
    with pytest.raises(Exception, match="Kokoro reads en-us, en-gb, es, fr-fr, hi, it, pt-br"):
        from app.engine.binding import native_engine

        native = native_engine()
        model = native.Model(str(models.kokoro_path()), None)
        try:
            native.Context(model, "cpu", 1, None, None, 0, 1, None, "de")
        finally:
            model.close()


def test_a_catalogue_kokoro_voice_is_heard_before_it_is_installed(kokoro_hub, server, qtbot, tmp_path, monkeypatch):
    """Preview in the voice library: the pack from the hub (into the download cache, checked),
    spoken by the packaged model; nothing installed."""
    from app.core.settings import Settings
    from app.ui.main import StudioWindow

    monkeypatch.setenv("VOICESTUDIO_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings()
    settings["device"], settings["threads"] = "cpu", 2
    window = StudioWindow(settings, ask_recovery=False, persist=False)
    qtbot.addWidget(window)
    played = []
    monkeypatch.setattr(window, "_play_clip", lambda audio, rate: played.append((audio, rate)))
    window.voices.tree.setCurrentItem(window.voices.tree.findItems("kokoro:af_twin", Qt.MatchFlag.MatchExactly)[0])
    window.voices.preview.click()
    qtbot.waitUntil(lambda: bool(played), timeout=60_000)
    text = "This is af_twin, one of the voices of Voice Studio."
    with Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as engine:
        want = engine.synthesize(text=text)
    np.testing.assert_array_equal(played[0][0], want.audio)
    assert played[0][1] == want.sample_rate == 24000
    assert not models.is_installed("kokoro:af_twin") and not models.kokoro_pack_path("kokoro:af_twin").exists()
    # A pack the hub serves damaged is refused, and said so.
    server.commits[(KOKORO_REPO, json.loads(server.catalogue.read_text())["voices"][-1]["revision"])][
        "voices/bf_twin.bin"] = Blob(b"\0" * 522240)  # fmt: skip
    errors = []
    monkeypatch.setattr(window, "show_error", errors.append)
    window.preview_voice("kokoro:bf_twin")
    qtbot.waitUntil(lambda: bool(errors), timeout=30_000)
    assert "not the catalogue's" in str(errors[0]) and len(played) == 1
    window.close()
