"""`devices`, `voices`, `models`, `embed`, `similarity` and `profile`: what is installed and found,
speaker embeddings, profiles."""

from __future__ import annotations

import json
import sys


def cmd_devices(args) -> int:
    from app.engine.engine import devices

    found = devices()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for d in found:
        mem = f"{d['memory_free'] / 2**30:.1f}/{d['memory_total'] / 2**30:.1f} GiB free" if d["memory_total"] else ""
        print(f"{d['id']:<10} {d['type']:<5} {d['description']}  {mem}")
    return 0


def cmd_embed(args) -> int:
    from app.profiles.speaker_encoder import SpeakerEncoder

    with SpeakerEncoder.open(device=_cpu_if_auto(args.device), threads=args.threads) as enc:
        embedding = enc.embed_file(args.audio)
        timings, device = enc.last_timings, enc.device
    if args.json:
        report = {"audio": str(args.audio), "device": device, "embedding": [float(v) for v in embedding]}
        report["timings"] = timings
        print(json.dumps(report))
    else:
        print(" ".join(f"{v:.6f}" for v in embedding))
    return 0


def _cpu_if_auto(device: str) -> str:
    """The speaker encoder is small: "auto" keeps it on the CPU."""
    return "cpu" if device == "auto" else device


def cmd_similarity(args) -> int:
    from app.profiles.speaker_encoder import SpeakerEncoder, similarity

    with SpeakerEncoder.open(device=_cpu_if_auto(args.device), threads=args.threads) as enc:
        value = similarity(enc.embed_file(args.a), enc.embed_file(args.b))
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "similarity": value}))
    else:
        print(f"{value:.4f}")
    return 0


def _profile_row(p) -> dict:
    scores = p.meta.get("scores", {})
    return {
        "id": p.voice_id,
        "name": p.name,
        "family": p.family,
        "model": p.model,
        "created": p.meta.get("created"),
        "source": p.meta.get("source", {}),
        "scores": scores,
        "search": {k: v for k, v in p.meta.get("search", {}).items() if k not in ("history", "theta")},
    }


def cmd_profile(args) -> int:
    from app.profiles import speaker_reference
    from app.profiles import store as profiles

    if args.action == "list":
        found, broken = profiles.scan()
        rows = [_profile_row(p) for p in found]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                held = r["scores"].get("heldout", {})
                detail = ""
                if held:
                    detail = f"similarity {held['profile']:.3f} (best stock {held['best_stock']['similarity']:.3f})"
                print(f"{r['id']:<30} {r['model']:<17} {r['created'] or '':<26} {detail}")
        for _folder, reason in broken:
            print(f"warning: {reason}", file=sys.stderr)
        return 0
    if args.action == "delete":
        profiles.delete(args.name)
        print(f"deleted profile '{args.name}'")
        return 0
    if args.action == "rename":
        p = profiles.rename(args.name, args.new_name)
        print(f"renamed to {p.voice_id}")
        return 0
    if args.action == "export":
        print(profiles.export(args.name, args.out))
        return 0
    if args.action == "import":
        p = profiles.import_file(args.file, name=args.name)
        print(f"imported {p.voice_id}")
        return 0
    if args.action == "check":
        ref = speaker_reference.prepare(*speaker_reference.load(args.audio))
        checks = [{"name": c.name, "status": c.status, "value": c.value, "detail": c.detail} for c in ref.checks]
        if args.json:
            print(json.dumps({"usable": ref.usable, "duration_s": ref.duration_s, "checks": checks}, indent=2))
        else:
            for c in checks:
                print(f"{c['status']:<5} {c['name']:<12} {c['detail']}")
        return 0 if ref.usable else 1
    return _profile_create(args)


def _profile_create(args) -> int:
    from app.profiles import builder as profile_builder
    from app.profiles import speaker_reference
    from app.profiles import store as profiles

    recordings = [speaker_reference.load(path) for path in args.audio]
    if len(recordings) > 1 and args.family != "chatterbox":
        raise profiles.ProfileError("a Kokoro style search takes one recording; a clone takes several")
    settings = profile_builder.Settings(
        seconds=args.seconds, seed=args.seed, max_evaluations=args.evaluations,
        device=_cpu_if_auto(args.device), threads=args.threads, evaluate=not args.no_evaluate,
    )  # fmt: skip
    last = [0.0]

    def on_event(ev) -> None:
        now = ev.progress.elapsed_s if ev.progress else None
        if ev.progress is None or ev.progress.improved or now - last[0] >= 5.0:
            print(f"  {ev.stage}: {ev.message}", file=sys.stderr)
            last[0] = now or last[0]

    name = profiles.check_name(args.name)
    if profiles.exists(name) and not args.overwrite:
        raise profiles.ProfileError(f"a profile named '{name}' exists already (--overwrite replaces it)")
    (audio, rate), more = recordings[0], recordings[1:]
    source = {"file": args.audio[0].name} | ({"files": [p.name for p in args.audio]} if more else {})
    if args.family == "chatterbox":
        draft = profile_builder.clone(
            audio, rate, more=more, model=args.model, source=source, settings=settings, on_event=on_event
        )
    else:
        draft = profile_builder.build(audio, rate, source=source, settings=settings, on_event=on_event)
    profile = draft.save(name, overwrite=args.overwrite)
    row = _profile_row(profile)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    if profile.family == "chatterbox":
        preview = row["scores"].get("preview")
        said = f", preview similarity {preview['similarity']:.3f}" if preview else ""
        print(f"{profile.voice_id}: a clone for {profile.model} ({row['scores']['conditioning_s']:.1f} s{said})")
        return 0
    held = row["scores"].get("heldout")
    print(f"{profile.voice_id}: search similarity {row['scores']['search']['similarity']:.3f}")
    if held:
        print(
            f"  held-out similarity {held['profile']:.3f} vs best stock {held['best_stock']['voice']}"
            f" {held['best_stock']['similarity']:.3f} (gain {held['gain']:+.3f})"
        )
    return 0


def cmd_voices(args) -> int:
    from app.models import manager as models
    from app.profiles import store as profiles

    rows = []
    for voice_id in models.voice_ids():
        info = models.voice_info(voice_id)
        rows.append(
            {
                "id": voice_id,
                "family": info.family,
                "language": info.language,
                "sample_rate": info.sample_rate,
                "source_package": info.source_package,
                "licence": info.licence,
                "installed": info.installed,
            }
        )
    for p in profiles.list_profiles():
        clone = p.family == "chatterbox"
        rows.append(
            {
                "id": p.voice_id,
                "family": p.family,
                "language": "",
                "sample_rate": 24000,
                "source_package": f"speaker profile ({p.model})",
                "licence": "",
                "installed": models.chatterbox_installed(p.model) if clone else models.kokoro_installed(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        state = "installed" if r["installed"] else "not installed"
        rate = r["sample_rate"] or "-"
        print(f"{r['id']:<26} {r['family']:<10} {r['language']:<6} {rate:>6} Hz  {r['source_package']}  ({state})")
    return 0


def _list_models(models, as_json: bool) -> int:
    from app.models import hub

    catalogue = hub.catalogue()
    rows = []
    for voice_id in models.voice_ids():
        info = models.voice_info(voice_id)
        entry = catalogue.get(voice_id)
        rows.append({
            "voice": voice_id, "family": info.family, "language": info.language, "installed": info.installed,
            "source": info.source_package or "(official files, --from)", "licence": info.licence,
            "quality": entry.quality if entry else None, "download_bytes": entry.size if entry else None,
        })  # fmt: skip
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        size = f"{r['download_bytes'] / 1e6:.0f} MB" if r["download_bytes"] else ""
        mark = "installed" if r["installed"] else "-"
        print(f"{r['voice']:34} {r['language']:12} {mark:9} {size:>7}  {r['source']}  [{r['licence']}]")
    return 0


def cmd_models(args) -> int:
    from app.models import manager as models

    def progress(fraction: float, message: str) -> None:
        print(f"  [{fraction:4.0%}] {message}", file=sys.stderr)

    if args.action == "list":
        return _list_models(models, args.json)
    if args.action == "remove":
        for voice_id in args.voices:
            removed = models.remove(voice_id)
            print(f"{voice_id}: {'removed ' + ', '.join(p.name for p in removed) if removed else 'not installed'}")
        return 0
    for voice_id in args.voices or [*sorted(models.STOCK_VOICES), "kokoro", "speaker-encoder"]:
        options = {"weights": args.weights, "force": args.force, "progress": progress}
        # "kokoro": Kokoro-82M with all its voice packs; "speaker-encoder": the GE2E encoder of profiles.
        if voice_id in models.CHATTERBOX_MODELS:  # from its files (--from), else the catalogue's on the hub
            path = models.install_chatterbox(voice_id, args.source, **options)
        elif voice_id == "kokoro":
            path = models.install_kokoro(**options)
        elif voice_id == "speaker-encoder":
            path = models.install_speaker_encoder(force=args.force, progress=progress)
        else:
            path = models.install(voice_id, **options)
        print(f"{voice_id}: {path}")
    return 0
