"""`python -m workloads.answers RUN_DIR`: what the target actually answered, per category, in a bench run.

Speed-ups depend on what the target writes as much as on the prompt: a model that stops at once, answers in the
wrong language or loops on one phrase is accepted differently from one that answers the task. For each request
of the run (one method, ``--method``, default ``ar``), from its recorded output token ids:

- **finish reason**: ``stop`` (the last token is an end-of-sequence id), ``length`` (``max_new_tokens``
  reached), ``other`` (neither: an error or an empty output);
- **output language**: ``zh`` when most letters are Han characters, else the one of ``it``/``en``/``es`` whose
  commonest function words are most frequent (``unknown`` when none shows); ``expected`` is the prompt's
  language, or the target language of a ``translate`` prompt;
- **repetition**: the share of the output's token 4-grams that already occurred earlier in the same output
  (0: no loop; near 1: the answer repeats itself);
- **output tokens**;
- **draft-vocabulary coverage** (a draft with a reduced vocabulary, :mod:`spectune.models.draft_vocab`, only): the
  share of output tokens the draft can propose at all; the rest can only come from the residual, so it bounds
  what acceptance can reach on that category.

A request's category is its recorded ``category`` (runs before requests carried it: from its prompt id; other
prompts are ``chat-lines``). The table per (language, category) is logged and, with ``--out FILE.csv``, written per
request; ``task=bench`` puts it in ``summary.json`` (``answers_by_category``) and says under its tables in which
categories the target did not do what was asked (:func:`warnings`). On the tiny pair (a base model) these describe
plumbing only: it does not follow instructions.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from spectune.errors import SpectuneError
from spectune.methods import BASELINE
from spectune.run import rundir
from spectune.run.cli import ArgumentParser, run_command
from workloads.categories import LANGUAGES, read_category_file

log = logging.getLogger(__name__)

_HAN = re.compile(r"[\u4e00-\u9fff]")
_LETTER = re.compile(r"[^\W\d_]")
_WORD = re.compile(r"[^\W\d_]+")
FUNCTION_WORDS = {
    "en": frozenset({"the", "and", "is", "are", "of", "to", "with", "which", "this", "that", "for", "it", "you"}),
    "it": frozenset({"il", "la", "di", "che", "è", "per", "un", "una", "del", "della", "con", "sono", "gli"}),
    "es": frozenset({"el", "la", "de", "que", "es", "para", "un", "una", "del", "con", "los", "las", "por"}),
}


def finish_reason(output_ids: Iterable[int], max_new_tokens: int, eos_ids: Iterable[int]) -> str:
    ids = list(output_ids)
    if ids and ids[-1] in set(eos_ids):
        return "stop"
    if len(ids) >= max_new_tokens:
        return "length"
    return "other"


def repetition_rate(ids: Iterable[int], n: int = 4) -> float:
    """Share of the n-grams of ``ids`` that already occurred earlier in ``ids`` (0.0 when there are none)."""
    seq = list(ids)
    grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / len(grams)


def output_language(text: str) -> str:
    """``zh``, ``it``, ``en``, ``es`` or ``unknown`` (see the module docstring)."""
    letters = len(_LETTER.findall(text))
    if letters and len(_HAN.findall(text)) * 2 > letters:
        return "zh"
    words = [w.lower() for w in _WORD.findall(text)]
    counts = {lang: sum(w in table for w in words) for lang, table in FUNCTION_WORDS.items()}
    best = max(counts, key=lambda k: counts[k])
    ranked = sorted(counts.values(), reverse=True)
    return best if ranked[0] >= 2 and ranked[0] > ranked[1] else "unknown"


def category_index(languages: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{prompt id: its record} for the built categories of ``languages``."""
    return {r["id"]: r for lang in languages if lang in LANGUAGES for r in read_category_file(lang)}


def draft_vocabulary(draft: Any) -> frozenset[int] | None:
    """The target ids a draft can propose: those of its reduced vocabulary's map
    (:class:`spectune.models.draft_vocab.ScatterHead`), None for a draft over the whole vocabulary."""
    head = getattr(draft, "lm_head", None)
    ids = getattr(head, "draft_to_target", None)
    return None if ids is None else frozenset(int(i) for i in ids.tolist())


def describe_answers(requests: pd.DataFrame, decode: Any, eos_ids: list[int], max_new_tokens: int,
                     index: dict[str, dict[str, Any]], draft_ids: frozenset[int] | None = None) -> pd.DataFrame:
    """One row per request: language, category, finish reason, output and expected language, repetition, length and,
    with ``draft_ids`` (:func:`draft_vocabulary`), the share of its output tokens the draft can propose."""
    rows = []
    recorded = "category" in requests
    for r in requests.itertuples(index=False):
        rec = index.get(str(r.prompt_id))
        ids = [int(i) for i in r.output_ids]
        body = ids[:-1] if ids and ids[-1] in set(eos_ids) else ids
        category = r.category if recorded and isinstance(r.category, str) else rec["task"] if rec else "chat-lines"
        rows.append({
            "prompt_id": r.prompt_id, "language": r.language, "category": category,
            "finish": finish_reason(ids, max_new_tokens, eos_ids),
            "output_language": output_language(decode(body)),
            "expected_language": (rec or {}).get("target_language", r.language),
            "repetition": repetition_rate(body), "output_tokens": len(ids),
            "draft_vocab_coverage": (sum(i in draft_ids for i in ids) / len(ids) if ids else None)
            if draft_ids is not None else None})
    return pd.DataFrame(rows)


def by_category(answers: pd.DataFrame) -> pd.DataFrame:
    """Per (language, category): requests, shares of stop / length, share in the expected language, medians, and the
    draft's vocabulary coverage of the output tokens (NaN for a draft over the whole vocabulary)."""
    g = answers.assign(stop=answers.finish == "stop", length=answers.finish == "length",
                       in_language=answers.output_language == answers.expected_language,
                       coverage=answers.get("draft_vocab_coverage", pd.Series(None, index=answers.index))
                       .astype(float))
    return g.groupby(["language", "category"], sort=False).agg(
        requests=("prompt_id", "size"), stop=("stop", "mean"), length=("length", "mean"),
        in_expected_language=("in_language", "mean"), repetition_p50=("repetition", "median"),
        output_tokens_p50=("output_tokens", "median"), draft_vocab_coverage=("coverage", "mean")).round(3)


IN_LANGUAGE_MIN = 0.5  # below: most answers are not in the language the prompt asks for
REPETITION_MAX = 0.3  # above (median 4-gram repetition): most answers loop


def warnings(table: pd.DataFrame) -> list[str]:
    """One line per (language, category) whose answers show that the target does not do what its prompts ask: most
    answers in another language than asked, or looping; its speed-ups then describe that text, not the category."""
    lines = []
    for (lang, category), row in table.iterrows():
        if category == "chat-lines":
            continue
        why = []
        if row["in_expected_language"] < IN_LANGUAGE_MIN:
            why.append(f"{100 * row['in_expected_language']:.0f}% of answers in the expected language")
        if row["repetition_p50"] > REPETITION_MAX:
            why.append(f"median 4-gram repetition {row['repetition_p50']:.2f}")
        if why:
            lines.append(f"{category} ({lang}): the target does not seem to do what these prompts ask "
                         f"({'; '.join(why)}): its numbers describe what it wrote instead")
    return lines


def answers_by_category(requests: pd.DataFrame, decode: Any, eos_ids: list[int], max_new_tokens: int,
                        draft_ids: frozenset[int] | None = None) -> pd.DataFrame:
    """:func:`by_category` of one method's requests of one repeat (a bench run's ``ar``, repeat 0)."""
    index = category_index(set(requests["language"]))
    return by_category(describe_answers(requests, decode, eos_ids, max_new_tokens, index, draft_ids))


def reading(tokenizer: Any) -> tuple[Any, list[int]]:
    """How the answers of a target with ``tokenizer`` are read: its decoder (special tokens dropped) and the EOS
    ids it stops at (none, one or several)."""
    eos = tokenizer.eos_token_id
    eos_ids = list(eos) if isinstance(eos, list) else [eos] if eos is not None else []
    return (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)), eos_ids


def _tokenizer(models: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    from spectune.models import gguf
    from spectune.models.loading import resolve

    name = models["target"]["name_or_path"]
    if gguf.is_gguf(name):
        path = gguf.locate(name)
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    folder, _ = resolve(name)
    return AutoTokenizer.from_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m workloads.answers", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a bench run directory (metadata.json, requests.parquet)")
    parser.add_argument("--method", default=BASELINE, help="whose answers (a method label of the run; default ar)")
    parser.add_argument("--out", type=Path, default=None, help="write the per-request table to this CSV file")

    def body(args: argparse.Namespace) -> int:
        meta = rundir.METADATA.read(args.run_dir)
        requests = rundir.REQUESTS.read(args.run_dir)
        mine = requests[(requests["method"] == args.method) & (requests["repeat"] == requests["repeat"].min())]
        if mine.empty:
            raise SpectuneError(f"--method {args.method!r} has no requests in {args.run_dir}: the run has "
                                f"{', '.join(sorted(requests['method'].unique()))}")
        decode, eos_ids = reading(_tokenizer(meta["config"]["models"]))
        answers = describe_answers(mine, decode, eos_ids, int(meta["workload"]["max_new_tokens"]),
                                   category_index(set(mine["language"])))
        log.info("answers of %s in %s (models=%s):\n%s", args.method, args.run_dir, meta["config"]["models"]["name"],
                 by_category(answers).to_string())
        if args.out is not None:
            answers.to_csv(args.out, index=False)
            log.info("per request: %s", args.out)
        return 0

    return run_command(parser, body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
