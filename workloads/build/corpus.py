"""`python -m workloads.build.corpus`: rebuild the per-language training text from Debian packages.

The embedded tiny model pair (spectune/models/tiny) is trained on this text. It is GPL/other-licensed
prose, so it is fetched and extracted at build time only and written under ``workloads/corpus/``
(gitignored); nothing here is committed. Packages (Debian bookworm, ``apt-get download`` +
``dpkg-deb -x``, no installation, no root needed beyond what apt-get download itself needs):

=====  ===============================================  ==========================================
lang   fortune cookies                                  prose (the same manual in four languages)
=====  ===============================================  ==========================================
it     fortunes-it                                      debian-reference-it (GPL-2+)
en     fortunes (the BSD fortune data)                  debian-reference-en (GPL-2+)
zh     fortunes-zh (chinese, tang300, song100)          debian-reference-zh-cn (GPL-2+)
es     fortunes-es (offensive ``off/`` dir skipped)     debian-reference-es (GPL-2+)
=====  ===============================================  ==========================================

Output: ``workloads/corpus/{lang}.train.txt`` and ``{lang}.valid.txt`` — one document per line
(a fortune or a manual paragraph, whitespace collapsed), a seeded 2% of documents held out for the
validation loss. ``workloads/corpus/SOURCES.json`` records package versions and document counts.
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tqdm import tqdm

from spectune.errors import SpectuneError
from spectune.io import write_json

CORPUS_DIR = Path(__file__).resolve().parents[1] / "corpus"  # workloads/corpus/, where train_tiny reads it
LANGS = ("it", "en", "zh", "es")
PACKAGES: dict[str, tuple[str, str]] = {  # lang -> (fortune package, debian-reference package)
    "it": ("fortunes-it", "debian-reference-it"),
    "en": ("fortunes", "debian-reference-en"),
    "zh": ("fortunes-zh", "debian-reference-zh-cn"),
    "es": ("fortunes-es", "debian-reference-es"),
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WS = re.compile(r"\s+")


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")  # the oldest fortune files are ISO-8859-1


def _clean(doc: str) -> str:
    return _WS.sub(" ", _ANSI.sub("", doc)).strip()


def fortune_docs(root: Path) -> list[str]:
    """Every fortune (``%``-separated) in the extracted package, skipping offensive and index files."""
    base = root / "usr/share/games/fortunes"
    files = sorted(p for p in base.rglob("*") if p.is_file() and p.suffix not in (".dat", ".u8")
                   and "off" not in p.relative_to(base).parts and not p.name.endswith("-pre"))
    docs: list[str] = []
    for path in files:
        u8 = path.with_name(path.name + ".u8")  # fortunes-it ships UTF-8 twins beside latin-1 files
        text = _read_text(u8 if u8.exists() else path)
        docs.extend(d for d in (_clean(x) for x in re.split(r"^%\s*$", text, flags=re.M)) if len(d) >= 8)
    return docs


def reference_docs(root: Path) -> list[str]:
    """Paragraphs of the Debian Reference plain-text edition (blank-line separated)."""
    (txt,) = list((root / "usr/share/debian-reference").glob("debian-reference.*.txt.gz"))
    text = gzip.decompress(txt.read_bytes()).decode("utf-8")
    paragraphs = (_clean(p) for p in re.split(r"\n\s*\n", text))
    # Drop table-of-contents lines, rules and code fragments: keep text that has a few words in it.
    return [p for p in paragraphs if len(p) >= 20 and not re.fullmatch(r"[\d.\s]+.*", p[:6])]


def download(packages: list[str], dest: Path) -> dict[str, str]:
    """``apt-get download`` each package into ``dest`` and extract it; returns {package: .deb name}."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SpectuneError("build_corpus needs apt-get and dpkg-deb (a Debian/Ubuntu machine)")
    debs: dict[str, str] = {}
    for pkg in tqdm(packages, desc="apt-get download", unit="pkg"):
        out = subprocess.run(["apt-get", "download", pkg], cwd=dest, capture_output=True, text=True)
        found = sorted(dest.glob(f"{pkg}_*.deb"))
        if out.returncode != 0 or not found:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpectuneError(f"apt-get download {pkg} failed: {last} (run `apt-get update` first?)")
        subprocess.run(["dpkg-deb", "-x", str(found[0]), str(dest / pkg)], check=True)
        debs[pkg] = found[0].name
    return debs


def build(out_dir: Path, seed: int, valid_fraction: float) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {"seed": seed, "valid_fraction": valid_fraction, "languages": {}}
    with tempfile.TemporaryDirectory(prefix="spectune-debs-") as tmp:
        work = Path(tmp)
        debs = download([p for pair in PACKAGES.values() for p in pair], work)
        summary["debs"] = debs
        for lang in LANGS:
            fortune_pkg, ref_pkg = PACKAGES[lang]
            docs = fortune_docs(work / fortune_pkg) + reference_docs(work / ref_pkg)
            docs = list(dict.fromkeys(docs))  # exact duplicates out, order kept
            random.Random(f"{seed}-{lang}").shuffle(docs)
            n_valid = max(1, int(len(docs) * valid_fraction))
            (out_dir / f"{lang}.valid.txt").write_text("\n".join(docs[:n_valid]) + "\n", encoding="utf-8")
            (out_dir / f"{lang}.train.txt").write_text("\n".join(docs[n_valid:]) + "\n", encoding="utf-8")
            chars = sum(len(d) for d in docs)
            summary["languages"][lang] = {"packages": [fortune_pkg, ref_pkg], "documents": len(docs),
                                          "valid_documents": n_valid, "characters": chars}
            print(f"{lang}: {len(docs):6d} documents, {chars / 1e6:5.2f} M characters")
    write_json(out_dir / "SOURCES.json", summary)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CORPUS_DIR)
    parser.add_argument("--seed", type=int, default=20260923)
    parser.add_argument("--valid-fraction", type=float, default=0.02)
    args = parser.parse_args()
    try:
        build(args.out, args.seed, args.valid_fraction)
    except SpectuneError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
