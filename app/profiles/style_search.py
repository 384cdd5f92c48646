"""Find a Kokoro style that sounds like a reference speaker.

Kokoro's voice is a pack of 256-value style rows (row n styles a sentence of n + 1
phonemes; values 0-127 condition the decoder, i.e. timbre, 128-255 the predictor, i.e.
durations and pitch). A profile's pack is the most similar stock pack (or a blend of the two
most similar) plus one offset added to every row, found by a (1+1) evolution strategy:

- the offset lives in the span of the stock packs' 8 principal directions (their rows
  pooled), in units of each direction's spread, within a ball of radius 4 (``RADIUS``);
- each candidate speaks one fixed sentence (about 3.2 s of audio; on a 2-core CPU a
  candidate costs about 2.2 s, so a 60 s budget scores about 25); its score is the GE2E
  similarity of that audio to the reference, less small penalties for a median F0 and a
  speaking rate unlike the reference's (``score_features``); a candidate that makes the
  sentence much shorter or longer than the start does is rejected (far from the stock
  styles the similarity rewards voices that drawl a sentence over many seconds);
- at the end the start and the best three candidates speak a second sentence and the best
  mean of both scores wins (``validate``): the search sentence alone overstates the gain;
- the stock voices' features do not depend on the reference and are cached (``StockCache``);
- deterministic for a seed: two runs with the same seed score the same candidates in the
  same order (the engine is deterministic for one device and thread count); the time budget
  (or ``max_evaluations``) only decides how many run. Cancelling keeps the best so far.

tools/profile_similarity.py measures profiles against the stock voices on held-out
sentences.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.engine.errors import CancelledError, InvalidArgumentError
from app.profiles import prosody
from app.profiles.speaker_encoder import SpeakerEncoder, similarity

# Sentences each candidate speaks (search) and those only the final report uses (held out).
SEARCH_SENTENCES = ("Could you bring the blue folder to my office?",)
# At the end the best few candidates and the start speak this too; the best on both wins.
VALIDATION_SENTENCES = ("Thank you, Anna.",)
HELDOUT_SENTENCES = (
    "The weather turned cold just before the long weekend.",
    "We walked along the river until the lights came on.",
    "Every morning he reads the news with a cup of tea.",
)
N_DIRECTIONS = 8  # principal directions of the stock styles searched over
F0_WEIGHT = 0.05  # score lost per octave between the candidate's median F0 and the reference's
RATE_WEIGHT = 0.05  # score lost per e-fold between speaking rates
# Candidates stay near the stock styles: offsets within RADIUS spreads, steps of at most
# SIGMA_MAX, and the search sentence no shorter or longer than LENGTH_LIMITS times the start's.
# Far out, the similarity rewards styles that drawl one sentence over many seconds.
RADIUS = 4.0
SIGMA_MAX = 2.0
LENGTH_LIMITS = (0.8, 1.25)
REJECTED = -1.0  # the score of a candidate outside the length limits
PACK_ROWS, STYLE_DIM = 510, 256


@dataclass
class Target:
    """What a candidate is compared with: the reference's embedding, median F0, speaking rate."""

    embedding: np.ndarray
    f0_hz: float | None
    rate: float | None

    @classmethod
    def from_audio(cls, encoder: SpeakerEncoder, audio: np.ndarray, rate: int) -> Target:
        f = Features.of(encoder, audio, rate)
        return cls(f.embedding, f.f0_hz, f.rate)


@dataclass
class Score:
    total: float
    similarity: float
    f0_hz: float | None
    rate: float | None


@dataclass(frozen=True)
class Features:
    """What a candidate's audio is scored on."""

    embedding: np.ndarray
    f0_hz: float | None
    rate: float | None
    duration_s: float

    @classmethod
    def of(cls, encoder: SpeakerEncoder, audio: np.ndarray, rate: int) -> Features:
        from app.core.export import resample

        # The encoder and the prosody measures all work at 16 kHz: resample once.
        a16 = resample(np.asarray(audio, dtype=np.float32), rate, prosody.RATE)
        return cls(
            encoder.embed(a16, prosody.RATE),
            prosody.median_f0(a16, prosody.RATE),
            prosody.speaking_rate(a16, prosody.RATE),
            len(audio) / rate,
        )


def score_features(target: Target, features: Features) -> Score:
    sim = similarity(features.embedding, target.embedding)
    f0, speed = features.f0_hz, features.rate
    total = sim
    if target.f0_hz and f0:
        total -= F0_WEIGHT * abs(np.log2(f0 / target.f0_hz))
    if target.rate and speed:
        total -= RATE_WEIGHT * abs(np.log(speed / target.rate))
    return Score(float(total), float(sim), f0, speed)


def style_basis(packs: dict[str, np.ndarray], n: int = N_DIRECTIONS) -> np.ndarray:
    """[n, 256]: the stock styles' principal directions, each scaled to its standard deviation."""
    rows = np.concatenate([p.reshape(-1, STYLE_DIM) for p in packs.values()]).astype(np.float64)
    rows -= rows.mean(axis=0)
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    std = s / np.sqrt(len(rows) - 1)
    return (vt[:n] * std[:n, None]).astype(np.float32)


@dataclass
class Progress:
    evaluations: int
    elapsed_s: float
    best: Score
    current: Score
    best_audio: np.ndarray | None = None  # the best candidate's search audio, when it improved
    improved: bool = False


@dataclass
class Result:
    pack: np.ndarray  # [510, 1, 256]
    base: str  # the stock voice (or "a+b" blend) the offset starts from
    stock_scores: dict[str, float]
    best: Score
    history: list[tuple[float, float]] = field(default_factory=list)  # (elapsed s, best score)
    evaluations: int = 0
    elapsed_s: float = 0.0
    cancelled: bool = False
    theta: list[float] = field(default_factory=list)


class StockCache:
    """Features of fixed packs speaking fixed sentences, kept in a JSON file. Entries are
    valid for one model file, engine, device and sentence list (``identity``)."""

    def __init__(self, path, identity: dict):
        import hashlib
        import json

        self.path = path
        self.key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        self.entries: dict[str, Features] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("key") == self.key:
                for name, e in data.get("entries", {}).items():
                    embedding = np.asarray(e["embedding"], dtype=np.float32)
                    self.entries[name] = Features(embedding, e["f0_hz"], e["rate"], e["duration_s"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.entries = {}

    def get(self, name: str) -> Features | None:
        return self.entries.get(name)

    def put(self, name: str, features: Features) -> None:
        import json

        from app.core.atomic import write_bytes_atomic

        self.entries[name] = features
        data = {
            "key": self.key,
            "entries": {
                n: {
                    "embedding": [float(v) for v in f.embedding],
                    "f0_hz": f.f0_hz,
                    "rate": f.rate,
                    "duration_s": f.duration_s,
                }
                for n, f in self.entries.items()
            },
        }
        try:
            write_bytes_atomic(self.path, json.dumps(data).encode())
        except OSError:
            pass  # a cache that cannot be written only costs time


class OnePlusOne:
    """(1+1)-ES with the one-fifth success rule: one candidate at a time around the best;
    the step grows by 1.5 on a success and shrinks by 1.5^(1/4) on a failure."""

    def __init__(self, dim: int, sigma: float, rng: np.random.Generator, best: float = -np.inf):
        self.n, self.sigma, self.rng = dim, sigma, rng
        self.mean = np.zeros(dim)
        self.best = best

    def ask(self) -> np.ndarray:
        x = self.mean + self.sigma * self.rng.standard_normal(self.n)
        norm = float(np.linalg.norm(x))
        return x * (RADIUS / norm) if norm > RADIUS else x

    def tell(self, x: np.ndarray, fitness: float) -> None:
        if fitness > self.best:
            self.best, self.mean = float(fitness), x
            self.sigma = min(SIGMA_MAX, self.sigma * 1.5)
        else:
            self.sigma *= 1.5**-0.25


def make_pack(base: np.ndarray, basis: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """[510, 1, 256]: every row of ``base`` plus the offset ``theta @ basis``."""
    offset = np.asarray(theta, dtype=np.float32) @ basis
    return (base.reshape(PACK_ROWS, STYLE_DIM) + offset).astype(np.float32).reshape(PACK_ROWS, 1, STYLE_DIM)


def search(
    engine,
    encoder: SpeakerEncoder,
    target: Target,
    packs: dict[str, np.ndarray],
    *,
    seconds: float = 60.0,
    max_evaluations: int | None = None,
    seed: int = 0,
    sigma: float = 1.0,
    sentences: tuple[str, ...] = SEARCH_SENTENCES,
    on_progress: Callable[[Progress], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    stock_cache: StockCache | None = None,
    validate: int = 3,
) -> Result:
    """Search a pack for ``target``. ``engine``: an open Kokoro Engine. ``packs``: the stock
    packs by name ([510, 1, 256] or [510, 256]). ``stock_cache``: features of the stock
    voices speaking ``sentences`` from earlier searches (they do not depend on the target);
    a cached stock voice costs no synthesis."""
    if not packs:
        raise InvalidArgumentError("no stock styles to start from")
    if seconds <= 0 and not max_evaluations:
        raise InvalidArgumentError("the search needs a time budget or a number of evaluations")
    text = " ".join(sentences)
    t0 = time.perf_counter()
    history: list[tuple[float, float]] = []
    evaluations = 0
    best: Score | None = None
    best_pack: np.ndarray | None = None
    best_theta = np.zeros(0)
    best_duration = base_duration = 0.0

    tried: list[tuple[Score, np.ndarray, np.ndarray]] = []  # the search's candidates in range
    spent: list[float] = []  # seconds per synthesized candidate

    def out_of_budget(reserve: int = 0) -> bool:
        """Out of budget, keeping ``reserve`` evaluations for the validation."""
        if max_evaluations is not None and evaluations + reserve >= max_evaluations:
            return True
        per_eval = float(np.mean(spent)) if spent else 0.0
        return seconds > 0 and time.perf_counter() - t0 + reserve * per_eval >= seconds

    def features_of(pack: np.ndarray, key: str | None, sentences_text: str) -> tuple[Features, np.ndarray | None]:
        features, audio = (stock_cache.get(key) if stock_cache is not None and key else None), None
        if features is None:
            t = time.perf_counter()
            take = engine.synthesize(text=sentences_text, style=pack.reshape(PACK_ROWS, STYLE_DIM), cancelled=cancelled)
            audio = take.audio
            features = Features.of(encoder, take.audio, take.sample_rate)
            spent.append(time.perf_counter() - t)
            if stock_cache is not None and key:
                stock_cache.put(key, features)
        return features, audio

    def evaluate(pack: np.ndarray, theta: np.ndarray, key: str | None = None) -> Score:
        """Score a candidate; ``key`` names a stock voice whose features may be cached."""
        nonlocal evaluations, best, best_pack, best_theta, best_duration
        if cancelled and cancelled():
            raise CancelledError("style search cancelled")
        features, audio = features_of(pack, key, text)
        s = score_features(target, features)
        if len(theta) and not (
            LENGTH_LIMITS[0] * base_duration <= features.duration_s <= LENGTH_LIMITS[1] * base_duration
        ):
            s = Score(REJECTED, s.similarity, s.f0_hz, s.rate)
        elif len(theta):
            tried.append((s, pack, np.asarray(theta, dtype=np.float64)))
        evaluations += 1
        improved = best is None or s.total > best.total
        if improved:
            best, best_pack, best_theta = s, pack, np.asarray(theta, dtype=np.float64)
            best_duration = features.duration_s
        elapsed = time.perf_counter() - t0
        history.append((elapsed, best.total))
        if on_progress:
            on_progress(Progress(evaluations, elapsed, best, s, audio if improved else None, improved))
        return s

    stock_scores: dict[str, float] = {}
    base_name, base = "", None
    was_cancelled = False
    try:
        # 1. The stock voices, then a blend of the two closest.
        for name in sorted(packs):
            pack = np.asarray(packs[name], dtype=np.float32).reshape(PACK_ROWS, 1, STYLE_DIM)
            s = evaluate(pack, np.zeros(0), key=name)
            stock_scores[name] = s.total
            if best_pack is pack:
                base_name, base = name, pack
        ranked = sorted(stock_scores, key=stock_scores.get, reverse=True)
        if len(ranked) > 1 and not out_of_budget():
            a, b = ranked[:2]
            blend = 0.5 * (packs[a].reshape(PACK_ROWS, 1, STYLE_DIM) + packs[b].reshape(PACK_ROWS, 1, STYLE_DIM))
            before = best_pack
            evaluate(blend.astype(np.float32), np.zeros(0), key=f"{a}+{b}")
            if best_pack is not before:
                base_name, base = f"{a}+{b}", best_pack
        # 2. A (1+1)-ES over an offset to every row of the base.
        base_duration = best_duration
        basis = style_basis(packs)
        es = OnePlusOne(len(basis), sigma, np.random.default_rng(seed), best.total)  # the base is the best so far
        best_theta = np.zeros(len(basis))
        base_score = best
        reserve = validate + 1 if validate else 0
        while not out_of_budget(reserve):
            x = es.ask()
            es.tell(x, evaluate(make_pack(base, basis, x), x).total)
        # 3. The start and the best few candidates speak another sentence; the best mean wins.
        if validate and tried:
            val_text = " ".join(VALIDATION_SENTENCES)
            top = sorted(tried, key=lambda c: c[0].total, reverse=True)[:validate]
            choices = [(base_score, base, np.zeros(len(basis)), f"validation:{base_name}"), *[(*c, None) for c in top]]
            ranked_choices = []
            for score_, pack, theta, key in choices:
                if cancelled and cancelled():
                    raise CancelledError("style search cancelled")
                features, _ = features_of(pack, key, val_text)
                evaluations += 1
                ranked_choices.append(
                    (0.5 * (score_.total + score_features(target, features).total), score_, pack, theta)
                )
            _, best, best_pack, best_theta = max(ranked_choices, key=lambda c: c[0])
    except CancelledError:
        was_cancelled = True
        if best_pack is None:
            raise
    return Result(
        pack=best_pack,
        base=base_name,
        stock_scores=stock_scores,
        best=best,
        history=history,
        evaluations=evaluations,
        elapsed_s=time.perf_counter() - t0,
        cancelled=was_cancelled,
        theta=[float(v) for v in best_theta],
    )
