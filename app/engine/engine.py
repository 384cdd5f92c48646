"""The engine wrapper: open a voice on a device, synthesize, read timings.

    with Engine.open("piper:joe", device="cpu", threads=2) as engine:
        take = engine.synthesize(text="Hello.")
        take.audio, take.sample_rate, take.timings

Qt-free; safe to call from a worker thread (the native call releases the GIL).
One Engine must be used by one thread at a time.
"""

from __future__ import annotations

import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine.binding import native_engine
from app.engine.errors import InvalidArgumentError, ModelFileError
from app.engine.espeak import espeak_paths
from app.models import manager as models

# Punctuation the front ends read as pauses and intonation, or on purpose not at all: never
# reported as unspoken (Engine.unspoken).
_PROSODY = frozenset(".,;:!?¿¡…'\"“”‘’„«»‹›()[]{}-‐‑–—―/\\*_~`|")

# The stages each model family runs, in order (the engine reports the same per model).
STAGES_BY_FAMILY = {
    "piper": ("phonemize", "encoder", "duration", "flow", "decoder"),
    "kokoro": ("phonemize", "bert", "duration", "prosody", "text_encoder", "decoder", "generator"),
    "chatterbox": ("tokens", "encoder", "flow", "generator"),
}


MAX_INPUT_CHARS = 1_000_000
MAX_BATCH = 4096
# Synthesis parameters the voices are trained around: noise from 0 (none) up, and a length
# scale (1 / speed) from 20 times faster to 20 times slower.
NOISE_RANGE = (0.0, 10.0)
LENGTH_SCALE_RANGE = (0.05, 20.0)
MAX_WORKERS = 16  # the engine's VS_MAX_WORKERS
AUTO_WORKERS = 4  # its VS_AUTO_WORKERS: workers=None on a CUDA device with 16 GiB free

_log_lock = threading.Lock()
_log_sinks: dict[int, list[str]] = {}


def _on_log(level: int, text: str) -> None:
    with _log_lock:
        sink = _log_sinks.get(threading.get_ident())
        if sink is not None:
            sink.append(text)
            return
    if level >= 1:
        import logging

        logging.getLogger("voicestudio.engine").warning(text)


def devices() -> list[dict]:
    return native_engine().devices()


@dataclass(frozen=True)
class EngineDebug:
    """Switches for tests and diagnostics (the engine's ``vs_context_params.debug``); the
    defaults are what a user's synthesis runs with."""

    # Build the graphs an accelerator runs even on the CPU (to test them where there is none).
    device_graphs: bool = False
    # A device's limits to build graphs within, as a node trace's first line gives them:
    # "<MiB>[,<matmul 4d 0|1>[,<strided matmul 0|1>[,<out_prod 0|1>]]]". "": the device's own.
    device_limits: str = ""
    # The engine's own CUDA and CPU kernels where they apply (False: every stage in ggml's ops).
    engine_kernels: bool = True
    # Their convolutions in 16-bit integers where the CPU's kernels have them (False: floats).
    int16_kernels: bool = True
    # On CUDA, capture no graphs of the engine's kernels, nor tag ggml's (with ggml's own
    # GGML_CUDA_DISABLE_GRAPHS set too, every kernel is launched one by one).
    captures: bool = True
    # Keep each stage's graphs between calls: None only on CUDA, or never / on any device.
    keep_graphs: bool | None = None
    kept_graphs_mib: int | None = None  # the most memory kept graphs hold; None: 1024
    staging_kib: int | None = None  # CUDA's pinned staging memory; None: 4096; 0: none
    wait_each_graph: bool = False  # on CUDA, wait for each graph before the next
    node_trace: Path | str | None = None  # a file for the nodes of graphs run while profiling

    def native(self) -> dict:
        out: dict = {
            "device_graphs": self.device_graphs,
            "no_engine_kernels": not self.engine_kernels,
            "no_int16_kernels": not self.int16_kernels,
            "no_captures": not self.captures,
            "keep_graphs": -1 if self.keep_graphs is None else int(self.keep_graphs),
            "kept_graphs_mib": -1 if self.kept_graphs_mib is None else self.kept_graphs_mib,
            "staging_kib": -1 if self.staging_kib is None else self.staging_kib,
            "wait_each_graph": self.wait_each_graph,
        }
        if self.node_trace is not None:
            out["node_trace"] = str(self.node_trace)
        if self.device_limits:
            fields = [int(v) for v in self.device_limits.split(",")]
            if not 1 <= len(fields) <= 4 or fields[0] <= 0:
                raise InvalidArgumentError(f"device limits '{self.device_limits}': <MiB>[,0|1[,0|1[,0|1]]]")
            flags = [*(bool(v) for v in fields[1:]), True, True, True][:3]
            out["limit_tensor_mib"] = fields[0]
            out["limit_matmul_4d"], out["limit_strided_matmul"], out["limit_out_prod"] = flags
        return out


@dataclass
class Take:
    audio: np.ndarray  # float32, mono
    sample_rate: int
    timings: dict
    device: str
    threads: int
    warnings: list[str] = field(default_factory=list)
    # Each token's frames, where the take is one chunk of a voice that has them (Piper, Kokoro).
    durations: np.ndarray | None = None

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def rtf(self) -> float:
        return self.timings["total_ms"] / 1000.0 / max(self.duration_s, 1e-9)


class Engine:
    def __init__(self, model, context, voice_id: str, load_ms: float):
        self._model = model
        self._context = context
        self.voice_id = voice_id
        self.load_ms = load_ms
        self.style = models.style_name(voice_id)  # the stock style pack it speaks with (Kokoro)
        self.pack: np.ndarray | None = None  # a profile's own pack ([510, 256]), used unless a style is given
        self.conditionals = None  # a Chatterbox profile's voice (app.engine.chatterbox.Conditionals)
        self.stages = STAGES_BY_FAMILY["chatterbox"] if model.arch == "chatterbox" else tuple(model.stages)
        self._spoken: dict[str, bool] = {}  # symbol -> whether the front end reads it (unspoken)

    @classmethod
    def open(
        cls,
        voice: str = "piper:joe",
        *,
        device: str = "auto",
        threads: int = 0,
        model_path: Path | str | None = None,
        progress: Callable[[float], bool | None] | None = None,
        prewarm: bool | None = None,
        workers: int | None = 1,
        debug: EngineDebug | None = None,
        pack: np.ndarray | None = None,
        clone: tuple[str, object] | None = None,
    ) -> Engine:
        """``prewarm``: synthesize while opening (off the CPU, seven sentences from one word to
        17 s; twice where ggml captures graphs), so that the first real take is not the slow
        one and every stage's ops are checked against the device (``fallback_ops``).
        None: only on a GPU or other accelerator.
        ``workers``: contexts on the device, a thread each, that a batch's sentences are divided
        between (``synthesize_many``, ``synthesize`` with ``batch`` > 1), so that one's host
        work overlaps the others' device work; the audio is the same. None: ``AUTO_WORKERS`` on
        a CUDA device with 16 GiB free, 2 with 8, else 1 (on Vulkan, ggml serializes
        contexts and workers were slower).
        ``debug``: switches for tests and diagnostics (``EngineDebug``).
        ``pack``: a style pack of Kokoro's layout ([510, 256]) to speak with, a speaker
        profile's (app.profiles opens those); ``voice`` then names the profile.
        ``clone``: (a Chatterbox model's id, the Conditionals of a voice) to speak in, a
        Chatterbox profile's; ``voice`` then names the profile."""
        native = native_engine()
        native.set_log_handler(_on_log)
        if pack is None and models.is_kokoro_hub(voice):  # a catalogue voice's pack, beside the model
            model_path = model_path or models.installed_path(voice)
            pack = models.kokoro_pack(voice)
        if pack is not None:
            pack = np.asarray(pack, np.float32).reshape(-1, 256)
            path = Path(model_path) if model_path else models.installed_path("kokoro:" + models.KOKORO_VOICES[0])
        elif clone is not None:
            path = Path(model_path) if model_path else models.installed_path(f"{clone[0]}:{models.CHATTERBOX_VOICE}")
        else:
            path = Path(model_path) if model_path else models.installed_path(voice)
        t0 = time.perf_counter()
        model = native.Model(str(path), progress)
        load_ms = (time.perf_counter() - t0) * 1000.0
        try:
            if pack is not None or models.is_kokoro(voice):
                expected = "kokoro"
            elif clone is not None or models.is_chatterbox(voice):
                expected = "chatterbox"
            else:
                expected = models.lookup(voice).family
            if model.arch != expected:
                raise ModelFileError(f"{path.name} holds a {model.arch} model, not the {expected} voice '{voice}'")
            library, data = espeak_paths()
            context = native.Context(
                model,
                device,
                threads,
                library,
                data,
                -1 if prewarm is None else int(prewarm),
                -1 if workers is None else _check_workers(workers),
                None if debug is None else debug.native(),
                models.kokoro_language(voice) if expected == "kokoro" else None,
            )
        except BaseException:
            model.close()
            raise
        engine = cls(model, context, voice, load_ms)
        engine.pack = pack
        engine.conditionals = None if clone is None else clone[1]
        return engine

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._model is not None:
            self._model.close()
            self._model = None

    @property
    def sample_rate(self) -> int:
        return self._model.sample_rate

    @property
    def device(self) -> str:
        return self._context.device

    @property
    def threads(self) -> int:
        return self._context.threads

    @property
    def workers(self) -> int:
        return self._context.workers

    @property
    def fallback_stages(self) -> list[str]:
        return list(self._context.fallback_stages)

    @property
    def fallback_ops(self) -> dict[str, list[str]]:
        """Per stage, the ops that ran on the CPU instead of the chosen device ("OP(type)");
        filled by the prewarm on open and by every synthesis since."""
        return {stage: list(ops) for stage, ops in self._context.fallback_ops.items()}

    @property
    def prewarm_ms(self) -> float:
        return self._context.prewarm_ms

    def set_op_profiling(self, on: bool) -> None:
        """Time every graph node on its own (slow; for finding where a device spends its time)."""
        self._context.set_op_profiling(bool(on))

    def op_profile(self) -> list[dict]:
        """Since profiling was turned on: per stage and op, nodes computed and milliseconds."""
        return [
            {"stage": stage, "op": op, "count": count, "ms": ms} for stage, op, count, ms in self._context.op_profile()
        ]

    def meta(self, key: str) -> str | None:
        return self._model.meta(key)

    def phonemize(self, text: str) -> list[str]:
        _check_input(text)
        return [line for line in self._context.phonemize(text).split("\n") if line]

    @property
    def family(self) -> str:
        """The model's family: piper, kokoro or chatterbox."""
        return self._model.arch

    @property
    def takes_phonemes(self) -> bool:
        """Whether the voice reads IPA phonemes (Piper, Kokoro) as well as text (Chatterbox does not)."""
        return self._model.arch != "chatterbox"

    def unspoken(self, text: str) -> list[str]:
        """The symbols of ``text`` this voice's front end drops without a word (espeak-ng reads
        "€" and "©" aloud, but not "★" or "✓"): each distinct one, in order. Letters, digits,
        white space and punctuation (read as pauses and intonation) are not checked; any other
        symbol is phonemized alone, once per engine. Chatterbox's tokenizer takes every
        character: none."""
        if not self.takes_phonemes:
            return []
        known, out = self._spoken, []
        for ch in dict.fromkeys(text):
            if ch.isalnum() or ch.isspace() or ch in _PROSODY or unicodedata.category(ch).startswith(("M", "C")):
                continue
            if ch not in known:
                known[ch] = any(line.strip(" .,;:!?") for line in self.phonemize(ch))
            if not known[ch]:
                out.append(ch)
        return out

    def synthesize(
        self,
        *,
        text: str | None = None,
        phonemes: str | None = None,
        noise_scale: float | None = None,
        length_scale: float | None = None,
        noise_w: float | None = None,
        seed: int = 0,
        on_stage: Callable[[str, int, float], None] | None = None,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        decoder_tile: int = 0,
        style: np.ndarray | None = None,
        durations: np.ndarray | None = None,
        batch: int = 1,
        language: str | None = None,
        cfg_weight: float | None = None,
        exaggeration: float | None = None,
        stream_tokens: int = 0,
    ) -> Take:
        """``decoder_tile``: latent frames the vocoder decodes at once (0: the engine's default,
        about 3 s of audio; < 0: each sentence whole). Tiles overlap so the audio is the same.
        Kokoro: ``length_scale`` is 1 / speed; ``style`` a pack of its own ([rows, 256]) instead
        of the voice's; ``durations`` frames per token replacing the predicted ones (tests).
        ``batch``: sentences synthesized together (Kokoro shares its LSTM steps between them;
        on a GPU Piper's sentences share each stage's graph; Chatterbox's token model steps
        through them together; their audio arrives together); 1 streams sentence by sentence.
        The audio is the same.
        Chatterbox Multilingual: ``language`` (its code: ``languages``), ``cfg_weight`` (its
        guidance) and ``exaggeration`` (its emotion conditioning); None: its defaults.
        Chatterbox: ``stream_tokens`` > 0 runs S3Gen while the speech tokens are drawn, the first
        piece of audio after that many tokens (ChatterboxModel.speak); 0: once a sentence."""
        if (text is None) == (phonemes is None):
            raise InvalidArgumentError("give either text or phonemes")
        source = text if text is not None else phonemes
        _check_input(source)
        if self._model.arch == "chatterbox":
            if phonemes is not None or style is not None or durations is not None or noise_w is not None:
                raise InvalidArgumentError("Chatterbox reads text: it takes no phonemes, style, durations or noise_w")
            if length_scale is not None and length_scale != 1.0:
                raise InvalidArgumentError("Chatterbox speaks at its own pace: only speed 1 (length_scale 1)")
            return self._chatterbox_take(
                text,
                _checked("noise_scale", noise_scale, *NOISE_RANGE),
                seed,
                on_stage,
                on_chunk,
                cancelled,
                {"language": language, "cfg_weight": cfg_weight, "exaggeration": exaggeration,
                 "stream_tokens": stream_tokens, "batch": batch},
            )  # fmt: skip
        if stream_tokens:
            raise InvalidArgumentError(f"a {self._model.arch} voice streams sentence by sentence, not by speech tokens")
        if language is not None or cfg_weight is not None or exaggeration is not None:
            raise InvalidArgumentError(
                f"a {self._model.arch} voice speaks its own language and has no guidance or exaggeration"
            )
        audio, warnings = self._collecting_warnings(
            lambda: self._context.synthesize(
                source,
                phonemes=phonemes is not None,
                on_chunk=on_chunk,
                decoder_tile=int(decoder_tile),
                durations=None if durations is None else np.ascontiguousarray(durations, dtype=np.int32),
                **self._call_params(noise_scale, length_scale, noise_w, seed, on_stage, cancelled, style, batch),
            )
        )
        take = Take(audio, self.sample_rate, self._context.timings(), self.device, self.threads, warnings)
        take.durations = self._chunk_durations(1)[0]
        return take

    def _chunk_durations(self, n_inputs: int) -> list[np.ndarray | None]:
        """The last call's token durations of each of its inputs that was one chunk (None for
        the others)."""
        try:
            tokens = self._context.output("chunk_tokens").reshape(-1).astype(np.int64)
            owners = self._context.output("chunk_inputs").reshape(-1).astype(np.int64)
            frames = self._context.output("chunk_durations").reshape(-1)
        except InvalidArgumentError:  # a call that left none (no such output)
            return [None] * n_inputs
        out: list[np.ndarray | None] = [None] * n_inputs
        counts = np.bincount(owners, minlength=n_inputs)
        for k, start in enumerate(np.concatenate([[0], np.cumsum(tokens)[:-1]])):
            if counts[owners[k]] == 1:
                out[owners[k]] = np.array(frames[start : start + tokens[k]])
        return out

    def synthesize_many(
        self,
        texts: list[str],
        *,
        noise_scale: float | None = None,
        length_scale: float | None = None,
        noise_w: float | None = None,
        seed: int = 0,
        on_stage: Callable[[str, int, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        batch: int = 1,
    ) -> list[Take]:
        """A take for each text, their sentences synthesized together ``batch`` at a time across
        the texts (how a GPU earns its keep on a script of short sentences). Each take's audio
        is what ``synthesize`` gives for its text alone; their timings are the whole call's."""
        if not texts:
            raise InvalidArgumentError("no texts to synthesize")
        for text in texts:
            _check_input(text)
        if self._model.arch == "chatterbox":  # one text after another (its token model has no batch)
            params = {"noise_scale": noise_scale, "length_scale": length_scale, "noise_w": noise_w, "seed": seed}
            return [self.synthesize(text=t, on_stage=on_stage, cancelled=cancelled, **params) for t in texts]
        if sum(len(t) for t in texts) > MAX_INPUT_CHARS:
            raise InvalidArgumentError(f"the texts have more than {MAX_INPUT_CHARS:,} characters together")
        params = self._call_params(noise_scale, length_scale, noise_w, seed, on_stage, cancelled, None, batch)
        audio, warnings = self._collecting_warnings(lambda: self._context.synthesize_many(list(texts), **params))
        timings = self._context.timings()
        durations = self._chunk_durations(len(texts))
        return [
            Take(a, self.sample_rate, dict(timings), self.device, self.threads, list(warnings), d)
            for a, d in zip(audio, durations, strict=True)
        ]

    def revoice(
        self,
        audio: np.ndarray,
        sample_rate: int,
        *,
        seed: int = 0,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Take:
        """A take of the speech in ``audio`` re-voiced into this engine's voice (a Chatterbox
        voice: its stock voice or a clone's) by S3Gen alone (ChatterboxModel.revoice)."""
        from app.engine.chatterbox import ChatterboxModel

        if self._model.arch != "chatterbox":
            raise InvalidArgumentError(f"re-voicing takes a Chatterbox voice; '{self.voice_id}' is {self._model.arch}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"the seed must be a whole number from 0 to 2**64 - 1, not {seed!r}")
        t0 = time.perf_counter()
        model = ChatterboxModel(self._model, self._context)
        stages = dict.fromkeys(self.stages, 0.0)

        def piece(k: int, part: np.ndarray) -> None:  # S3Gen's stages, summed over the pieces
            for stage, ms in self._context.timings()["stages_ms"].items():
                if stage in stages:
                    stages[stage] += ms
            if on_chunk is not None:
                on_chunk(k, part)

        out, warnings = self._collecting_warnings(
            lambda: model.revoice(audio, sample_rate, self.conditionals, seed=seed, on_chunk=piece, cancelled=cancelled)
        )
        timings = {"stages_ms": stages, "total_ms": (time.perf_counter() - t0) * 1000.0, "samples": int(out.size)}
        return Take(out, self.sample_rate, timings, self.device, self.threads, warnings)

    def _chatterbox_take(self, text, noise_scale, seed, on_stage, on_chunk, cancelled, options) -> Take:
        """Chatterbox's take of ``text``: its chunks through the token model and S3Gen, one after
        another (app.engine.chatterbox), in the stock voice or a profile's."""
        from app.engine.chatterbox import ChatterboxModel

        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"the seed must be a whole number from 0 to 2**64 - 1, not {seed!r}")
        model = ChatterboxModel(self._model, self._context)
        if model.variant != "multilingual" and (
            options["cfg_weight"] is not None or options["exaggeration"] is not None
        ):
            raise InvalidArgumentError("Chatterbox-Turbo has no guidance or exaggeration (Multilingual has)")
        (audio, t), warnings = self._collecting_warnings(
            lambda: model.synthesize(
                text,
                self.conditionals,
                **options,
                seed=seed,
                noise_scale=None if noise_scale < 0 else noise_scale,
                on_chunk=on_chunk,
                on_stage=on_stage,
                cancelled=cancelled,
            )  # fmt: skip
        )
        timings = {
            "stages_ms": {stage: t["stages_ms"].get(stage, 0.0) for stage in self.stages},
            "total_ms": t["total_ms"],
            "first_audio_ms": t["first_audio_ms"],
            "chunks": t["n_chunks"],
            "phoneme_ids": 0,
            "frames": 2 * t["n_tokens"],
            "samples": int(audio.size),
            "skipped_symbols": 0,
            "speech_tokens": t["n_tokens"],
            "graphs_built": t["graphs_built"],
            "graphs_reused": t["graphs_reused"],
            "captures_replayed": t["captures_replayed"],
            "workers_ms": [t["total_ms"]],  # one context, the calls one after another
        }
        return Take(audio, self.sample_rate, timings, self.device, self.threads, warnings)

    def _call_params(self, noise_scale, length_scale, noise_w, seed, on_stage, cancelled, style, batch) -> dict:
        own = style if style is not None else self.pack
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"the seed must be a whole number from 0 to 2**64 - 1, not {seed!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise InvalidArgumentError(f"batch must be a whole number from 1 to {MAX_BATCH}, not {batch!r}")
        return {
            "noise_scale": _checked("noise_scale", noise_scale, *NOISE_RANGE),
            "length_scale": _checked("length_scale", length_scale, *LENGTH_SCALE_RANGE),
            "noise_w": _checked("noise_w", noise_w, *NOISE_RANGE),
            "seed": seed,
            "on_stage": on_stage,
            "abort": cancelled,
            "voice": self.style,
            "style": None if own is None else np.ascontiguousarray(own, dtype=np.float32),
            "batch": int(batch),
        }

    @staticmethod
    def _collecting_warnings(call):
        """``call()``'s result and the warnings the engine logged on this thread meanwhile."""
        warnings: list[str] = []
        with _log_lock:
            _log_sinks[threading.get_ident()] = warnings
        try:
            return call(), warnings
        finally:
            with _log_lock:
                _log_sinks.pop(threading.get_ident(), None)

    def output(self, name: str) -> np.ndarray:
        """A named intermediate of the last chunk, [time, channels] (Piper: ``m_p``, ``logs_p``,
        ``logw``, ``durations`` (each token's frames), ``z``; Kokoro: ``bert``,
        ``duration_logits``, ``durations``, ``F0``, ``N``, ``text_encoder``, ``decoder``, ``har``)."""
        return self._context.output(name)


def _checked(name: str, value: float | None, low: float, high: float) -> float:
    """A synthesis parameter as the engine takes it (-1: the voice's default), refused outside
    [low, high] (NaN and infinities included) rather than turned into silence or the default."""
    if value is None:
        return -1.0
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name} must be a number, not {value!r}") from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must lie from {low:g} to {high:g}, not {value!r}")
    return value


def _check_workers(workers: int) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InvalidArgumentError(f"workers must be a whole number from 1 to {MAX_WORKERS}, not {workers!r}")
    return workers


def _check_input(source: str) -> None:
    if not isinstance(source, str):
        raise InvalidArgumentError("input must be a string")
    if len(source) > MAX_INPUT_CHARS:
        raise InvalidArgumentError(f"input has {len(source):,} characters; the limit is {MAX_INPUT_CHARS:,}")
