"""Byte-level BPE (GPT-2's tokenizer, as Hugging Face's ``tokenizers`` runs a ``tokenizer.json`` of
that kind): added tokens split off first, then GPT-2's pre-tokenizer, each piece's UTF-8 bytes as
printable characters, merged by rank."""

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


class ByteLevelBPE:
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
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
        added = [
            {"content": a["content"], "id": a["id"], "lstrip": a.get("lstrip", False), "rstrip": a.get("rstrip", False)}
            for a in spec.get("added_tokens", [])
        ]
        return cls(dict(model["vocab"]), merges, added)

    def _bpe(self, piece: str) -> list[int]:
        if piece in self._cache:
            return self._cache[piece]
        chars = byte_chars()
        word = [chars[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min(
                ((self.ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(word, word[1:], strict=False))),
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
        ids = []
        for symbol in word:
            if symbol not in self.vocab:
                raise ValueError(f"the tokenizer's vocabulary lacks {symbol!r}")
            ids.append(self.vocab[symbol])
        if len(self._cache) < 65536:
            self._cache[piece] = ids
        return ids

    def _split_added(self, text: str) -> list[tuple[str, int | None]]:
        """The text cut at added tokens: (text, None) runs and (token, id) pieces."""
        if not self.added:
            return [(text, None)]
        out, start, i = [], 0, 0
        while i < len(text):
            for a in self.added:
                if text.startswith(a["content"], i):
                    left, right = i, i + len(a["content"])
                    if a["lstrip"]:
                        while left > start and text[left - 1] in _SPACE:
                            left -= 1
                    if a["rstrip"]:
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

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part, token in self._split_added(text):
            if token is not None:
                ids.append(token)
                continue
            for piece in pretokenize(part):
                ids.extend(self._bpe(piece))
        return ids
