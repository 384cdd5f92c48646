"""Hostile model files and inputs to the engine: each is refused with a clear error, never a
crash (a crash here ends the test process, which fails the run)."""

import shutil
import threading

import numpy as np
import pytest

from app.engine.binding import native_engine
from app.engine.engine import Engine
from app.engine.errors import InvalidArgumentError, ModelFileError
from app.models import manager as models

_engine = native_engine()

KOKORO = models.kokoro_path()  # the installed ones, before a test points the data folder elsewhere
SPEAKER_ENCODER = models.speaker_encoder_path()


def _copy(src, tmp_path, name="m.gguf"):
    dest = tmp_path / name
    shutil.copy(src, dest)
    return dest


def _set_field(path, key, value, index=0):
    """Overwrites one value of a metadata key in place (an array's element ``index``)."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r+")
    field = reader.fields[key]
    field.parts[field.data[index]][0] = value
    del reader


def _swap_dims(path, tensor):
    """Swaps a tensor's first and third dimensions in place (its bytes stay where they are)."""
    import gguf

    reader = gguf.GGUFReader(str(path), "r+")
    dims = next(t for t in reader.tensors if t.name == tensor).field.parts[3]
    dims[0], dims[2] = dims[2], dims[0]
    del reader


def _refused(path) -> str:
    with pytest.raises(ModelFileError) as info:
        _engine.Model(str(path))
    return str(info.value)


# Each found by trying: a division by zero, a ggml assertion or a graph of the file's choosing.
PIPER_METADATA = [
    ("piper.n_heads", 0, 0, "piper.n_heads"),
    ("piper.n_heads", 192, 0, "piper.n_heads"),
    ("piper.hidden_channels", 0, 0, "piper.hidden_channels"),
    ("piper.hidden_channels", 384, 0, "enc_p.emb.weight"),
    ("piper.hidden_channels", 2**31 - 2, 0, "piper.hidden_channels"),
    ("piper.window_size", 2, 0, "emb_rel_k"),
    ("piper.dec_upsample_kernels", 7, 0, "piper.dec_upsample_kernels"),
    ("piper.dec_upsample_kernels", 255, 0, "piper.dec_upsample_kernels"),
    ("piper.dec_upsample_rates", -8, 0, "piper.dec_upsample_rates"),
    ("piper.dec_upsample_rates", 2**30, 0, "piper.dec_upsample_rates"),
    ("piper.dec_upsample_rates", 0, 0, "piper.dec_upsample_rates"),
    ("piper.sample_rate", 0, 0, "piper.sample_rate"),
    ("piper.phoneme_ids", 100000, 5, "piper.phoneme_ids"),
    ("piper.flow_wn_kernel", 4, 0, "flow_wn_kernel"),
    ("piper.noise_scale", float("nan"), 0, "piper.noise_scale"),
]


@pytest.mark.parametrize(("key", "value", "index", "named"), PIPER_METADATA)
def test_piper_metadata_outside_the_architecture_is_refused(joe_path, tmp_path, key, value, index, named):
    path = _copy(joe_path, tmp_path)
    _set_field(path, key, value, index)
    assert named in _refused(path)


def test_a_tensor_with_its_dimensions_reordered_is_refused(joe_path, tmp_path):
    path = _copy(joe_path, tmp_path)
    _swap_dims(path, "dec.conv_pre.weight")
    assert "dec.conv_pre.weight" in _refused(path)


def test_a_model_without_tensors_is_refused(tmp_path):
    import gguf

    path = tmp_path / "empty.gguf"
    writer = gguf.GGUFWriter(str(path), "piper")
    writer.add_uint32("piper.sample_rate", 22050)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "no tensors" in _refused(path)


def test_speaker_encoder_metadata_and_shapes_are_checked(tmp_path):
    src = SPEAKER_ENCODER
    for key, value, named in [("ge2e.hidden", 255, "lstm.0.weight_ih"), ("ge2e.n_fft", 0, "ge2e.n_fft")]:
        path = _copy(src, tmp_path)
        _set_field(path, key, value)
        assert named in _refused(path)


def test_kokoro_vocabulary_and_shapes_are_checked(tmp_path):
    path = _copy(KOKORO, tmp_path)
    _set_field(path, "kokoro.vocab_ids", 5000, 3)
    assert "kokoro.vocab_ids" in _refused(path)
    path = _copy(KOKORO, tmp_path)
    _swap_dims(path, "decoder.decode.0.conv1.weight")
    assert "decoder.decode.0.conv1.weight" in _refused(path)


@pytest.mark.parametrize("threads", [-5, 100000, 5000])
def test_thread_counts_outside_the_machine_are_refused(joe_path, threads):
    with pytest.raises(InvalidArgumentError, match="threads"):
        Engine.open("piper:joe", device="cpu", threads=threads)


def test_a_sentence_without_punctuation_is_split_into_bounded_chunks(engine):
    # 1,200 phonemes in one line: one chunk would ask for an attention matrix of 2,400
    # squared ids; the engine cuts it at word breaks into chunks of at most 500 phonemes.
    line = " ".join(["həlˈoʊ"] * 200)
    take = engine.synthesize(phonemes=line, length_scale=0.05, noise_scale=0.0, noise_w=0.0)
    assert take.timings["chunks"] == 3
    assert take.timings["phoneme_ids"] <= 3 * (2 * 500 + 3)
    word = "a" * 1200  # no break at all: cut at the limit
    take = engine.synthesize(phonemes=word, length_scale=0.05, noise_scale=0.0, noise_w=0.0)
    assert take.timings["chunks"] == 3


def test_a_nul_in_the_text_is_refused_not_cut_short(engine):
    with pytest.raises(InvalidArgumentError, match="NUL"):
        engine.synthesize(text="Hello there.\x00 And the rest.")
    with pytest.raises(InvalidArgumentError, match="NUL"):
        engine.phonemize("Hello\x00")


@pytest.mark.parametrize(
    "params",
    [
        {"length_scale": float("nan")},
        {"length_scale": float("inf")},
        {"length_scale": 0.0},
        {"noise_scale": float("nan")},
        {"noise_w": float("-inf")},
        {"seed": -1},
        {"seed": 2**70},
    ],
)
def test_parameters_that_would_give_silence_or_the_default_are_refused(engine, params):
    with pytest.raises(InvalidArgumentError):
        engine.synthesize(text="Hi.", **params)


def test_one_engine_used_from_two_threads_serializes_their_calls(engine):
    alone = engine.synthesize(text="Two threads at once.", noise_scale=0.0, noise_w=0.0).audio
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(engine.synthesize(text="Two threads at once.", noise_scale=0.0, noise_w=0.0).audio)
        except BaseException as exc:  # raised below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 6 and all(np.array_equal(a, alone) for a in results)


def test_a_callback_cannot_call_the_engine_that_called_it(engine):
    def nested(_chunk, _audio):
        engine.synthesize(text="Inside.")

    with pytest.raises(InvalidArgumentError, match="callback"):
        engine.synthesize(text="Outside.", on_chunk=nested)


def test_a_model_closed_under_its_context_stays_alive_until_the_context_closes(joe_path):
    model = _engine.Model(str(joe_path))
    context = _engine.Context(model, "cpu", 2)
    model.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        model.sample_rate  # noqa: B018
    audio = context.synthesize("hˈɛloʊ", phonemes=True)
    assert len(audio) > 0
    context.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        context.synthesize("hˈɛloʊ", phonemes=True)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICESTUDIO_DATA_DIR", str(tmp_path / "data"))
    return models.paths.models_dir()


def _install_copy(src, data_dir, name):
    shutil.copy(src, data_dir / name)
    shutil.copy(src.with_suffix(".json"), (data_dir / name).with_suffix(".json"))


def test_a_piper_model_renamed_as_kokoro_is_refused(joe_path, data_dir):
    shutil.copy(joe_path, data_dir / "kokoro.gguf")
    shutil.copy(KOKORO.with_suffix(".json"), data_dir / "kokoro.json")
    with pytest.raises(ModelFileError, match="damaged or was replaced"):
        Engine.open("kokoro:jf_alpha", device="cpu", threads=2)


def test_a_model_with_damaged_weights_is_refused(joe_path, data_dir):
    _install_copy(joe_path, data_dir, joe_path.name)
    path = data_dir / joe_path.name
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(ModelFileError, match="damaged"):
        Engine.open("piper:joe", device="cpu", threads=2)


@pytest.mark.parametrize("manifest", ["[]", "null", "{", '{"architecture": "kokoro"}'])
def test_a_malformed_manifest_is_a_clear_error(joe_path, data_dir, manifest):
    _install_copy(joe_path, data_dir, joe_path.name)
    (data_dir / joe_path.name).with_suffix(".json").write_text(manifest, encoding="utf-8")
    assert not models.is_installed("piper:joe")
    with pytest.raises(ModelFileError, match="models install piper:joe"):
        Engine.open("piper:joe", device="cpu", threads=2)


@pytest.mark.parametrize("text", ["a." * 200, "g.e." * 96, "e.g. " * 120])
def test_a_clause_of_spelled_letters_is_phonemized_not_a_crash(engine, text):
    # espeak-ng overflows a buffer on one clause of a few hundred letters; the engine gives
    # it the text in pieces it takes safely.
    assert engine.phonemize(text)
