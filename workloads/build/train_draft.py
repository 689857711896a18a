"""`python -m workloads.build.train_draft`: distil a small draft for SmolLM2-135M-Instruct (``models=smollm2``).

Recipe (DistillSpec-style; every choice recorded in TRAINING.json):

1. the target samples its own continuations (T = 1) of the training prompts, rendered through its chat
   template, in batches; its law at every sampled step is kept as top-k + the tail mass
   (:mod:`workloads.build.teacher_data`; held-out prompts are never trained on);
2. the draft vocabulary: the ``draft_vocab`` ids with the most teacher probability mass in those laws
   (plus the special tokens); q = 0 elsewhere (:mod:`spectune.models.draft_vocab`), which keeps the
   output layer, most of a small draft's cost, small;
3. the draft: a 2-layer Llama of the target's width, initialised from the target's first two layers,
   its final norm and the embedding rows of the draft vocabulary (tied, kept frozen);
4. training: forward KL + total variation between the teacher's bucketed law (top-k ids inside the draft
   vocabulary, and one "other" bucket holding everything else) and the draft's, on every continuation
   position; AdamW with warm-up and cosine decay; checkpoints every ``eval_every`` steps, with α's lower
   bound Σ_topk min(p, q) on held-out continuations per language (the curve against training minutes).

Weights are saved as bfloat16 into ``spectune/models/smollm2/draft`` with the target's tokenizer. Resumable:
rerunning the same command continues from the work directory's shards and checkpoint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from spectune.models import draft_vocab
from workloads.build import distil
from workloads.build.distil import LANGS, TARGET, Progress, Trainer, bucket_losses
from workloads.build.teacher_data import Sequence, sample_set

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "spectune" / "models" / "smollm2" / "draft"


@dataclass
class Recipe:
    """Everything that determines the weights."""

    seed: int = 20261201
    threads: int = 1  # on a shared, oversubscribed CPU one thread ran ~3x faster per row than two
    holdout: int = 128  # per language: the first N of the default seeded shuffle are never trained on
    val_per_language: int = 8  # held-out prompts sampled for the α curve (never trained on)
    teacher_dtype: str = "bfloat16"  # sampling only; batched bf16 is ~2x faster on this CPU
    gen_batch: int = 64
    max_new_tokens: int = 48  # the bundled workloads' max_new_tokens
    top_k: int = 64
    # training prompts per language (None: all; a seeded choice otherwise), each sampled ``rounds`` times
    train_prompts: dict = field(default_factory=lambda: {"en": None, "it": None, "es": None, "zh": None})
    rounds: int = 3
    draft_vocab: int = 12288
    # the draft vocabulary is chosen from the first N training sequences (None: all): a run resumed with more
    # teacher data keeps the vocabulary its checkpoint was trained with
    vocab_from: int | None = None
    # the target's first two layers: an untrained [0, 1] draft already gives Σ min(p, q) ≈ 0.06 on held-out
    # English, [0, 29] (first + last) ≈ 0.0 (the last layer expects late features)
    layers: list[int] = field(default_factory=lambda: [0, 1])
    # the tied embedding/head stays the target's own rows (the first runs: ~15k, then 515k teacher positions);
    # --train-embedding trains it too (7M more weights, no cost at inference) once the data can support it
    freeze_embedding: bool = True
    batch_size: int = 16
    steps: int = 300
    lr: float = 4e-4
    warmup: int = 20
    weight_decay: float = 0.0
    eval_every: int = 25


def work_folder(recipe: Recipe) -> Path:
    """Where teacher shards and checkpoints of this seed live by default (the cache)."""
    from spectune.models.gguf import cache_root

    return cache_root() / "train_draft" / f"seed{recipe.seed}"


def build_draft(target, recipe: Recipe, d2t: torch.Tensor):
    """A Llama of the target's width with ``recipe.layers`` copied from it and the draft vocabulary's rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = target.config.to_dict()
    for key in ("architectures", "_name_or_path", "_model_name_or_path", "dtype", "transformers_version"):
        cfg.pop(key, None)
    cfg.update(num_hidden_layers=len(recipe.layers), vocab_size=d2t.numel() + 1, tie_word_embeddings=True)
    cfg[draft_vocab.CONFIG_KEY] = {"full_vocab_size": target.config.vocab_size, "rows": d2t.numel(),
                                   "map_file": draft_vocab.MAP_FILE}
    draft = LlamaForCausalLM(LlamaConfig(**cfg)).float()
    with torch.no_grad():
        emb = target.get_input_embeddings().weight.float()
        outside = torch.ones(emb.shape[0], dtype=torch.bool)
        outside[d2t] = False
        rows = torch.cat([emb[d2t], emb[outside].mean(0, keepdim=True)])
        draft.get_input_embeddings().weight.copy_(rows)
        for mine, theirs in zip(draft.model.layers, recipe.layers, strict=True):
            mine.load_state_dict({k: v.float() for k, v in target.model.layers[theirs].state_dict().items()})
        draft.model.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
    draft.tie_weights()
    draft.get_input_embeddings().weight.requires_grad_(not recipe.freeze_embedding)
    return draft


def draft_outputs(draft, batch: list[Sequence], t2d: torch.Tensor, rows: int, pad_row: int):
    """Draft logits over its vocabulary at every continuation position of a right-padded batch."""
    inputs = [s.prompt + s.continuation[:-1] for s in batch]
    width = max(map(len, inputs))
    ids = torch.full((len(batch), width), pad_row, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for r, seq in enumerate(inputs):
        ids[r, :len(seq)] = t2d[torch.tensor(seq)]
        mask[r, :len(seq)] = 1
    hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state
    picks = torch.cat([hidden[r, len(s.prompt) - 1: len(s.prompt) - 1 + len(s.continuation)]
                       for r, s in enumerate(batch)])
    logits = F.linear(picks, draft.get_input_embeddings().weight[:rows])
    return logits, torch.cat([s.top_ids for s in batch]), torch.cat([s.top_probs for s in batch])


@torch.no_grad()
def evaluate(draft, val: list[Sequence], t2d, rows) -> dict[str, float]:
    draft.eval()
    out: dict[str, list[torch.Tensor]] = {}
    for i in range(0, len(val), 8):
        chunk = val[i:i + 8]
        logits, ti, tp = draft_outputs(draft, chunk, t2d, rows, rows)
        a = bucket_losses(logits, ti, tp, t2d, rows)["alpha_lb"]
        start = 0
        for s in chunk:
            out.setdefault(s.language, []).append(a[start:start + len(s.continuation)])
            start += len(s.continuation)
    draft.train()
    return {lang: round(float(torch.cat(v).mean()), 4) for lang, v in sorted(out.items())}


def main() -> None:
    parser = distil.arguments(__doc__.splitlines()[0], OUT, Recipe)
    parser.add_argument("--sample-until", default=None, help="UTC time HH:MM: train on the teacher data sampled "
                        "by then (recorded)")
    parser.add_argument("--train-embedding", action="store_true", help="train the tied embedding/head too (kept "
                        "frozen at the target's rows by default)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    distil.check_minimums(parser, (("--steps", args.steps, 0), ("--threads", args.threads, 1),
                                   ("--rounds", args.rounds, 1), ("--vocab-from", args.vocab_from, 1)))
    sample_rounds = distil.sample_rounds(parser, args.sample_rounds)
    recipe = Recipe(steps=args.steps, threads=args.threads, rounds=args.rounds, vocab_from=args.vocab_from,
                    freeze_embedding=not args.train_embedding)
    work = args.work or work_folder(recipe)
    started = distil.begin(recipe, work)

    target, tokenizer, source = distil.load_target(getattr(torch, recipe.teacher_dtype))
    eos = tokenizer.eos_token_id
    train_prompts, val_prompts = distil.split(tokenizer, recipe)
    kw = dict(max_new=recipe.max_new_tokens, top_k=recipe.top_k, eos=eos, pad=eos)
    val = sample_set(target, val_prompts, work / "val", recipe.gen_batch, seed=recipe.seed + 1,
                     progress=lambda x: tqdm(x, desc="teacher (held-out, for the curve)"), **kw)
    sampling_late = distil.time_box(args.sample_until, started)
    training_late = distil.time_box(args.stop_at, started)
    train = []
    for r in sample_rounds or range(recipe.rounds):
        train += sample_set(target, train_prompts, work / f"train-round{r}", recipe.gen_batch, seed=recipe.seed + 7 * r,
                            progress=lambda x, r=r: tqdm(x, desc=f"teacher (training prompts, round {r})"),
                            late=sampling_late, **kw)
    gen_minutes = (time.time() - started) / 60
    if sample_rounds is not None:
        log.info(f"sampled rounds {args.sample_rounds}: {len(train)} sequences ({gen_minutes:.1f} min); not training")
        return
    log.info(f"teacher data: {len(train)} sequences, {sum(len(s.continuation) for s in train)} positions "
             f"({gen_minutes:.1f} min)")

    d2t = distil.vocabulary(train, recipe, tokenizer, target.config.vocab_size)
    rows = d2t.numel()
    t2d = draft_vocab.target_to_draft_map(d2t, target.config.vocab_size)
    coverage = {lang: round(float(sum(float((t2d[s.top_ids.long()] < rows).float().mul(s.top_probs.float()).sum())
                                      for s in train if s.language == lang)
                                  / max(1, sum(len(s.continuation) for s in train if s.language == lang))), 4)
                for lang in LANGS}
    log.info(f"draft vocabulary {rows} ids; teacher top-{recipe.top_k} mass inside it: {coverage}")
    draft = build_draft(target, recipe, d2t)
    del target
    trainable = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=recipe.lr, weight_decay=recipe.weight_decay)
    ckpt = work / "checkpoint.pt"
    fresh_optimizer_at: list[int] = []  # steps where the trainable weights changed and AdamW restarted

    def evaluation() -> dict:
        return {"alpha_lb": evaluate(draft, val, t2d, rows)}

    def losses(gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        order = torch.randint(0, len(train), (recipe.batch_size,), generator=gen).tolist()
        logits, ti, tp = draft_outputs(draft, [train[i] for i in order], t2d, rows, rows)
        out = bucket_losses(logits, ti, tp, t2d, rows)
        return (out["kl"] + out["tv"]).mean(), {k: float(out[k].detach().mean()) for k in ("kl", "tv")}

    def weights() -> dict:
        return {"draft": draft.state_dict(), "opt": opt.state_dict(), "draft_to_target": d2t,
                "freeze_embedding": recipe.freeze_embedding, "fresh_optimizer_at": fresh_optimizer_at}

    def export(progress: Progress, stopped_early: bool) -> None:
        record = {"recipe": asdict(recipe), "fresh_optimizer_at": fresh_optimizer_at, "steps_done": progress.step,
                  "stopped_early": stopped_early, "sample_until": args.sample_until, "stop_at": args.stop_at,
                  "teacher": {"model": TARGET, **source, "sequences": len(train),
                              "positions": sum(len(s.continuation) for s in train),
                              "generation_minutes": round(gen_minutes, 1)},
                  "draft_vocab": {"ids": rows, "teacher_mass_inside_top_k": coverage},
                  "parameters": draft.num_parameters(), "curve": progress.curve,
                  "samples": {lang: [tokenizer.decode(s.continuation, skip_special_tokens=True)
                                     for s in val if s.language == lang][:3] for lang in LANGS},
                  "val_prompts": {lang: [tokenizer.decode(s.prompt) for s in val if s.language == lang][:3]
                                  for lang in LANGS}}
        distil.export(draft, save_with_map(d2t), tokenizer, args.out, record)

    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        fresh_optimizer_at += state.get("fresh_optimizer_at", [])
        # the vocabulary the checkpoint was trained with: its map, or (a checkpoint from before the map was kept,
        # trained with a frozen embedding) its embedding rows, the target's rows of that vocabulary
        key = "model.embed_tokens.weight"
        same = torch.equal(state["draft_to_target"], d2t) if "draft_to_target" in state \
            else torch.equal(state["draft"][key][:rows], draft.state_dict()[key][:rows])
        if not same:
            raise SystemExit(f"error: the checkpoint {ckpt} was trained with another draft vocabulary: pass the "
                             "--vocab-from it was chosen with (TRAINING.json) or start in a new --work folder")
        draft.load_state_dict(state["draft"])
        progress = Progress.resumed(state)
        if state.get("freeze_embedding", True) == recipe.freeze_embedding:
            opt.load_state_dict(state["opt"])
        else:  # other weights train now: AdamW's moments start afresh (recorded)
            fresh_optimizer_at.append(progress.step)
            log.info(f"the trainable weights changed at step {progress.step}: a fresh optimizer")
    else:
        progress = Progress.first(evaluation, distil.alpha_bound)
    draft.train()
    stopped_early = distil.distil(Trainer(losses, evaluation, weights, export), opt, trainable, recipe, progress,
                                  ckpt, training_late)
    log.info(f"done: {args.out} ({'stopped at --stop-at' if stopped_early else 'all steps'})")


def save_with_map(d2t: torch.Tensor):
    """How the export saves this draft: transformers' files and the draft vocabulary's id map beside them."""
    from safetensors.torch import save_file

    def save(draft, folder: Path) -> None:
        draft.save_pretrained(folder, safe_serialization=True)
        save_file({"draft_to_target": d2t.contiguous()}, str(folder / draft_vocab.MAP_FILE))

    return save


if __name__ == "__main__":
    main()
