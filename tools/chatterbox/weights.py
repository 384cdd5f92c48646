"""Chatterbox checkpoints in the official layout, drawn from a fixed seed without torch.

tests/data/chatterbox/layout.json (written by tools/chatterbox/layout.py from the reference's own
modules) names every tensor of each official file with its shape, dtype and the mean and
spread of the module's own initialisation. Each tensor is drawn from a normal distribution of
that mean and spread, seeded by the file's seed and the tensor's name; tensors the module
initialises to a constant (norm gains, biases) get that constant plus a little noise, so that a
converter or an engine that drops one is caught; buffers the reference computes (the speech
tokenizer's mel filters and window) hold their real values. Same shapes as the real checkpoints, so the
same cost. The text tokenizer (``turbo/tokenizer.json``) is a byte-level BPE of GPT-2's kind
trained by Hugging Face's ``tokenizers`` on the repository's English test texts, with
Chatterbox-Turbo's paralinguistic tags as added tokens (its ids fit the token model's text
vocabulary; the real one is GPT-2's).

    python -m tools.chatterbox.weights OUT_DIR [--files turbo/t3_turbo_v1.safetensors ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import struct
import zlib
from pathlib import Path

import numpy as np

LAYOUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "chatterbox" / "layout.json"
SEED = 20251204
VERSION = 2  # of the drawing: files written by another are drawn again
DTYPES = {"float32": ("F32", np.float32), "int64": ("I64", np.int64), "int32": ("I32", np.int32)}


def layout() -> dict[str, list[dict]]:
    return json.loads(LAYOUT.read_text())


@functools.cache
def _constants() -> dict[str, np.ndarray]:
    """Buffers the reference computes rather than learns, with their real values: S3Gen's speech
    tokenizer's front end (librosa's Slaney mel filters for 16 kHz, n_fft 400, 128 bands; a
    periodic Hann window of 400)."""
    from app.models.convert.ge2e import slaney_mel_filterbank

    n = np.arange(400)
    return {
        "tokenizer._mel_filters": slaney_mel_filterbank(16000, 400, 128),
        "tokenizer.window": (0.5 - 0.5 * np.cos(2 * np.pi * n / 400)).astype(np.float32),
    }


def draw(entry: dict, seed: int = SEED) -> np.ndarray:
    shape = tuple(entry["shape"])
    constant = _constants().get(entry["name"])
    if constant is not None:
        return constant.reshape(shape)
    rng = np.random.default_rng([seed, zlib.crc32(entry["name"].encode())])
    if entry["dtype"] != "float32":
        return np.zeros(shape, DTYPES[entry["dtype"]][1])
    mean, std = entry.get("mean", 0.0), entry.get("std", 0.0)
    if std == 0.0:
        std = 0.1 if mean != 0.0 else 0.02
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.float32(std)
    x += np.float32(mean)
    return x


def write_file(path: Path, entries: list[dict], seed: int = SEED) -> Path:
    """Write one safetensors file of ``entries`` (drawn one at a time, never all in memory)."""
    header, offset = {}, 0
    for e in entries:
        code, np_type = DTYPES[e["dtype"]]
        n = int(np.prod(e["shape"], dtype=np.int64)) * np.dtype(np_type).itemsize
        header[e["name"]] = {"dtype": code, "shape": e["shape"], "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for e in entries:
            f.write(np.ascontiguousarray(draw(e, seed)).tobytes())
    tmp.replace(path)
    return path


_STORAGES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.int64): "LongStorage", np.dtype(np.int32): "IntStorage"}


def write_torch(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Write ``tensors`` as ``torch.save(state_dict)`` does (its zip layout: the pickle of an
    OrderedDict of _rebuild_tensor_v2 calls over storages, each storage's bytes beside it),
    without torch: the official ``ve.pt`` and ``s3gen.pt`` are such files."""
    import io
    import zipfile

    def text(v: str) -> bytes:  # BINUNICODE
        raw = v.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    def ints(values) -> bytes:  # a tuple of BININTs
        return b"(" + b"".join(b"J" + struct.pack("<i", int(v)) for v in values) + b"t"

    ordered_dict = b"ccollections\nOrderedDict\n)R"
    pkl = io.BytesIO()
    pkl.write(b"\x80\x02" + ordered_dict + b"(")
    for key, (name, array) in enumerate(tensors.items()):
        array = np.ascontiguousarray(array)
        strides = [s // array.itemsize for s in array.strides]
        pid = b"(" + text("storage") + b"ctorch\n" + _STORAGES[array.dtype].encode() + b"\n"
        pid += text(str(key)) + text("cpu") + b"J" + struct.pack("<i", array.size) + b"tQ"
        pkl.write(text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + b"J\x00\x00\x00\x00")
        pkl.write(ints(array.shape) + ints(strides) + b"\x89" + ordered_dict + b"tR")
    pkl.write(b"u.")
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl.getvalue())
        z.writestr("archive/byteorder", "little")
        for key, array in enumerate(tensors.values()):
            z.writestr(f"archive/data/{key}", np.ascontiguousarray(array).tobytes())
        z.writestr("archive/version", "3\n")
    tmp.replace(path)
    return path


TOKENIZER = "turbo/tokenizer.json"
# Chatterbox-Turbo's official files, as the converter reads them.
TURBO = [
    "turbo/t3_turbo_v1.safetensors",
    "turbo/ve.safetensors",
    "turbo/s3gen_meanflow.safetensors",
    TOKENIZER,
]
# Chatterbox Multilingual's official files: its grapheme tokenizer and Cangjie table are made
# from tests/data/multilingual.txt (a BPE with the Whitespace pre-tokenizer, as the real one).
MTL_TOKENIZER = "multilingual/grapheme_mtl_merged_expanded_v1.json"
CANGJIE = "multilingual/Cangjie5_TC.json"
MULTILINGUAL = [
    "multilingual/t3_mtl23ls_v2.safetensors",
    "multilingual/ve.safetensors",
    "multilingual/s3gen.safetensors",
    MTL_TOKENIZER,
    CANGJIE,
]
TAGS = ["[laugh]", "[chuckle]", "[cough]", "[sigh]", "[gasp]"]


def write_tokenizer(path: Path, vocab_size: int = 4000) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    data = Path(__file__).resolve().parents[2] / "tests" / "data"
    corpus = [line for f in ("sentences.txt", "script.txt") for line in (data / f).read_text().splitlines() if line]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(TAGS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    return path


def multilingual_texts() -> list[tuple[str, str]]:
    """(language, text) of tests/data/multilingual.txt."""
    data = Path(__file__).resolve().parents[2] / "tests" / "data" / "multilingual.txt"
    return [tuple(line.split("\t", 1)) for line in data.read_text(encoding="utf-8").splitlines() if line]


def write_cangjie(path: Path) -> Path:
    """A Cangjie table (Cangjie5_TC.json's "character<TAB>code" entries) for the Chinese characters
    of the test texts: codes of 2 to 4 letters drawn from each character, every fifth sharing the
    one before's (as characters of one code do, told apart by their place)."""
    chars = sorted(
        {c for lang, text in multilingual_texts() if lang == "zh" for c in text if "\u4e00" <= c <= "\u9fff"}
    )
    entries, code = [], ""
    for i, c in enumerate(chars):
        if i % 5 != 4:
            h = zlib.crc32(c.encode())
            code = "".join(chr(ord("a") + (h >> (5 * k)) % 25) for k in range(2 + h % 3))
        entries.append(f"{c}\t{code}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return path


def write_multilingual_tokenizer(path: Path, vocab_size: int = 1200) -> Path:
    """A grapheme BPE of Chatterbox Multilingual's kind ([STOP] 0, [UNK] 1, [SPACE] 2, [START] 3, the language
    tags and Cangjie's [cj_*] as added tokens, the Whitespace pre-tokenizer), trained on the test
    texts as the reference prepares them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from app.engine import chatterbox_text as mtl

    cangjie = mtl.Cangjie.from_json(write_cangjie(path.with_name("Cangjie5_TC.json")).read_text(encoding="utf-8"))
    corpus = [mtl.prepare(mtl.normalize_punctuation(t), lang, cangjie) for lang, t in multilingual_texts()]
    data = Path(__file__).resolve().parents[2] / "tests" / "data" / "sentences.txt"
    corpus += [mtl.prepare(mtl.normalize_punctuation(t), "en") for t in data.read_text().splitlines() if t]
    special = ["[STOP]", "[UNK]", "[SPACE]", "[START]"] + [f"[{code}]" for code in sorted(mtl.LANGUAGES)]
    special += [f"[cj_{c}]" for c in "abcdefghijklmnopqrstuvwxy.0123456789"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    return path


def write(out_dir: Path, files: list[str] | None = None, seed: int = SEED) -> list[Path]:
    """Write the official files (all of the layout's, or ``files``) under ``out_dir``; a file
    already there from the same layout and seed is kept."""
    spec = layout()
    stamp = f"{zlib.crc32(LAYOUT.read_bytes()):08x}-{seed}-{VERSION}"
    written = []
    for name in files or [*spec, TOKENIZER, MTL_TOKENIZER, CANGJIE]:
        path = out_dir / name
        if name == TOKENIZER:
            written.append(write_tokenizer(path))
            continue
        if name == MTL_TOKENIZER:
            written.append(write_multilingual_tokenizer(path))
            continue
        if name == CANGJIE:
            written.append(write_cangjie(path))
            continue
        mark = path.with_name(path.name + ".stamp")
        if not (path.exists() and mark.exists() and mark.read_text() == stamp):
            write_file(path, spec[name], seed)
            mark.write_text(stamp)
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--files", nargs="*", help="official file names (default: all of the layout's)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    for path in write(args.out_dir, args.files, args.seed):
        print(path, f"{path.stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
