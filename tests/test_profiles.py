"""Speaker profiles on disk, the style search's determinism, and profile voices."""

import json
import zipfile

import numpy as np
import pytest

from app.engine.engine import Engine
from app.engine.errors import InvalidArgumentError
from app.models import manager as models
from app.profiles import store as profiles
from app.profiles import style_search
from app.profiles.speaker_encoder import SpeakerEncoder
from app.profiles.voices import open_engine


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty data dir whose models folder is the real one (voices stay installed)."""
    models_dir = models.paths.models_dir()
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(models.paths, "models_dir", lambda: models_dir)
    return tmp_path


def _save(name, seed=0, **kw):
    rng = np.random.default_rng(seed)
    pack = rng.standard_normal((510, 1, 256)).astype(np.float32) * 0.1
    embedding = rng.random(256).astype(np.float32)
    embedding /= np.linalg.norm(embedding)
    reference = (0.1 * rng.standard_normal(48000)).astype(np.float32)
    return profiles.save(
        name, reference=reference, sample_rate=48000, pack=pack, embedding=embedding,
        source={"file": "me.wav"}, checks=[{"name": "duration", "status": "pass", "value": 12.0, "detail": "12 s"}],
        scores={"search": {"similarity": 0.7}}, search={"seed": seed}, **kw,
    )  # fmt: skip


def test_profile_round_trips(store):
    saved = _save("Ana María")
    loaded = profiles.load("profile:Ana María")
    assert loaded.voice_id == "profile:Ana María"
    np.testing.assert_array_equal(loaded.pack, saved.pack)
    np.testing.assert_array_equal(loaded.embedding, saved.embedding)
    assert loaded.meta["schema_version"] == profiles.SCHEMA_VERSION
    assert loaded.meta["checks"][0]["status"] == "pass"
    audio, rate = loaded.reference()
    assert rate == 48000 and len(audio) == 48000
    assert [p.name for p in profiles.list_profiles()] == ["Ana María"]
    assert not any(p.name.startswith(".") for p in profiles.profiles_dir().iterdir())  # no temporary left


def test_names_are_unique_and_checked(store):
    _save("Bo")
    with pytest.raises(profiles.ProfileError, match="exists already"):
        _save("Bo")
    _save("Bo", seed=1, overwrite=True)
    assert profiles.load("Bo").meta["search"]["seed"] == 1
    assert len(profiles.list_profiles()) == 1
    for bad in ("", "   ", "a/b", "x" * 65, "tab\there"):
        with pytest.raises(profiles.ProfileError):
            _save(bad)
    with pytest.raises(profiles.ProfileError, match="no profile named 'Cy'.*Bo"):
        profiles.load("Cy")


def test_rename_delete_export_import(store, tmp_path):
    _save("Di")
    profiles.rename("Di", "Dee")
    assert [p.name for p in profiles.list_profiles()] == ["Dee"]
    exported = profiles.export("Dee", tmp_path / "dee")
    assert exported.suffix == ".vsprofile" and zipfile.is_zipfile(exported)
    with pytest.raises(profiles.ProfileError, match="exists already"):
        profiles.import_file(exported)
    copy = profiles.import_file(exported, name="Dee 2")
    np.testing.assert_array_equal(copy.pack, profiles.load("Dee").pack)
    profiles.delete("Dee")
    assert [p.name for p in profiles.list_profiles()] == ["Dee 2"]
    with pytest.raises(profiles.ProfileError):
        profiles.delete("Dee")


def test_damaged_profiles_get_clear_errors(store, tmp_path):
    p = _save("Ed")
    (p.folder / "style.npy").write_bytes(b"not numpy")
    with pytest.raises(profiles.ProfileError, match="'Ed' is damaged"):
        profiles.load("Ed")
    assert profiles.list_profiles() == [] and "damaged" in profiles.damaged()[0][1]

    p = _save("Flo")
    np.save(p.folder / "style.npy", np.zeros((10, 256), dtype=np.float32))
    with pytest.raises(profiles.ProfileError, match="expected \\(510, 1, 256\\)"):
        profiles.load("Flo")

    p = _save("Gus")
    meta = json.loads((p.folder / "profile.json").read_text())
    (p.folder / "profile.json").write_text(json.dumps(dict(meta, schema_version=99)))
    with pytest.raises(profiles.ProfileError, match="schema version 99"):
        profiles.load("Gus")

    p = _save("Hal")
    (p.folder / "embedding.npy").unlink()
    with pytest.raises(profiles.ProfileError, match="embedding.npy is missing"):
        profiles.load("Hal")

    (tmp_path / "junk.vsprofile").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(profiles.ProfileError, match="not a profile file"):
        profiles.import_file(tmp_path / "junk.vsprofile")


def test_a_profile_speaks_with_its_own_pack(store):
    packs = models.kokoro_packs()
    pack = 0.5 * (packs["jf_alpha"] + packs["jm_kumo"])
    _save("Ivy")
    profiles.save(
        "Ivy", reference=np.zeros(4800, dtype=np.float32), sample_rate=48000, pack=pack,
        embedding=np.ones(256, dtype=np.float32) / 16, source={}, checks=[], scores={}, search={}, overwrite=True,
    )  # fmt: skip
    text = "The river ran fast after the rain."
    with open_engine("profile:Ivy", device="cpu", threads=2) as eng:
        mine = eng.synthesize(text=text).audio
        explicit = eng.synthesize(text=text, style=pack.reshape(510, 256)).audio
        alpha = eng.synthesize(text=text, style=packs["jf_alpha"].reshape(510, 256)).audio
    np.testing.assert_array_equal(mine, explicit)
    assert len(mine) != len(alpha) or not np.array_equal(mine, alpha)


def test_search_is_deterministic_for_a_seed():
    packs = models.kokoro_packs()
    with (
        SpeakerEncoder.open(device="cpu", threads=2) as enc,
        Engine.open("kokoro:jf_alpha", device="cpu", threads=2) as eng,
    ):
        take = eng.synthesize(text="A short reference sentence for the test.", style=packs["jm_kumo"].reshape(510, 256))
        target = style_search.Target.from_audio(enc, take.audio, take.sample_rate)
        small = {k: packs[k] for k in ("jf_alpha", "jm_kumo")}
        runs = []
        for seed in (7, 7, 8):
            seen = []
            result = style_search.search(
                eng, enc, target, small, seconds=0, max_evaluations=10, seed=seed, sentences=("Good morning.",),
                on_progress=lambda p, seen=seen: seen.append(p.current.total),
            )  # fmt: skip
            runs.append((result, seen))
    (a, seen_a), (b, seen_b), (c, seen_c) = runs
    # 2 stock voices, their blend, 3 candidates, then the start and the best (at most 3) in range
    # on a second sentence.
    assert a.evaluations == b.evaluations and 7 <= a.evaluations <= 10 and len(seen_a) == 6
    assert seen_a == seen_b  # every candidate scored the same
    np.testing.assert_array_equal(a.pack, b.pack)
    assert a.theta == b.theta
    assert seen_a[:3] == seen_c[:3]  # stock voices and their blend do not depend on the seed
    assert seen_a[3:] != seen_c[3:]  # the search's candidates do
    assert a.stock_scores["jm_kumo"] > a.stock_scores["jf_alpha"]  # the reference is jm_kumo
    assert a.best.total in seen_a  # the winner is one of the scored candidates


def test_search_needs_a_budget_and_stock_styles():
    with pytest.raises(InvalidArgumentError):
        style_search.search(None, None, None, {}, seconds=60)
    with pytest.raises(InvalidArgumentError):
        style_search.search(None, None, None, {"a": np.zeros((510, 1, 256))}, seconds=0)


def _clone(name, seed=0, model="chatterbox-turbo", **kw):
    from app.engine.chatterbox import Conditionals

    rng = np.random.default_rng(seed)
    conditionals = Conditionals(
        rng.standard_normal(256).astype(np.float32), rng.integers(0, 6561, 150), rng.integers(0, 6561, 250),
        rng.standard_normal((80, 500)).astype(np.float32), rng.standard_normal(192).astype(np.float32),
    )  # fmt: skip
    reference = (0.1 * rng.standard_normal(48000)).astype(np.float32)
    return profiles.save_clone(
        name, reference=reference, sample_rate=48000, conditionals=conditionals, model=model,
        source={"file": "me.wav"}, checks=[], scores={}, **kw,
    )  # fmt: skip


def test_a_clone_keeps_its_conditionals_and_travels_whole(store, tmp_path):
    saved = _clone("Ivy")
    loaded = profiles.load("Ivy")
    assert loaded.family == "chatterbox" and loaded.model == "chatterbox-turbo" and loaded.pack is None
    for part in ("speaker_embedding", "prompt_tokens", "gen_prompt_tokens", "prompt_mel", "xvector"):
        np.testing.assert_array_equal(getattr(loaded.conditionals, part), getattr(saved.conditionals, part))
    assert sorted(f.name for f in loaded.folder.iterdir()) == ["conditionals.npz", "profile.json", "reference.flac"]
    copy = profiles.import_file(profiles.export("Ivy", tmp_path / "ivy"), name="Ivy 2")
    np.testing.assert_array_equal(copy.conditionals.prompt_mel, saved.conditionals.prompt_mel)
    # A Kokoro profile beside it keeps its own files; one without a family reads as Kokoro's.
    kokoro = _save("Jo")
    meta = json.loads((kokoro.folder / "profile.json").read_text())
    (kokoro.folder / "profile.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "family"}))
    assert profiles.load("Jo").family == "kokoro" and profiles.load("Jo").model == "kokoro"


def test_a_damaged_clone_is_refused_with_a_reason(store):
    from app.engine.chatterbox import Conditionals

    p = _clone("Kim")
    (p.folder / "conditionals.npz").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(profiles.ProfileError, match="'Kim' is damaged: conditionals.npz"):
        profiles.load("Kim")
    p = _clone("Lu")
    c = p.conditionals
    Conditionals(c.speaker_embedding, c.prompt_tokens, c.gen_prompt_tokens, c.prompt_mel[:, :7], c.xvector).save(
        p.folder / "conditionals.npz"
    )
    with pytest.raises(profiles.ProfileError, match="not a Chatterbox voice's"):
        profiles.load("Lu")
    p = _clone("Mo")
    meta = json.loads((p.folder / "profile.json").read_text())
    (p.folder / "profile.json").write_text(json.dumps(dict(meta, model="tortoise")))
    with pytest.raises(profiles.ProfileError, match="no Chatterbox model"):
        profiles.load("Mo")
    (p.folder / "profile.json").write_text(json.dumps(dict(meta, family="bark")))
    with pytest.raises(profiles.ProfileError, match="family 'bark'"):
        profiles.load("Mo")
    with pytest.raises(profiles.ProfileError, match="no Chatterbox model"):
        _clone("Ned", model="kokoro")
