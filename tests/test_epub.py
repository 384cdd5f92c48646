"""EPUB import: the spine in reading order, nested headings as chapters, images' alt text, and
malformed books refused with one clear error."""

import zipfile

import pytest

from app.core.epub import EpubError, epub_to_script
from app.core.project import Project
from app.core.script import chapters

CONTAINER = """<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>
</container>"""

OPF = """<?xml version="1.0"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0">
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="c2" href="text/ch%202.xhtml" media-type="application/xhtml+xml"/>
    <item id="c1" href="text/ch1.xhtml" media-type="application/xhtml+xml"/>
    <item id="notes" href="notes.xhtml" media-type="application/xhtml+xml"/>
    <item id="img" href="images/map.png" media-type="image/png"/>
  </manifest>
  <spine><itemref idref="c1"/><itemref idref="c2"/><itemref idref="notes" linear="no"/></spine>
</package>"""

CH1 = """<html xmlns="http://www.w3.org/1999/xhtml"><head><title>One</title><style>p {}</style></head><body>
<h1>Chapter One</h1><p>It was a <em>bright</em> cold day.</p>
<h2>A Part</h2><p>The clocks were
  striking thirteen.</p><img src="../images/map.png" alt="A map of the town."/>
<ul><li>First item.</li><li>Second item.</li></ul><script>var x = 1;</script></body></html>"""

CH2 = """<html xmlns="http://www.w3.org/1999/xhtml"><body><section><h1>Chapter Two</h1>
<p>Fin &amp; more.</p><table><tr><td>not read</td></tr></table></section></body></html>"""


def make_epub(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mimetype", "application/epub+zip")
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def book(tmp_path, **changes):
    files = {
        "META-INF/container.xml": CONTAINER,
        "OEBPS/content.opf": OPF,
        "OEBPS/text/ch1.xhtml": CH1,
        "OEBPS/text/ch 2.xhtml": CH2,
        "OEBPS/notes.xhtml": "<html><body><p>Notes are not in the reading order.</p></body></html>",
        "OEBPS/nav.xhtml": "<html><body><nav><ol><li>Chapter One</li></ol></nav></body></html>",
        "OEBPS/images/map.png": b"\x89PNG\r\n\x1a\n",
    }
    files.update(changes)
    return make_epub(tmp_path / "book.epub", {k: v for k, v in files.items() if v is not None})


def test_an_epub_becomes_a_script_with_its_chapters(tmp_path):
    script = epub_to_script(book(tmp_path))
    assert script == (
        "# Chapter One\n\nIt was a bright cold day.\n\n## A Part\n\nThe clocks were striking thirteen.\n\n"
        "A map of the town.\n\nFirst item.\n\nSecond item.\n\n# Chapter Two\n\nFin & more.\n"
    )
    assert [c.title for c in chapters(script)] == ["Chapter One", "A Part", "Chapter Two"]
    project = Project(script)
    assert [(title, count) for _, title, _, count in project.chapter_progress()] == [
        ("Chapter One", 2),
        ("A Part", 5),
        ("Chapter Two", 2),
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"META-INF/container.xml": None}, "not a readable EPUB"),
        ({"OEBPS/content.opf": "<package><spine>"}, "not well-formed XML"),
        ({"OEBPS/content.opf": '<!DOCTYPE p [<!ENTITY a "x">]><package/>'}, "entities"),
        ({"OEBPS/text/ch1.xhtml": None}, "not a readable EPUB"),
        ({"OEBPS/content.opf": OPF.replace('<itemref idref="c1"/><itemref idref="c2"/>', "")}, "no text"),
    ],
)
def test_a_malformed_book_is_refused_with_one_error(tmp_path, changes, message):
    with pytest.raises(EpubError, match=message):
        epub_to_script(book(tmp_path, **changes))
    (tmp_path / "not.epub").write_bytes(b"plain text")
    with pytest.raises(EpubError, match="not a readable EPUB"):
        epub_to_script(tmp_path / "not.epub")
