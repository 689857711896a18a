"""The teacher's side of draft distillation: its own sampled continuations and its law at every step.

DistillSpec's recipe: a draft for speculative decoding should match the target's law on the contexts a
speculative decoder visits, i.e. on the target's own continuations. Sampling the target in batches gives
both at once: the logits a token is sampled from *are* the teacher's law at that position. Each law is
kept as its top-k ids and probabilities; the mass outside them (the "other" bucket) is 1 − Σ top-k, which
the loss keeps (α at T = 1 depends on the tail).

Prompts come from the bundled workloads rendered through the target's chat template, excluding the first
``holdout`` prompts of each bundled workload's default seeded shuffle (the prefix every evaluation takes:
``task=acceptance``/``bench`` use the first 16, ``policies.evaluate`` the first 96), so no evaluated prompt is
ever trained on. Work is written as one shard per batch, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from spectune.engine.kv import cache_argument
from workloads.loader import render

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Sequence:
    """One prompt and the target's continuation, with the teacher's top-k law at each continuation step."""

    language: str
    prompt: list[int]
    continuation: list[int]
    top_ids: torch.Tensor  # [n, k] int32
    top_probs: torch.Tensor  # [n, k] float16
    # the target's last hidden state (what its LM head reads) at every position but the last,
    # [len(prompt) + n - 1, H] bfloat16: the input of a draft that reads the target's features
    features: torch.Tensor | None = None


def bundled_workload(language: str) -> dict:
    """The bundled workload's config as ``+workload=<language>`` composes it (defaults + the language file)."""
    base = OmegaConf.load(ROOT / "conf" / "workload" / "_bundled.yaml")
    own = OmegaConf.load(ROOT / "conf" / "workload" / f"{language}.yaml")
    base.pop("defaults", None)  # Hydra's defaults lists (the schema, the base file), not workload keys
    own.pop("defaults", None)
    return OmegaConf.to_container(OmegaConf.merge(base, own), resolve=True)


def _bundled(tokenizer, language: str, holdout: int) -> tuple[Path, list[tuple[str, str]], list]:
    """The bundled prompt file of ``language`` (its path, its (id, text) records) and its held-out prompts: the
    first ``holdout`` of the default workload's seeded shuffle within its length band, through the chat template."""
    from workloads.loader import load_workload, read_jsonl, resolve_path

    spec = bundled_workload(language)
    spec.update(num_prompts=None, chat_template=True)
    path = resolve_path(spec["path"])
    return path, read_jsonl(path, spec["field"]), load_workload(spec, tokenizer).prompts[:holdout]


def _seeded_subset(items: list, limit: int | None, seed: int) -> list:
    """At most ``limit`` of ``items`` (a seeded choice, in their order)."""
    if limit is None or len(items) <= limit:
        return items
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), limit))]


def split_prompts(tokenizer, language: str, holdout: int, limit: int | None = None, seed: int = 0
                  ) -> tuple[list[list[int]], list[list[int]]]:
    """(training prompts, held-out prompts) of one language, rendered through the chat template.

    Held out: the first ``holdout`` prompts of the default workload's seeded shuffle within its length band
    (what every task evaluates on). Training: every other prompt of the file, in or out of the band (at most
    ``limit`` of them, a seeded choice).
    """
    _, records, heldout = _bundled(tokenizer, language, holdout)
    heldout_ids = {p.id for p in heldout}
    train = [render(tokenizer, text) for pid, text in records if pid not in heldout_ids]
    return _seeded_subset(train, limit, seed), [p.input_ids for p in heldout]


def window_prompts(tokenizer, language: str, holdout: int, limit: int | None = None, seed: int = 0, lo: int = 16,
                   hi: int = 64) -> list[list[int]]:
    """More training prompts of one language from the same dialogues: every run of consecutive lines of one
    source file's training prompts that is ``lo``..``hi`` tokens long (at most ``limit``, a seeded choice),
    rendered through the chat template.

    The bundled prompts cut each dialogue file into non-overlapping runs, so a language has only as many
    prompts as runs (631 English ones for training). A greedy continuation is one per prompt, so greedy
    acceptance's training data grows only with new prompts, and overlapping runs give many. No run holds a
    line whose text is in a held-out prompt (checked by text, not position: the dialogues repeat lines), and
    none equals a bundled prompt.
    """
    runs = _window_runs(tokenizer, language, holdout, lo, hi)
    return [render(tokenizer, text) for text in _seeded_subset(runs, limit, seed)]


def window_tranches(tokenizer, language: str, holdout: int, counts: list[int], seed: int = 0, lo: int = 16,
                    hi: int = 64) -> list[list[list[int]]]:
    """:func:`window_prompts` grown in disjoint tranches: ``counts`` are increasing totals N1 < N2 < ...; tranche
    k holds N_k − N_(k−1) runs, a seeded choice among those no earlier tranche took. The first tranche is
    ``window_prompts(..., N1, seed)``, so a larger set keeps the shards a smaller one sampled."""
    return [[render(tokenizer, text) for text in tranche]
            for tranche in _tranches(_window_runs(tokenizer, language, holdout, lo, hi), counts, seed)]


def _tranches(items: list[str], counts: list[int], seed: int) -> list[list[str]]:
    """Disjoint seeded choices of ``items``: tranche k holds N_k − N_(k−1) of those no earlier tranche took (the
    first is ``_seeded_subset(items, N1, seed)``)."""
    out, remaining = [], items
    for before, total in itertools.pairwise([0, *counts]):
        chosen = _seeded_subset(remaining, total - before, seed)
        taken = set(chosen)
        remaining = [text for text in remaining if text not in taken]
        out.append(chosen)
    return out


def corpus_prompts(tokenizer, language: str, holdout: int, limit: int | None = None, seed: int = 0, lo: int = 16,
                   hi: int = 64, corpus_dir: Path | None = None) -> list[list[int]]:
    """Training prompts from text outside the bundled dialogues: every document of the language's build corpus
    (``workloads/corpus/<language>.train.txt``, from ``python -m workloads.build.corpus``: fortunes and a manual's
    paragraphs) that is ``lo``..``hi`` tokens long, at most ``limit`` of them (a seeded choice), rendered through
    the chat template.

    The dialogues' windows run out (every English run of 16–64 tokens is already a prompt); greedy data grows
    only with new prompts. No document contains a line of a held-out prompt (lines of 12+ characters, checked by
    text, as the prompt-set builder checks the corpus); duplicates count once.
    """
    return [render(tokenizer, text) for text in _seeded_subset(_corpus_docs(tokenizer, language, holdout, lo, hi,
                                                                              corpus_dir), limit, seed)]


def corpus_tranches(tokenizer, language: str, holdout: int, counts: list[int], seed: int = 0, lo: int = 16,
                    hi: int = 64, corpus_dir: Path | None = None) -> list[list[list[int]]]:
    """:func:`corpus_prompts` grown in disjoint tranches, as :func:`window_tranches` grows the windows: the first
    tranche is ``corpus_prompts(..., N1, seed)``, so a larger set keeps the shards a smaller one sampled."""
    docs = _corpus_docs(tokenizer, language, holdout, lo, hi, corpus_dir)
    return [[render(tokenizer, text) for text in tranche] for tranche in _tranches(docs, counts, seed)]


def _corpus_docs(tokenizer, language: str, holdout: int, lo: int, hi: int, corpus_dir: Path | None) -> list[str]:
    """Every qualifying document's text (see :func:`corpus_prompts`), in file order, each once."""
    from spectune.errors import SpectuneError
    from workloads.build.corpus import CORPUS_DIR

    path = (corpus_dir or CORPUS_DIR) / f"{language}.train.txt"
    if not path.is_file():
        raise SpectuneError(f"{path} is missing: run `python -m workloads.build.corpus` first")
    _, records, heldout = _bundled(tokenizer, language, holdout)
    heldout_ids = {p.id for p in heldout}
    banned = [line for pid, text in records if pid in heldout_ids for line in text.split("\n") if len(line) >= 12]
    docs = [doc for doc in path.read_text(encoding="utf-8").split("\n")
            if doc and lo <= len(tokenizer(doc)["input_ids"]) <= hi and not any(line in doc for line in banned)]
    return list(dict.fromkeys(docs))


def _window_runs(tokenizer, language: str, holdout: int, lo: int, hi: int) -> list[str]:
    """Every window run's text (see :func:`window_prompts`), in file order."""
    from workloads.loader import read_jsonl

    path, records, heldout = _bundled(tokenizer, language, holdout)
    heldout_ids = {p.id for p in heldout}
    banned = {line for pid, text in records if pid in heldout_ids for line in text.split("\n")}
    bundled = {text for _, text in records}
    files: dict[str, list[str]] = {}
    for (pid, text), (_, source) in zip(records, read_jsonl(path, "source"), strict=True):
        if pid not in heldout_ids:
            files.setdefault(source, []).extend(text.split("\n"))
    found: dict[str, None] = {}  # ordered and unique
    for lines in files.values():
        sizes = [len(tokenizer(line)["input_ids"]) for line in lines]
        for i in range(len(lines)):
            total = 0
            for j in range(i, len(lines)):
                total += sizes[j]
                if total > hi or lines[j] in banned or len(lines[j]) < 3:  # < 3: the corpus's stray characters
                    break
                text = "\n".join(lines[i:j + 1])
                if total >= lo and text not in bundled:
                    found[text] = None
    return list(found)


@torch.no_grad()
def sample_batch(model, prompts: list[list[int]], max_new: int, top_k: int, eos: int, pad: int,
                 gen: torch.Generator, features: bool = False, greedy: bool = False
                 ) -> list[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Sample continuations of left-padded prompts at T = 1 (``greedy``: the argmax) with a KV cache; keep each
    step's top-k law at T = 1 (and, with ``features``, the target's last hidden state at every position fed)."""
    from spectune.engine.features import HiddenTap

    tap = HiddenTap(model) if features else None
    batch, width = len(prompts), max(map(len, prompts))
    ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    cache_arg = cache_argument(model)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    fed = [tap.last.to(torch.bfloat16)] if tap else []
    done = torch.zeros(batch, dtype=torch.bool)
    tokens, tops, probs = [], [], []
    for _ in range(max_new):
        law = torch.softmax(out.logits[:, -1].float(), -1)
        x = law.argmax(-1) if greedy else torch.multinomial(law, 1, generator=gen).squeeze(1)
        p, i = law.topk(top_k, -1)
        tokens.append(torch.where(done, pad, x))
        tops.append(i.int())
        probs.append(p.half())
        done |= x == eos
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=x.unsqueeze(1), attention_mask=mask, position_ids=positions, use_cache=True,
                    **{cache_arg: out[cache_arg]})
        if tap:
            fed.append(tap.last.to(torch.bfloat16))
    if tap:
        tap.remove()
    seq, top, prob = torch.stack(tokens, 1), torch.stack(tops, 1), torch.stack(probs, 1)
    hidden = torch.cat(fed, 1) if tap else None  # [B, width + steps fed, H]
    results = []
    for row, prompt in enumerate(prompts):
        cont = seq[row].tolist()
        n = cont.index(eos) + 1 if eos in cont else len(cont)
        feats = hidden[row, width - len(prompt): width + n - 1].clone() if tap else None
        results.append((cont[:n], top[row, :n].clone(), prob[row, :n].clone(), feats))
    return results


def sample_set(model, prompts: list[tuple[str, list[int]]], shard_dir: Path, batch_size: int, max_new: int,
               top_k: int, eos: int, pad: int, seed: int, progress, late=lambda: False, features: bool = False,
               greedy: bool = False, part: tuple[int, int] = (0, 1)) -> list[Sequence]:
    """Sample every prompt once, ``batch_size`` at a time (similar lengths together), one shard per batch.

    ``late()`` true stops before the next new batch: the shards done so far are the data (a time box).
    ``part=(i, n)``: only batches ``b`` with ``b % n == i`` (n processes on disjoint parts use n cores; the
    batches and their seeds do not depend on the split)."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i][1]), i))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(chunks)  # any prefix of the work is a fair sample of languages and lengths
    out: list[Sequence] = []
    for b, chunk in enumerate(progress(chunks)):
        if b % part[1] != part[0]:
            continue
        shard = shard_dir / f"batch{b:04d}.pt"
        if shard.is_file():
            out += torch.load(shard, weights_only=False)
            continue
        if late():
            log.info(f"time box reached: {b} of {len(chunks)} batches sampled")
            break
        gen = torch.Generator().manual_seed(seed * 1000 + b)
        rows = sample_batch(model, [prompts[i][1] for i in chunk], max_new, top_k, eos, pad, gen, features, greedy)
        seqs = [Sequence(prompts[i][0], prompts[i][1], *row) for i, row in zip(chunk, rows, strict=True)]
        tmp = shard.with_suffix(".tmp")
        torch.save(seqs, tmp)
        tmp.replace(shard)
        out += seqs
    return out
