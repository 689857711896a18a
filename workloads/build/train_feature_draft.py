"""`python -m workloads.build.train_feature_draft`: an EAGLE-style draft for SmolLM2-135M-Instruct.

Recipe (every choice recorded in TRAINING.json):

1. teacher data as for the independent draft (:mod:`workloads.build.train_draft`): the target samples its own
   continuations (T = 1) of the training prompts through its chat template, keeping its top-k law at every
   step, and here also its last hidden state at every position fed (:mod:`workloads.build.teacher_data`);
2. the draft (:mod:`spectune.models.feature_draft`): fc([embed(x_j), f_{j-1}]) → decoder layer(s) → norm →
   f̂_j → a head over the draft vocabulary; the embedding is the target's (frozen, borrowed);
3. loss at every continuation position: forward KL + TV between the teacher's bucketed law and q (DistillSpec),
   plus a smooth-L1 regression of f̂_j on the target's f_j (EAGLE's feature loss, weight ``feature_weight``),
   and optionally a cross-entropy on the target's argmax (weight ``argmax_weight``: greedy acceptance is argmax
   agreement, which matching the law at T = 1 serves only indirectly);
   deeper draft steps feed the draft's own f̂, so the recipe trains draft steps 1..``depth`` as a cycle computes
   them (:func:`spectune.models.feature_draft.unrolled`, EAGLE-3's training-time test), with Gaussian noise on the
   target's features against the rest of the train/test gap (EAGLE's augmentation);
4. AdamW with warm-up and cosine decay; checkpoints with α's lower bound on held-out continuations per language
   and per draft depth (1: the target's features; 2: one predicted feature), and the draft's argmax agreement with
   the target on the same prompts' greedy continuations (greedy acceptance at draft step 1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from spectune.models import draft_vocab, feature_draft
from spectune.models.gguf import sha256
from workloads.build import distil
from workloads.build.corpus import CORPUS_DIR
from workloads.build.distil import LANGS, TARGET, Progress, Trainer, bucket_losses
from workloads.build.teacher_data import Sequence, corpus_tranches, sample_set, window_tranches

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "spectune" / "models" / "smollm2" / "feature-draft"


@dataclass
class Recipe:
    """Everything that determines the weights."""

    seed: int = 20261201
    threads: int = 1
    holdout: int = 128  # as the independent draft: the first N of each default shuffle are never trained on
    val_per_language: int = 8
    teacher_dtype: str = "bfloat16"
    gen_batch: int = 64
    max_new_tokens: int = 48
    top_k: int = 64
    train_prompts: dict = field(default_factory=lambda: {"en": None, "it": None, "es": None, "zh": None})
    rounds: int = 4
    # plus one greedy round (every training prompt continued by the argmax, the law kept at T = 1): greedy
    # decoding visits contexts no T = 1 sample does, and greedy acceptance is measured on them
    greedy_round: bool = True
    draft_vocab: int = 12288
    vocab_from: int | None = None
    layers: int = 1
    feature_weight: float = 0.1  # smooth-L1 on features, beside KL + TV on the law (EAGLE weighs them 0.1 : 1 too)
    depth: int = 2  # draft steps trained (training-time test): step 1 reads the target's features, later ones f̂
    deep_weight: float = 0.5  # the share of the loss on steps 2..depth (spread evenly), the rest on step 1
    feature_noise: float = 0.05  # std of Gaussian noise on the target's features in training (features are normed)
    argmax_weight: float = 0.0  # cross-entropy of q on the teacher's argmax, beside KL + TV (greedy acceptance)
    greedy_share: float | None = None  # share of each batch drawn from the greedy round (None: uniform over all)
    # {language: [N1, N2, ...]}: N_k more prompts of that language in all (overlapping dialogue runs, in disjoint
    # tranches N_{k-1}..N_k) continued greedily, into the greedy pool: greedy data grows only with prompts
    # (teacher_data.window_tranches)
    greedy_windows: dict | None = None
    # {language: [N1, N2, ...]}: N_k documents of the build corpus in all (text outside the dialogues, in disjoint
    # tranches as the windows; teacher_data.corpus_tranches) continued greedily, into the greedy pool
    greedy_text: dict | None = None
    batch_size: int = 16
    steps: int = 2000
    lr: float = 5e-4
    warmup: int = 20
    eval_every: int = 50
    first_round: int = 0  # train on rounds first_round..rounds-1 (a fine-tune on fresh rounds only)
    init_from: str | None = None  # an exported draft to start from (its weights and vocabulary; a fresh optimiser)
    init_sha256: str | None = None  # of its model.safetensors


def work_folder(recipe: Recipe) -> Path:
    from spectune.models.gguf import cache_root

    # shards sampled in another dtype are other data: they never share a folder with the default's
    suffix = "" if recipe.teacher_dtype == "bfloat16" else f"-{recipe.teacher_dtype}"
    return cache_root() / "train_feature_draft" / f"seed{recipe.seed}{suffix}"


def batch_tensors(batch: list[Sequence], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (entry tokens x_1..x_{N-1}, features f_0..f_{N-2}, attention mask) of a batch.

    Entry j pairs token x_j with the target's feature f_{j-1}; its output predicts f_j (the law of x_{j+1}).
    """
    seqs = [s.prompt + s.continuation for s in batch]
    width = max(len(s) for s in seqs) - 2
    hidden = batch[0].features.shape[-1]
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    feats = torch.zeros(len(batch), width, hidden)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for r, (s, seq) in enumerate(zip(batch, seqs, strict=True)):
        n = len(seq) - 2
        ids[r, :n] = torch.tensor(seq[1:-1])
        feats[r, :n] = s.features[: n].float()
        mask[r, :n] = 1
    return ids, feats, mask


def continuation_rows(batch: list[Sequence]) -> list[tuple[int, int, int]]:
    """(row, first entry, count) of the entries whose output is a continuation law: entry j predicts x_{j+1},
    so continuation token i (at sequence index P + i) is predicted by entry P + i - 1, i.e. column P + i - 2."""
    return [(r, len(s.prompt) - 2, len(s.continuation)) for r, s in enumerate(batch)]


def losses_of(draft, batch: list[Sequence], hidden: torch.Tensor, t2d, rows: int, feats_next: torch.Tensor | None
              ) -> dict[str, torch.Tensor]:
    picks = [(r, a, n) for r, a, n in continuation_rows(batch)]
    h = torch.cat([hidden[r, a: a + n] for r, a, n in picks])
    logits = draft.draft_logits(h)
    ti = torch.cat([s.top_ids for s in batch])
    tp = torch.cat([s.top_probs for s in batch])
    out = bucket_losses(logits, ti, tp, t2d, rows)
    if feats_next is not None:
        target = torch.cat([feats_next[r, a: a + n] for r, a, n in picks])
        out["feature"] = F.smooth_l1_loss(h, target, reduction="none").mean(-1)
    return out


def next_features(batch: list[Sequence], width: int) -> torch.Tensor:
    """The target's f_j at every entry j (what entry j's output should be), right-padded [B, width, H]."""
    hidden = batch[0].features.shape[-1]
    out = torch.zeros(len(batch), width, hidden)
    for r, s in enumerate(batch):
        n = min(width, s.features.shape[0] - 1)
        out[r, :n] = s.features[1: 1 + n].float()
    return out


@torch.no_grad()
def evaluate(draft, val: list[Sequence], t2d, rows: int, pad: int, depth: int = 2, measure: str = "alpha_lb"
             ) -> dict[str, dict[str, float]]:
    """α's lower bound (``measure="top1"``: argmax agreement with the teacher) on held-out continuations per
    language at each draft step 1..``depth`` (step 1 reads the target's features; step k the draft's own
    prediction k − 1 steps deep)."""
    draft.eval()
    out: dict[str, dict[str, list[torch.Tensor]]] = {f"depth{k}": {} for k in range(1, depth + 1)}
    for i in range(0, len(val), 8):
        chunk = val[i:i + 8]
        ids, feats, mask = batch_tensors(chunk, pad)
        for k, hidden in enumerate(feature_draft.unrolled(draft, ids, feats, mask, depth), start=1):
            a = losses_of(draft, chunk, hidden, t2d, rows, None)[measure]
            start = 0
            for s in chunk:
                out[f"depth{k}"].setdefault(s.language, []).append(a[start:start + len(s.continuation)])
                start += len(s.continuation)
    draft.train()
    return {name: {lang: round(float(torch.cat(v).mean()), 4) for lang, v in sorted(by.items())}
            for name, by in out.items()}


def arguments() -> argparse.ArgumentParser:
    parser = distil.arguments(__doc__.splitlines()[0], OUT, Recipe)
    parser.add_argument("--layers", type=int, default=None, help=f"decoder layers (default {Recipe.layers}; with "
                        "--init-from: its own, or more to grow it, the new layers on top starting as no-ops)")
    parser.add_argument("--depth", type=int, default=Recipe.depth, help="draft steps trained (training-time test)")
    parser.add_argument("--sample-greedy", action="store_true", help="only sample the greedy round and exit")
    parser.add_argument("--init-from", type=Path, default=None, help="start from this exported draft (its weights, "
                        "layers and vocabulary) with a fresh optimiser: a fine-tune")
    parser.add_argument("--first-round", type=int, default=0, help="train on teacher rounds FIRST..ROUNDS-1 only "
                        "(with --init-from: rounds the draft has not seen)")
    parser.add_argument("--lr", type=float, default=Recipe.lr, help="peak learning rate (warm-up, then cosine)")
    parser.add_argument("--teacher-dtype", default=Recipe.teacher_dtype, choices=["bfloat16", "float32"],
                        help="the target's dtype while it samples (on CPUs without native bfloat16, float32 is "
                        "several times faster; the data differs slightly, so a run keeps one)")
    parser.add_argument("--argmax-weight", type=float, default=Recipe.argmax_weight, help="weight of a "
                        "cross-entropy on the teacher's argmax beside KL + TV (aims at greedy acceptance)")
    parser.add_argument("--greedy-share", type=float, default=None, help="share of each batch drawn from the greedy "
                        "round (default: every sequence equally likely)")
    parser.add_argument("--greedy-windows", default=None, metavar="LANG:N[,N2...]", help="N more prompts of LANG "
                        "(overlapping runs of its training dialogues) continued greedily into the greedy pool; "
                        "N,N2: N2 in all, sampled as two tranches (a larger set keeps the smaller one's shards)")
    parser.add_argument("--greedy-text", default=None, metavar="LANG:N[,N2...]", help="N documents of LANG's build "
                        "corpus (`python -m workloads.build.corpus`; 16-64 tokens, text outside the dialogues) "
                        "continued greedily into the greedy pool; N,N2: N2 in all, in two tranches as --greedy-windows")
    parser.add_argument("--sample-part", default=None, metavar="I/N", help="with --sample-rounds or --sample-greedy: "
                        "only batches b with b %% N == I (N processes on disjoint parts use N cores)")
    return parser


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Recipe, bool, tuple[int, int]]:
    """The recipe of the command line (every bad value one error line, before the target loads), whether it grows
    the --init-from draft, and the --sample-part."""
    distil.check_minimums(parser, (("--steps", args.steps, 0), ("--threads", args.threads, 1),
                                   ("--rounds", args.rounds, 1), ("--layers", args.layers, 1),
                                   ("--depth", args.depth, 1), ("--vocab-from", args.vocab_from, 1),
                                   ("--first-round", args.first_round, 0)))
    if args.first_round >= args.rounds:
        parser.error(f"--first-round={args.first_round} is invalid: must be below --rounds={args.rounds}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr={args.lr} is invalid: must be a number > 0")
    if not (args.argmax_weight >= 0 and math.isfinite(args.argmax_weight)):
        parser.error(f"--argmax-weight={args.argmax_weight} is invalid: must be a number >= 0")
    if args.greedy_share is not None and not 0 <= args.greedy_share <= 1:
        parser.error(f"--greedy-share={args.greedy_share} is invalid: must be a number in [0, 1]")
    init_sha, grown = None, False
    if args.init_from is not None:
        if not feature_draft.is_feature_draft(args.init_from):
            parser.error(f"--init-from={str(args.init_from)!r} is invalid: not an exported feature draft (config.json "
                         "with its feature-draft key)")
        init_sha = sha256(args.init_from / feature_draft.WEIGHTS)
        init_layers = json.loads((args.init_from / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
        if args.layers is not None and args.layers < init_layers:
            parser.error(f"--layers={args.layers} is invalid with --init-from: must be >= its {init_layers} "
                         "layer(s) (a draft grows, it does not shrink)")
        args.layers = args.layers or init_layers
        grown = args.layers > init_layers
    args.layers = args.layers or Recipe.layers
    windows = _lang_counts(parser, "--greedy-windows", args.greedy_windows)
    text = _lang_counts(parser, "--greedy-text", args.greedy_text)
    if text and not (CORPUS_DIR / f"{next(iter(text))}.train.txt").is_file():
        parser.error(f"--greedy-text={args.greedy_text!r} needs the build corpus: run `python -m "
                     "workloads.build.corpus` first (workloads/corpus/ is missing it)")
    part = (0, 1)
    if args.sample_part is not None:
        i, _, n = args.sample_part.partition("/")
        if not (i.isdigit() and n.isdigit() and int(i) < int(n)) or not (args.sample_rounds or args.sample_greedy):
            parser.error(f"--sample-part={args.sample_part!r} is invalid: must be I/N with integers 0 <= I < N, "
                         "beside --sample-rounds or --sample-greedy")
        part = (int(i), int(n))
    recipe = Recipe(steps=args.steps, threads=args.threads, rounds=args.rounds, layers=args.layers, depth=args.depth,
                    vocab_from=args.vocab_from, lr=args.lr, first_round=args.first_round,
                    argmax_weight=args.argmax_weight, greedy_share=args.greedy_share,
                    teacher_dtype=args.teacher_dtype, greedy_windows=windows, greedy_text=text,
                    init_from=str(args.init_from) if args.init_from else None, init_sha256=init_sha)
    return recipe, grown, part


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    recipe, grown, part = checked(parser, args)
    sample_rounds = distil.sample_rounds(parser, args.sample_rounds)
    work = args.work or work_folder(recipe)
    started = distil.begin(recipe, work)
    training_late = distil.time_box(args.stop_at, started)

    target, tokenizer, source = distil.load_target(getattr(torch, recipe.teacher_dtype))
    eos = tokenizer.eos_token_id
    train_prompts, val_prompts = distil.split(tokenizer, recipe)
    kw = dict(max_new=recipe.max_new_tokens, top_k=recipe.top_k, eos=eos, pad=eos, features=True)
    rounds: list[Sequence] = []  # the T = 1 rounds
    for r in sample_rounds or ([] if args.sample_greedy else range(recipe.first_round, recipe.rounds)):
        rounds += sample_set(target, train_prompts, work / f"train-round{r}", recipe.gen_batch,
                             seed=recipe.seed + 7 * r, part=part,
                             progress=lambda x, r=r: tqdm(x, desc=f"teacher (training prompts, round {r})"), **kw)
    greedy: list[Sequence] = []
    if (recipe.greedy_round and sample_rounds is None) or args.sample_greedy:
        greedy = sample_set(target, train_prompts, work / "train-greedy", recipe.gen_batch, seed=recipe.seed - 1,
                            progress=lambda x: tqdm(x, desc="teacher (training prompts, greedy)"), greedy=True,
                            part=part, **kw)
        def continue_tranches(kind: str, lang: str, counts: list[int], tranches: list, seed: int) -> list[Sequence]:
            """Each tranche continued greedily into its own shards (the first keeps its name: `{kind}-{lang}N1`)."""
            out = []
            for (before, n), prompts in zip(itertools.pairwise([0, *counts]), tranches, strict=True):
                name = f"{lang}{n}" if before == 0 else f"{lang}{before}-{n}"
                out += sample_set(target, [(lang, p) for p in prompts], work / f"train-greedy-{kind}-{name}",
                                  recipe.gen_batch, seed=seed, greedy=True, part=part, **kw,
                                  progress=lambda x, name=name: tqdm(x, desc=f"teacher ({name} {kind}, greedy)"))
            return out

        for lang, counts in (recipe.greedy_windows or {}).items():
            tranches = window_tranches(tokenizer, lang, recipe.holdout, counts, recipe.seed)
            greedy += continue_tranches("windows", lang, counts, tranches, recipe.seed - 2)
        for lang, counts in (recipe.greedy_text or {}).items():
            tranches = corpus_tranches(tokenizer, lang, recipe.holdout, counts, recipe.seed)
            if sum(map(len, tranches)) < counts[-1]:
                raise SystemExit(f"error: --greedy-text={args.greedy_text} is invalid: the {lang} corpus has "
                                 f"{sum(map(len, tranches))} documents of 16-64 tokens")
            greedy += continue_tranches("text", lang, counts, tranches, recipe.seed - 3)
    train = rounds + greedy
    if sample_rounds is not None or args.sample_greedy:
        log.info(f"sampled {args.sample_rounds or 'the greedy round'}: {len(train)} sequences "
                 f"({(time.time() - started) / 60:.1f} min); not training")
        return
    if recipe.greedy_share is not None and not greedy:
        raise SystemExit("error: --greedy-share needs the greedy round, which this recipe does not sample")
    # held-out continuations for the curve (only training reads them), and the same prompts continued by the
    # argmax: the draft's argmax agreement on those is greedy acceptance
    val = sample_set(target, val_prompts, work / "val", recipe.gen_batch, seed=recipe.seed + 1,
                     progress=lambda x: tqdm(x, desc="teacher (held-out, for the curve)"), **kw)
    val_greedy = sample_set(target, val_prompts, work / "val-greedy", recipe.gen_batch, seed=recipe.seed + 3,
                            progress=lambda x: tqdm(x, desc="teacher (held-out, greedy)"), greedy=True, **kw)
    gen_minutes = (time.time() - started) / 60
    positions = sum(len(s.continuation) for s in train)
    log.info(f"teacher data: {len(train)} sequences, {positions} positions ({gen_minutes:.1f} min)")

    target = target.float()
    for p in target.parameters():
        p.requires_grad_(False)
    init_record = None  # a fine-tune's record keeps the one of the draft it started from
    if args.init_from is not None:  # its vocabulary comes with it
        draft = feature_draft.load(args.init_from, torch.float32).attach(target).train()
        if grown:
            draft = feature_draft.grow(draft, recipe.layers)
        record_file = args.init_from / "TRAINING.json"
        init_record = json.loads(record_file.read_text(encoding="utf-8")) if record_file.is_file() else {}
        d2t = draft.lm_head.draft_to_target.clone()
    else:
        d2t = distil.vocabulary(train, recipe, tokenizer, target.config.vocab_size)
        draft = feature_draft.build(target, recipe.layers, d2t)
    rows = d2t.numel()
    t2d = draft_vocab.target_to_draft_map(d2t, target.config.vocab_size)
    trainable = [p for n, p in draft.named_parameters() if p.requires_grad and not n.startswith("embed.")]
    opt = torch.optim.AdamW(trainable, lr=recipe.lr, weight_decay=0.0)

    def evaluation() -> dict:
        return {"alpha_lb": evaluate(draft, val, t2d, rows, eos),
                "top1_greedy": evaluate(draft, val_greedy, t2d, rows, eos, measure="top1")}

    def draw(gen: torch.Generator) -> list[Sequence]:
        if recipe.greedy_share is None:
            return [train[i] for i in torch.randint(0, len(train), (recipe.batch_size,), generator=gen).tolist()]
        n_greedy = round(recipe.greedy_share * recipe.batch_size)
        return ([greedy[i] for i in torch.randint(0, len(greedy), (n_greedy,), generator=gen).tolist()]
                + [rounds[i] for i in torch.randint(0, len(rounds), (recipe.batch_size - n_greedy,),
                                                     generator=gen).tolist()])

    def losses(gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        batch = draw(gen)
        ids, feats, mask = batch_tensors(batch, eos)
        noisy = feats + recipe.feature_noise * torch.randn(feats.shape, generator=gen)
        goal = next_features(batch, ids.shape[1])
        steps = [losses_of(draft, batch, h, t2d, rows, goal)
                 for h in feature_draft.unrolled(draft, ids, noisy, mask, recipe.depth)]
        weights = [1.0] if recipe.depth == 1 else \
            [1 - recipe.deep_weight] + [recipe.deep_weight / (recipe.depth - 1)] * (recipe.depth - 1)
        part = {k: sum(w * s[k].mean() for w, s in zip(weights, steps, strict=True)) for k in steps[0]}
        loss = part["kl"] + part["tv"] + recipe.feature_weight * part["feature"] \
            + recipe.argmax_weight * part["argmax_ce"]
        return loss, {k: part[k].item() for k in ("kl", "tv", "feature", "argmax_ce")}

    def checkpoint_weights() -> dict:
        return {"draft": {k: v for k, v in draft.state_dict().items() if not k.startswith("embed.")},
                "opt": opt.state_dict(), "draft_to_target": d2t}

    def export(progress: Progress, stopped_early: bool) -> None:
        record = {"recipe": asdict(recipe), "steps_done": progress.step, "stopped_early": stopped_early,
                  "stop_at": args.stop_at,
                  "teacher": {"model": TARGET, **source, "sequences": len(train), "positions": positions,
                              "generation_minutes": round(gen_minutes, 1)},
                  **({"corpus": corpus_sources()} if recipe.greedy_text else {}),
                  "draft_vocab": {"ids": rows}, "parameters": sum(p.numel() for p in trainable),
                  "curve": progress.curve, **({"init": init_record} if init_record else {})}
        distil.export(draft, lambda copy, folder: copy.save(folder), tokenizer, args.out, record)

    def describe(point: dict) -> str:
        return f"{distil.alpha_bound(point)}, greedy top-1 {point['top1_greedy']['depth1']}"

    # a fine-tune keeps its own checkpoint beside the run it started from
    ckpt = work / ("checkpoint.pt" if recipe.init_sha256 is None else
                   f"checkpoint-from-{recipe.init_sha256[:12]}{f'-{recipe.layers}layers' if grown else ''}.pt")
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if not torch.equal(state["draft_to_target"], d2t):
            raise SystemExit(f"error: the checkpoint {ckpt} was trained with another draft vocabulary")
        draft.load_state_dict(state["draft"], strict=False)
        opt.load_state_dict(state["opt"])
        progress = Progress.resumed(state)
    else:
        progress = Progress.first(evaluation, describe)
    draft.train()
    distil.distil(Trainer(losses, evaluation, checkpoint_weights, export, describe), opt, trainable, recipe,
                  progress, ckpt, training_late)
    log.info(f"done: {args.out}")


def _lang_counts(parser: argparse.ArgumentParser, flag: str, value: str | None) -> dict[str, list[int]] | None:
    """``LANG:N[,N2...]`` (increasing totals of disjoint tranches) as {LANG: [N, N2, ...]}; None when not given."""
    if value is None:
        return None
    lang, _, ns = value.partition(":")
    counts = [int(n) for n in ns.split(",") if n.isdigit()]
    if (lang not in LANGS or len(counts) != len(ns.split(",")) or counts[0] < 1
            or any(a >= b for a, b in itertools.pairwise(counts))):
        parser.error(f"{flag}={value!r} is invalid: must be LANG:N[,N2...] with LANG one of {', '.join(LANGS)} and "
                     "increasing integers N >= 1")
    return {lang: counts}


def corpus_sources() -> dict:
    """The build corpus's record (its Debian packages and their .deb files): the text --greedy-text read."""
    return json.loads((CORPUS_DIR / "SOURCES.json").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
