"""EPUB books as scripts: the spine's documents in reading order, their headings as chapter
headings (``#`` to ``######`` by level: app.core.script), their paragraphs and list items as
paragraphs; images, scripts, styles and tables of contents are not read aloud (an image's alt
text is). Every part of the file is checked and bounded before it is used: a malformed book
raises EpubError and nothing else."""

from __future__ import annotations

import posixpath
import re
import zipfile
import zlib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote
from xml.etree import ElementTree as ET

from app.core.archive import read_bounded

MAX_BOOK_BYTES = 512 << 20  # the file
MAX_DOC_BYTES = 16 << 20  # one document, uncompressed
MAX_TEXT_CHARS = 20_000_000  # the whole script
_BLOCKS = {"p", "div", "li", "blockquote", "br", "tr", "dd", "dt", "figcaption", "pre", "section", "article"}
_SKIP = {"script", "style", "head", "nav", "svg", "math", "table"}


class EpubError(ValueError):
    pass


def _xml(data: bytes, what: str) -> ET.Element:
    if b"<!ENTITY" in data:
        raise EpubError(f"{what} declares entities; a book that does is not read")
    try:
        return ET.fromstring(data)
    except ET.ParseError as exc:
        raise EpubError(f"{what} is not well-formed XML ({exc})") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


class _Text(HTMLParser):
    """One XHTML document's words: headings as "#"-lines, blocks as paragraphs."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.line: list[str] = []
        self.heading = 0
        self.skipping = 0

    def _flush(self) -> None:
        text = re.sub(r"\s+", " ", "".join(self.line)).strip()
        self.line = []
        if text:
            self.out.append(("#" * self.heading + " " + text) if self.heading else text)

    def handle_starttag(self, tag, attrs):
        tag = tag.lower()
        if tag in _SKIP:
            self.skipping += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self.heading = int(tag[1])
        elif tag in _BLOCKS:
            self._flush()
        elif tag == "img" and not self.skipping:
            alt = dict(attrs).get("alt") or ""
            if alt.strip():
                self.line.append(f" {alt.strip()} ")

    def handle_endtag(self, tag):
        tag = tag.lower()
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self.heading = 0
        elif tag in _BLOCKS:
            self._flush()

    def handle_data(self, data):
        if not self.skipping:
            self.line.append(data)

    def text(self) -> list[str]:
        self._flush()
        return self.out


def epub_to_script(path: Path | str) -> str:
    """The book's text as a script: chapters from its headings, a blank line between paragraphs."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BOOK_BYTES:
            raise EpubError(f"{path.name} is larger than {MAX_BOOK_BYTES >> 20} MiB")
        with zipfile.ZipFile(path) as zf:
            container = _xml(read_bounded(zf, "META-INF/container.xml", MAX_DOC_BYTES), "META-INF/container.xml")
            rootfile = next((e.get("full-path") for e in container.iter() if _local(e.tag) == "rootfile"), None)
            if not rootfile:
                raise EpubError(f"{path.name}: its container names no package document")
            opf = _xml(read_bounded(zf, rootfile, MAX_DOC_BYTES), rootfile)
            base = posixpath.dirname(rootfile)
            manifest = {
                e.get("id"): (e.get("href"), e.get("media-type", ""))
                for e in opf.iter()
                if _local(e.tag) == "item" and e.get("id") and e.get("href")
            }
            paragraphs: list[str] = []
            for ref in (e for e in opf.iter() if _local(e.tag) == "itemref"):
                href, media = manifest.get(ref.get("idref"), (None, ""))
                if href is None or "html" not in media or ref.get("linear") == "no":
                    continue
                member = posixpath.normpath(posixpath.join(base, unquote(href.split("#")[0])))
                parser = _Text()
                parser.feed(read_bounded(zf, member, MAX_DOC_BYTES).decode("utf-8", errors="replace"))
                paragraphs += parser.text()
                if sum(len(p) + 2 for p in paragraphs) > MAX_TEXT_CHARS:
                    raise EpubError(f"{path.name}: more than {MAX_TEXT_CHARS:,} characters of text")
    except EpubError:
        raise
    except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, OSError, EOFError, RuntimeError) as exc:
        raise EpubError(f"{path.name}: not a readable EPUB ({exc})") from None
    if not paragraphs:
        raise EpubError(f"{path.name}: its spine holds no text")
    return "\n\n".join(paragraphs) + "\n"
