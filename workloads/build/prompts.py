"""`python -m workloads.build.prompts --wheel chatterbot_corpus-1.3.3-py2.py3-none-any.whl`: rebuild the
bundled prompt sets ``workloads/prompts/{it,en,zh,es}.jsonl``.

Source: the chatterbot-corpus wheel (BSD-3-Clause, © Gunther Cox; get it with
``pip download --no-deps chatterbot-corpus==1.3.3``; it is *not* a runtime dependency). Each prompt is a
run of consecutive dialogue lines from one topic file, joined with newlines, cut so that every prompt is
24–48 tokens long in the target tokenizer: requests are comparable across languages in the unit the
models pay for. Chunks that share a line of 12+ characters with the training corpus are dropped
(prompts must be held out), as are duplicates. Writes ``workloads/prompts/STATS.json`` (length
distribution per language) which the NOTICE quotes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import zipfile
from pathlib import Path

import yaml
from transformers import AutoTokenizer

from spectune.io import write_json

WORKLOADS = Path(__file__).resolve().parents[1]  # workloads/: the corpus and the prompt sets live here
ROOT = WORKLOADS.parent
FOLDERS = {"it": "italian", "en": "english", "zh": "chinese", "es": "spanish"}
MIN_TOKENS, MAX_TOKENS = 24, 48


def dialogue_files(wheel: Path, folder: str) -> dict[str, list[list[str]]]:
    """{file name: conversations (lists of lines)} for one language, files in sorted order."""
    out: dict[str, list[list[str]]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if name.startswith(f"chatterbot_corpus/data/{folder}/") and name.endswith(".yml"):
                data = yaml.safe_load(zf.read(name).decode("utf-8")) or {}
                convs = [[str(x).strip() for x in c if str(x).strip()] for c in data.get("conversations", [])]
                out[Path(name).stem] = [c for c in convs if c]
    return out


def chunks(lines: list[str], n_tokens, lo: int, hi: int) -> list[str]:
    """Greedy non-overlapping runs of consecutive lines whose token count lands in [lo, hi]."""
    found, i = [], 0
    while i < len(lines):
        j, text = i, ""
        while j < len(lines):
            text = "\n".join(lines[i:j + 1])
            if n_tokens(text) >= lo:
                break
            j += 1
        if j < len(lines) and n_tokens(text) <= hi:
            found.append(text)
            i = j + 1
        else:
            i += 1  # the run overshoots the band (or the file ran out): start at the next line
    return found


def corpus_lines(lang: str) -> set[str]:
    path = WORKLOADS / "corpus" / f"{lang}.train.txt"
    return set(path.read_text(encoding="utf-8").splitlines()) if path.exists() else set()


def build(wheel: Path, tokenizer_path: Path, out_dir: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(str(tokenizer_path))
    n_tokens = lambda text: len(tok(text)["input_ids"])  # noqa: E731 - includes BOS, as the harness sees it
    shown = tokenizer_path.resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    stats: dict = {"tokenizer": str(shown), "band": [MIN_TOKENS, MAX_TOKENS], "languages": {}}
    out_dir.mkdir(parents=True, exist_ok=True)
    for lang, folder in FOLDERS.items():
        train_text = corpus_lines(lang)
        joined = "\n".join(train_text)
        prompts, seen = [], set()
        for stem, convs in dialogue_files(wheel, folder).items():
            for text in chunks([line for c in convs for line in c], n_tokens, MIN_TOKENS, MAX_TOKENS):
                if text in seen or any(len(x) >= 12 and x in joined for x in text.split("\n")):
                    continue
                seen.add(text)
                prompts.append({"id": f"{lang}-{stem}-{len(prompts):04d}", "prompt": text,
                                "source": f"chatterbot-corpus 1.3.3 data/{folder}/{stem}.yml"})
        lengths = [n_tokens(p["prompt"]) for p in prompts]
        with (out_dir / f"{lang}.jsonl").open("w", encoding="utf-8") as f:
            for p in prompts:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        stats["languages"][lang] = {
            "prompts": len(prompts), "min": min(lengths), "p50": statistics.median(lengths),
            "mean": round(statistics.fmean(lengths), 2), "max": max(lengths),
            "checked_against_corpus": bool(train_text)}
        print(lang, stats["languages"][lang])
    write_json(out_dir / "STATS.json", stats)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "spectune/models/tiny/target")
    parser.add_argument("--out", type=Path, default=WORKLOADS / "prompts")
    args = parser.parse_args()
    build(args.wheel, args.tokenizer, args.out)


if __name__ == "__main__":
    main()
