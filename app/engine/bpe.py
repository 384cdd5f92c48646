"""BPE tokenizers as Hugging Face's ``tokenizers`` runs a ``tokenizer.json`` of their kind: added
tokens split off first, then a pre-tokenizer, each piece's symbols merged by rank.

- ``ByteLevelBPE``: GPT-2's (Chatterbox-Turbo's): GPT-2's pre-tokenizer, each piece's UTF-8 bytes as
  printable characters.
- ``WhitespaceBPE``: the Whitespace pre-tokenizer (``\\w+|[^\\w\\s]+``) and each piece's characters,
  one the vocabulary lacks becoming the unknown token (Chatterbox Multilingual's grapheme
  tokenizer)."""

from __future__ import annotations

import unicodedata
from functools import lru_cache

# Unicode's White_Space property (the \\s of the pre-tokenizer's regex).
_SPACE = frozenset(
    [chr(c) for c in range(0x9, 0xE)]
    + [" ", "\x85", "\xa0", "\u1680", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
    + [chr(c) for c in range(0x2000, 0x200B)]
)
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


@lru_cache(maxsize=4096)
def _kind(ch: str) -> str:
    """'s' whitespace, 'L' letter, 'N' number, 'P' anything else."""
    if ch in _SPACE:
        return "s"
    cat = unicodedata.category(ch)[0]
    return cat if cat in "LN" else "P"


def pretokenize(text: str) -> list[str]:
    """GPT-2's pieces: 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            suffix = next((s for s in _CONTRACTIONS if text.startswith(s, i + 1)), None)
            if suffix:
                out.append("'" + suffix)
                i += 1 + len(suffix)
                continue
        start = i
        if c == " " and i + 1 < n and _kind(text[i + 1]) != "s":
            i += 1  # the optional space before a run
        kind = _kind(text[i])
        if kind != "s":
            while i < n and _kind(text[i]) == kind:
                i += 1
            out.append(text[start:i])
            continue
        end = i
        while end < n and _kind(text[end]) == "s":
            end += 1
        if end < n and end - i > 1:
            end -= 1  # \s+(?!\S): the last space goes with the run after it
        out.append(text[i:end])
        i = end
    return out


@lru_cache(maxsize=1)
def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: each byte as a printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def merge(word: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """``word``'s symbols merged pair by pair, the lowest-ranked pair first (leftmost on a tie)."""
    while len(word) > 1:
        best = min(
            ((ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(word, word[1:], strict=False))),
            key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0, r[1]),
        )
        if best[0] is None:
            break
        pair = (word[best[1]], word[best[1] + 1])
        merged, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                merged.append(word[i] + word[i + 1])
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word


def split_added(text: str, added: list[dict]) -> list[tuple[str, int | None]]:
    """The text cut at added tokens (``added`` longest first): (text, None) runs and (token, id)
    pieces."""
    if not added:
        return [(text, None)]
    out, start, i = [], 0, 0
    while i < len(text):
        for a in added:
            if text.startswith(a["content"], i):
                left, right = i, i + len(a["content"])
                if a.get("lstrip"):
                    while left > start and text[left - 1] in _SPACE:
                        left -= 1
                if a.get("rstrip"):
                    while right < len(text) and text[right] in _SPACE:
                        right += 1
                if left > start:
                    out.append((text[start:left], None))
                out.append((a["content"], a["id"]))
                start = i = right
                break
        else:
            i += 1
    if start < len(text):
        out.append((text[start:], None))
    return out


def _added(spec: dict) -> list[dict]:
    return [
        {"content": a["content"], "id": a["id"], "lstrip": a.get("lstrip", False), "rstrip": a.get("rstrip", False)}
        for a in spec.get("added_tokens", [])
    ]


def _merges(model: dict) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]


class _BPE:
    """Added tokens split off, the rest pre-tokenized, each piece merged (``_bpe``)."""

    added: list[dict]

    def _bpe(self, piece: str) -> list[int]:
        raise NotImplementedError

    @staticmethod
    def _pieces(text: str) -> list[str]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, token in split_added(text, self.added):
            if token is not None:
                ids.append(token)
                continue
            for piece in self._pieces(part):
                ids.extend(self._bpe(piece))
        return ids


class ByteLevelBPE(_BPE):
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], added: list[dict] | None = None):
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        # Added tokens, longest first so that one containing another wins.
        self.added = sorted(added or [], key=lambda a: -len(a["content"]))
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_tokenizer_json(cls, spec: dict) -> ByteLevelBPE:
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise ValueError(f"the tokenizer's model is {model.get('type')!r}, not BPE")
        return cls(dict(model["vocab"]), _merges(model), _added(spec))

    def _bpe(self, piece: str) -> list[int]:
        if piece in self._cache:
            return self._cache[piece]
        chars = byte_chars()
        word = merge([chars[b] for b in piece.encode("utf-8")], self.ranks)
        ids = []
        for symbol in word:
            if symbol not in self.vocab:
                raise ValueError(f"the tokenizer's vocabulary lacks {symbol!r}")
            ids.append(self.vocab[symbol])
        if len(self._cache) < 65536:
            self._cache[piece] = ids
        return ids

    @staticmethod
    def _pieces(text: str) -> list[str]:
        return pretokenize(text)


@lru_cache(maxsize=4096)
def _word_char(ch: str) -> bool:
    """The Whitespace pre-tokenizer's \\w (Rust's regex: Alphabetic, marks, decimal digits,
    connector punctuation, the joiners)."""
    cat = unicodedata.category(ch)
    return (
        cat[0] in "LM"
        or cat in ("Nd", "Nl", "Pc")
        or ch in "\u200c\u200d"
        or "\u24b6" <= ch <= "\u24e9"  # circled letters (Other_Alphabetic)
    )


def whitespace_pretokenize(text: str) -> list[str]:
    """The Whitespace pre-tokenizer's pieces: \\w+|[^\\w\\s]+."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        word, start = _word_char(c), i
        while i < n and text[i] not in _SPACE and _word_char(text[i]) == word:
            i += 1
        out.append(text[start:i])
    return out


class WhitespaceBPE(_BPE):
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], added: list[dict], unk: str | None):
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.added = sorted(added, key=lambda a: -len(a["content"]))
        self.unk = None if unk is None else vocab.get(unk)
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_tokenizer_json(cls, spec: dict) -> WhitespaceBPE:
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        if model.get("type") != "BPE" or pre.get("type") != "Whitespace" or spec.get("normalizer"):
            raise ValueError("not a BPE tokenizer with the Whitespace pre-tokenizer and no normalizer")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            raise ValueError("the tokenizer marks subwords, which this one does not")
        return cls(dict(model["vocab"]), _merges(model), _added(spec), model.get("unk_token"))

    def _bpe(self, piece: str) -> list[int]:
        if piece in self._cache:
            return self._cache[piece]
        ids = []
        for symbol in merge(list(piece), self.ranks):
            token = self.vocab.get(symbol, self.unk)
            if token is None:
                raise ValueError(f"the tokenizer's vocabulary lacks {symbol!r} and has no unknown token")
            ids.append(token)
        if len(self._cache) < 65536:
            self._cache[piece] = ids
        return ids

    @staticmethod
    def _pieces(text: str) -> list[str]:
        return whitespace_pretokenize(text)
