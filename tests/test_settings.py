"""Settings: schema_version, migration, bad files set aside, atomic writes."""

import json

from app.core.settings import SCHEMA_VERSION, Settings


def test_round_trip_and_recent_projects(tmp_path):
    path = tmp_path / "settings.json"
    s = Settings()
    s["device"] = "CUDA0"
    for i in range(15):
        s.add_recent(tmp_path / f"p{i}.vsproj")
    s.add_recent(tmp_path / "p3.vsproj")
    s.save(path)
    loaded = Settings.load(path)
    assert loaded["device"] == "CUDA0" and loaded["schema_version"] == SCHEMA_VERSION
    assert len(loaded["recent_projects"]) == 10 and loaded["recent_projects"][0].endswith("p3.vsproj")
    assert not list(tmp_path.glob("*.part"))


def test_old_layout_is_migrated_and_unknown_keys_kept(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"last_voice": "kokoro:jf_alpha", "threads": "many", "future_key": 1}))
    s = Settings.load(path)
    assert s["voice"] == "kokoro:jf_alpha"
    assert s["threads"] == 0  # wrong type: default
    assert s.values["future_key"] == 1
    assert s["schema_version"] == SCHEMA_VERSION


def test_unreadable_file_is_set_aside(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{ not json")
    s = Settings.load(path)
    assert s["voice"] == "piper:joe"
    assert (tmp_path / "settings.json.bad").read_text() == "{ not json"
