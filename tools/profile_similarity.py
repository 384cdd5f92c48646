"""How close do speaker profiles get? For references that are no stock voice, the speaker
similarity (GE2E cosine) to the reference of every stock Kokoro voice and of the profile made
from it, all speaking held-out sentences the search never used.

    python tools/profile_similarity.py --seconds 60 --threads 2 --json-out profile_similarity.json

References: Piper joe (US male), espeak-ng's own synthesizer with two voice variants
(tools/espeak_say.py, in a subprocess). Each reference reads REFERENCE_TEXT (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine.engine import Engine  # noqa: E402
from app.models import manager as models  # noqa: E402
from app.profiles import builder as profile_builder  # noqa: E402
from app.profiles import style_search  # noqa: E402
from app.profiles.speaker_encoder import SpeakerEncoder, similarity  # noqa: E402
from app.profiles.speaker_reference import load  # noqa: E402

REFERENCE_TEXT = (
    "It was a bright cold day in April, and the clocks were striking thirteen. "
    "The old man sat by the window and watched the rain fall on the empty street. "
    "I never thought we would see the ocean again, she said quietly. "
    "Turn left at the second light, then follow the road past the school. "
    "Nobody knew where the letter had come from, or who had written it."
)
ESPEAK_VOICES = ("en-us+m3", "en+f2")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.machine()


def references(tmp: Path, threads: int) -> dict[str, tuple[np.ndarray, int]]:
    out = {}
    with Engine.open("piper:joe", device="cpu", threads=threads) as engine:
        take = engine.synthesize(text=REFERENCE_TEXT)
    out["piper:joe"] = (take.audio, take.sample_rate)
    for voice in ESPEAK_VOICES:
        wav = tmp / f"{voice}.wav"
        say = [sys.executable, str(ROOT / "tools" / "espeak_say.py"), voice, str(wav), REFERENCE_TEXT]
        subprocess.run(say, check=True)
        out[f"espeak-ng:{voice}"] = load(wav)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        refs = references(Path(tmp), args.threads)
    packs = models.kokoro_packs()
    heldout = " ".join(style_search.HELDOUT_SENTENCES)
    rows = []
    with (
        SpeakerEncoder.open(device=args.device, threads=args.threads) as enc,
        Engine.open("kokoro:jf_alpha", device=args.device, threads=args.threads) as engine,
    ):
        # The stock voices on the held-out sentences (independent of the reference).
        stock = {}
        for name, pack in packs.items():
            take = engine.synthesize(text=heldout, style=pack.reshape(-1, 256))
            stock[name] = enc.embed(take.audio, take.sample_rate)
    for ref_name, (audio, rate) in refs.items():
        settings = profile_builder.Settings(
            seconds=args.seconds, seed=args.seed, device=args.device, threads=args.threads, evaluate=False
        )
        t0 = time.perf_counter()
        draft = profile_builder.build(audio, rate, source={"reference": ref_name}, settings=settings)
        wall = time.perf_counter() - t0
        target = draft.embedding
        with (
            SpeakerEncoder.open(device=args.device, threads=args.threads) as enc,
            Engine.open("kokoro:jf_alpha", device=args.device, threads=args.threads) as engine,
        ):
            take = engine.synthesize(text=heldout, style=draft.pack.reshape(-1, 256))
            profile_sim = similarity(enc.embed(take.audio, take.sample_rate), target)
        stock_sims = {f"kokoro:{k}": similarity(v, target) for k, v in stock.items()}
        best = max(stock_sims, key=stock_sims.get)
        row = {
            "reference": ref_name,
            "reference_s": round(draft.reference.duration_s, 2),
            "stock_heldout": stock_sims,
            "best_stock": best,
            "best_stock_heldout": stock_sims[best],
            "profile_heldout": profile_sim,
            "gain": profile_sim - stock_sims[best],
            "search_similarity": draft.scores["search"]["similarity"],
            "evaluations": draft.search["evaluations"],
            "search_s": draft.search["elapsed_s"],
            "build_wall_s": wall,
            "base": draft.search["base"],
        }
        rows.append(row)
        print(
            f"{ref_name:<20} best stock {best} {row['best_stock_heldout']:.3f}  profile {profile_sim:.3f}"
            f"  gain {row['gain']:+.3f}  ({row['evaluations']} candidates in {row['search_s']:.0f} s)",
            flush=True,
        )
    mean_gain = float(np.mean([r["gain"] for r in rows]))
    print(f"mean gain {mean_gain:+.3f}")
    if args.json_out:
        report = {
            "machine": cpu_name(),
            "device": args.device,
            "threads": args.threads,
            "seconds": args.seconds,
            "seed": args.seed,
            "heldout_sentences": list(style_search.HELDOUT_SENTENCES),
            "search_sentences": list(style_search.SEARCH_SENTENCES),
            "rows": rows,
            "mean_gain": mean_gain,
        }
        args.json_out.write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
