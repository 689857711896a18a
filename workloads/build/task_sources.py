"""The real text behind the task prompt sets: Debian packages fetched at build time, read into documents.

- **Prose** (chat, summarise, qa, translate, rewrite): *The Debian Administrator's Handbook*, Debian package
  ``debian-handbook`` (GPL-2.0-or-later OR CC-BY-SA-3.0), its HTML edition in ``en-US``, ``it-IT``,
  ``zh-CN`` and ``es-ES``: one document per HTML file, read as sections (a heading and its paragraphs; list
  items keep a ``- `` mark; code blocks, tables and navigation are left out). A paragraph of a translation
  that is the English paragraph verbatim (not translated) is dropped.
- **Code** (code): CPython's standard library as Debian ships it (``libpython3.11-stdlib``, PSF-2.0):
  top-level functions and methods read with :mod:`ast`. The files that Debian's copyright file gives other
  licences (logging, multiprocessing, sqlite3, async*, tarfile, turtle), tests and private modules are skipped.
- **Held-out check**: the embedded tiny pair's training text (the packages of
  :mod:`workloads.build.corpus`) as a set of character windows, so that no passage repeats it.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import re
import subprocess
import textwrap
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from spectune.errors import SpectuneError
from workloads.build import corpus

log = logging.getLogger(__name__)

HANDBOOK = "debian-handbook"
HANDBOOK_SPDX = "GPL-2.0-or-later OR CC-BY-SA-3.0"
HANDBOOK_LOCALES = {"en": "en-US", "it": "it-IT", "zh": "zh-CN", "es": "es-ES"}
STDLIB = "libpython3.11-stdlib"
STDLIB_SPDX = "PSF-2.0"
STDLIB_ROOT = "usr/lib/python3.11"
STDLIB_OTHER_LICENCES = ("logging/", "multiprocessing/", "sqlite3/", "async", "tarfile.py", "turtle.py")
_WS = re.compile(r"\s+")
_NUMBER = re.compile(r"^(?:[\dA-Z]+\.)+\d*\s*")  # "6.2.1. " section numbers


@dataclass(frozen=True)
class Source:
    """Where a passage comes from: the licence, the package, the file in it and the file's sha256."""

    spdx: str
    package: str  # name==version
    path: str
    sha256: str

    def as_dict(self) -> dict[str, str]:
        return {"spdx": self.spdx, "package": self.package, "path": self.path, "sha256": self.sha256}


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)


@dataclass
class Document:
    id: str
    source: Source
    sections: list[Section]


@dataclass(frozen=True)
class Function:
    document: str  # the module's path in the package
    source: Source
    name: str
    code: str
    has_docstring: bool


def fetch(packages: list[str], dest: Path) -> dict[str, Path]:
    """``apt-get download`` + ``dpkg-deb -x`` each package into ``dest``; {package: extracted root}.

    Packages already extracted in ``dest`` (a ``--work`` folder kept from an earlier build) are reused."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not (sorted(dest.glob(f"{p}_*.deb")) and (dest / p).is_dir())]
    if missing:
        corpus.download(missing, dest)
    return {pkg: dest / pkg for pkg in packages}


def package_version(package: str, dest: Path) -> str:
    """``name==version`` of the ``.deb`` that :func:`fetch` downloaded into ``dest``."""
    (deb,) = sorted(dest.glob(f"{package}_*.deb"))
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    return f"{package}=={version}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean(text: str) -> str:
    return _WS.sub(" ", text).strip()


class _HandbookParser(HTMLParser):
    """Headings, paragraphs (``div.para`` or ``p``) and list items of one DocBook HTML page, in order.

    A paragraph that holds a list is emitted in pieces: its text before the list, each item, the text after."""

    SKIP_TAGS = frozenset({"pre", "table", "script", "style"})
    SKIP_CLASSES = frozenset({"toc", "navheader", "navfooter", "list-of-figures", "list-of-tables",
                              "list-of-examples", "figure", "mediaobject", "screenshot", "programlisting",
                              "screen", "example", "informalexample", "docnav"})
    HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5"})
    VOID = frozenset({"br", "img", "meta", "link", "hr", "input", "col", "area", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []  # ("h" | "p" | "li", text)
        self._stack: list[tuple[str, bool]] = []  # (tag, opened a skipped region)
        self._skip = 0
        self._li = 0
        self._open: list[tuple[int, str, list[str]]] = []  # (stack depth, kind, text so far)

    def _flush(self, kind: str, buf: list[str]) -> None:
        text = clean("".join(buf))
        if text:
            self.blocks.append((kind, text))
        buf.clear()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skip = tag in self.SKIP_TAGS or bool(classes & self.SKIP_CLASSES)
        self._stack.append((tag, skip))
        self._skip += skip
        self._li += tag == "li"
        if self._skip:
            return
        kind = "h" if tag in self.HEADINGS else None
        if tag == "p" or (tag == "div" and "para" in classes):
            kind = "li" if self._li else "p"
        if kind is not None:
            if self._open:
                self._flush(self._open[-1][1], self._open[-1][2])
            self._open.append((len(self._stack), kind, []))

    def handle_endtag(self, tag: str) -> None:
        while self._stack and tag in {t for t, _ in self._stack}:
            open_tag, skip = self._stack.pop()
            self._skip -= skip
            self._li -= open_tag == "li"
            if self._open and self._open[-1][0] > len(self._stack):
                _, kind, buf = self._open.pop()
                self._flush(kind, buf)
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open and not self._skip:
            self._open[-1][2].append(data)


def read_handbook_page(path: Path) -> list[Section]:
    parser = _HandbookParser()
    parser.feed(path.read_text(encoding="utf-8"))
    sections: list[Section] = []
    for kind, text in parser.blocks:
        if kind == "h":
            sections.append(Section(_NUMBER.sub("", text).strip()))
        elif sections:
            sections[-1].paragraphs.append(f"- {text}" if kind == "li" else text)
    return [s for s in sections if s.title and s.paragraphs]


_LATIN = re.compile(r"[A-Za-z]")
_HAN_CHAR = re.compile(r"[\u4e00-\u9fff]")
_WORDS = re.compile(r"[^\W\d_]+")
FUNCTION_WORDS = {
    "en": {"the", "and", "is", "are", "of", "to", "with", "which", "this", "that", "for", "it", "be", "can"},
    "it": {"il", "la", "di", "che", "è", "e", "per", "un", "una", "del", "della", "con", "si", "non", "le"},
    "es": {"el", "la", "de", "que", "es", "y", "para", "un", "una", "del", "con", "se", "no", "los", "las"},
}


def untranslated(text: str, lang: str) -> bool:
    """True for a paragraph of a translation that is still (mostly) English: Chinese with more Latin letters
    than Han characters; Italian or Spanish with more English function words than its own (three at least)."""
    if lang == "en":
        return False
    if lang == "zh":
        return len(_LATIN.findall(text)) > 2 * len(_HAN_CHAR.findall(text)) and len(text) >= 40
    words = [w.lower() for w in _WORDS.findall(text)]
    english = sum(w in FUNCTION_WORDS["en"] for w in words)
    return english >= 3 and english > sum(w in FUNCTION_WORDS[lang] for w in words)


def handbook_documents(root: Path, package: str, lang: str) -> list[Document]:
    """One document per HTML page of the handbook in ``lang``; untranslated (English) paragraphs dropped:
    the English paragraph verbatim, or one that :func:`untranslated` finds mostly English."""
    base = root / "usr/share/doc/debian-handbook/html"
    english = set()
    if lang != "en":
        for page in sorted((base / HANDBOOK_LOCALES["en"]).glob("*.html")):
            english.update(p for s in read_handbook_page(page) for p in s.paragraphs)
    docs = []
    for page in sorted((base / HANDBOOK_LOCALES[lang]).glob("*.html")):
        sections = [Section(s.title, [p for p in s.paragraphs if p not in english and not untranslated(p, lang)])
                    for s in read_handbook_page(page)]
        sections = [s for s in sections if s.paragraphs]
        if sections:
            rel = str(page.relative_to(root))
            docs.append(Document(f"{HANDBOOK}/{HANDBOOK_LOCALES[lang]}/{page.name}",
                                 Source(HANDBOOK_SPDX, package, rel, sha256(page)), sections))
    return docs


def stdlib_functions(root: Path, package: str) -> list[Function]:
    """Functions and methods (dedented, decorators included) of the PSF-licensed stdlib modules."""
    base = root / STDLIB_ROOT
    out: list[Function] = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        parts = rel.split("/")
        if (any(p.startswith(("_", "test")) or p in {"tests", "idle_test", "lib2to3", "site-packages",
                                                          "dist-packages", "idlelib"} for p in parts)
                or rel.startswith(STDLIB_OTHER_LICENCES)):
            continue
        text = path.read_text(encoding="utf-8", errors="strict")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        digest = sha256(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("__"):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                code = textwrap.dedent("\n".join(lines[start:node.end_lineno])).strip("\n")
                out.append(Function(rel, Source(STDLIB_SPDX, package, f"{STDLIB_ROOT}/{rel}", digest),
                                    node.name, code, ast.get_docstring(node) is not None))
    return out


class TrainingText:
    """Character windows of the tiny pair's training corpus (whitespace collapsed, case folded).

    ``overlaps(text, lang)`` is True when ``text`` shares a run of 48 characters with any of the four
    corpora, or (Chinese text) a run of 16 characters with the Chinese one. Windows are stored at every
    fourth offset and looked up at every offset, so any shared run of window + 3 characters is found."""

    LONG, ZH = 48, 16

    def __init__(self, docs: dict[str, list[str]]) -> None:
        self.long: set[int] = set()
        self.zh: set[int] = set()
        for lang, texts in docs.items():
            for text in texts:
                t = clean(text).casefold()
                self.long.update(hash(t[i:i + self.LONG]) for i in range(0, len(t) - self.LONG + 1, 4))
                if lang == "zh":
                    self.zh.update(hash(t[i:i + self.ZH]) for i in range(0, len(t) - self.ZH + 1, 4))
        log.info("training text: %d windows of %d characters, %d Chinese windows of %d", len(self.long),
                 self.LONG, len(self.zh), self.ZH)

    def overlaps(self, text: str, lang: str) -> bool:
        t = clean(text).casefold()
        if any(hash(t[i:i + self.LONG]) in self.long for i in range(len(t) - self.LONG + 1)):
            return True
        return lang == "zh" and any(hash(t[i:i + self.ZH]) in self.zh for i in range(len(t) - self.ZH + 1))


def training_text(dest: Path) -> TrainingText:
    """Fetch the tiny pair's corpus packages (as :mod:`workloads.build.corpus` does) and index them."""
    roots = fetch([p for pair in corpus.PACKAGES.values() for p in pair], dest)
    docs = {lang: corpus.fortune_docs(roots[f]) + corpus.reference_docs(roots[r])
            for lang, (f, r) in corpus.PACKAGES.items()}
    if not all(docs.values()):
        raise SpectuneError("the tiny pair's corpus packages yielded no text: cannot check held-out prompts")
    return TrainingText(docs)
