"""`python -m workloads.build.draft_temperature`: fit the smollm2 draft's logit temperature on training data.

A draft distilled with forward KL covers the teacher's mass and comes out flatter than it, so dividing its logits
by a temperature τ < 1 can raise Σ min(p, q), the acceptance rate α at T = 1, for free (no weights change; the
engine stays exact for any q). τ is chosen by grid search on the **training** teacher data (sequences the draft
was trained on, from the last sampling round, never the held-out prompts), as the τ that maximises the pooled
Σ_topk min(p, q) (α's lower bound, :func:`~workloads.build.train_draft.bucket_losses`). It is written into the
draft's ``config.json`` (``spectune_draft_vocab.temperature``, applied by :mod:`harness.models.draft_vocab` when the
draft loads) and the fit into ``TRAINING.json``. The held-out α is then measured by ``task=acceptance``.
The argmax of q does not move, so greedy acceptance is unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from harness.models import draft_vocab
from workloads.build.teacher_data import Sequence
from workloads.build.train_draft import OUT, Recipe, bucket_losses, draft_outputs

log = logging.getLogger(__name__)
GRID = tuple(round(0.5 + 0.05 * i, 2) for i in range(15))  # 0.50 .. 1.20
WORK = Path.home() / ".cache" / "spectune" / "train_draft" / f"seed{Recipe.seed}"


def alpha_by_temperature(logits: torch.Tensor, top_ids: torch.Tensor, top_probs: torch.Tensor, t2d: torch.Tensor,
                         rows: int, grid: tuple[float, ...] = GRID) -> dict[float, torch.Tensor]:
    """Σ_topk min(p, q_τ) per position for each τ of ``grid``, q_τ = softmax(logits / τ) over the draft's ids."""
    return {tau: bucket_losses(logits / tau, top_ids, top_probs, t2d, rows)["alpha_lb"] for tau in grid}


def draft_logits(draft, sequences: list[Sequence], t2d: torch.Tensor, rows: int, batch: int = 8
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """The draft's untempered logits at every continuation position, the teacher's top-k, and each position's
    language."""
    parts, languages = [], []
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            chunk = sequences[i:i + batch]
            parts.append(draft_outputs(draft, chunk, t2d, rows, rows))
            languages += [s.language for s in chunk for _ in s.continuation]
    return (*(torch.cat([p[k] for p in parts]) for k in range(3)), languages)


def fit(draft_dir: Path, sequences: list[Sequence], grid: tuple[float, ...] = GRID) -> dict:
    """The τ of ``grid`` with the highest pooled α bound on ``sequences``, with the table per language."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(draft_dir).float().eval()  # unwrapped: untempered logits
    d2t = load_file(str(draft_dir / draft_vocab.MAP_FILE))["draft_to_target"]
    full = int(draft.config.to_dict().get(draft_vocab.CONFIG_KEY, {}).get("full_vocab_size", int(d2t.max()) + 1))
    rows, t2d = d2t.numel(), draft_vocab.target_to_draft_map(d2t, full)
    logits, top_ids, top_probs, languages = draft_logits(draft, sequences, t2d, rows)
    alphas = alpha_by_temperature(logits, top_ids, top_probs, t2d, rows, grid)
    pooled = {tau: float(a.mean()) for tau, a in alphas.items()}
    best = max(grid, key=lambda tau: (pooled[tau], -abs(tau - 1.0)))
    by_language = {lang: {str(tau): round(float(a[[x == lang for x in languages]].mean()), 4)
                          for tau, a in alphas.items()} for lang in sorted(set(languages))}
    return {"temperature": best, "objective": "pooled mean of sum over the teacher's top-k of min(p, q_tau)",
            "positions": len(languages), "sequences": len(sequences),
            "alpha_lb_pooled": {str(tau): round(v, 4) for tau, v in pooled.items()},
            "alpha_lb_by_language": by_language}


def load_training_sequences(work: Path, count: int) -> list[Sequence]:
    """The first ``count`` sequences of the last sampling round's shards (training data, in shard order)."""
    rounds = sorted(work.glob("train-round*"), key=lambda p: int(p.name.removeprefix("train-round")))
    if not rounds:
        raise SystemExit(f"error: no teacher data under {work} (train-round*/): run python -m "
                         "workloads.build.train_draft first, or give --work")
    out: list[Sequence] = []
    for shard in sorted(rounds[-1].glob("batch*.pt")):
        out += torch.load(shard, weights_only=False)
        if len(out) >= count:
            break
    return out[:count]


def write(draft_dir: Path, record: dict) -> None:
    """τ into config.json and the fit into TRAINING.json, each written to a temporary file and moved into place."""
    for name, update in (("config.json", lambda d: d[draft_vocab.CONFIG_KEY].update(temperature=record["temperature"])),
                         ("TRAINING.json", lambda d: d.update(temperature_fit=record))):
        path = draft_dir / name
        data = json.loads(path.read_text(encoding="utf-8"))
        update(data)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, default=OUT, help="the draft directory (its config gets τ)")
    parser.add_argument("--work", type=Path, default=WORK, help="train_draft's work directory (teacher shards)")
    parser.add_argument("--sequences", type=int, default=256, help="training sequences to fit on")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = parser.parse_args()
    if args.sequences < 1:
        parser.error(f"--sequences={args.sequences} is invalid: must be an integer >= 1")
    if not draft_vocab.is_reduced(args.draft):
        parser.error(f"--draft={str(args.draft)!r} is invalid: not a reduced-vocabulary draft directory "
                     f"(no {draft_vocab.MAP_FILE})")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    record = fit(args.draft, load_training_sequences(args.work, args.sequences))
    for lang, row in record["alpha_lb_by_language"].items():
        log.info("%s: %s", lang, "  ".join(f"τ={tau}: {a:.4f}" for tau, a in row.items()))
    log.info("pooled: %s", "  ".join(f"τ={tau}: {a:.4f}" for tau, a in record["alpha_lb_pooled"].items()))
    log.info("chosen τ = %s (%d training positions, %d sequences)", record["temperature"], record["positions"],
             record["sequences"])
    if not args.dry_run:
        write(args.draft, record)
        log.info("wrote %s and %s", args.draft / "config.json", args.draft / "TRAINING.json")


if __name__ == "__main__":
    main()
