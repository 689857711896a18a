"""`python -m spectune.models.train_tiny`: rebuild the embedded default model pair from the corpus.

Why self-trained: no target/draft pair can be had offline (see shared/design/offline-models.md), and a
pair we train ourselves gives realistic acceptance rates (α ≈ 0.6–0.8) with a known, reproducible recipe.

Steps, all seeded, with progress bars (run ``python -m workloads.build.corpus`` first):

1. a byte-level BPE tokenizer (``tokenizers``) on all four languages, shared by both models;
2. a target ``LlamaForCausalLM`` (h256 × 12 layers, ~10M params) on a language-balanced mix;
3. a draft (h96 × 1 layer) distilled from the target (soft cross-entropy on the target's
   distribution) for fewer steps on an English-heavy mix, so acceptance differs by language the way
   real drafts, trained mostly on English, do.

Both are saved in standard HF format (weights stored as bfloat16 to keep the repo small; load with any
dtype) under ``spectune/models/tiny/{target,draft}`` with ``TRAINING.json``/``TRAINING.md`` beside them.
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from spectune.io import write_json
from spectune.run.metadata import base_metadata

LANGS = ("it", "en", "zh", "es")
ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "workloads" / "corpus"
OUT = Path(__file__).resolve().parent / "tiny"
BOS, EOS, PAD = "<s>", "</s>", "<pad>"


@dataclass
class Recipe:
    """Everything that determines the weights (recorded verbatim in TRAINING.json)."""

    seed: int = 20260923
    vocab_size: int = 8192
    seq_len: int = 256
    max_positions: int = 512
    batch_size: int = 16
    # 12 layers: deep enough that a draft step costs ~1/7 of a target step on CPU (a 1-layer draft's
    # forward is mostly fixed per-call overhead, ~0.7 ms, so a 6-layer target gave c ≈ 0.27).
    target: dict = field(default_factory=lambda: dict(hidden_size=256, intermediate_size=512,
                                                      num_hidden_layers=12, num_attention_heads=4))
    draft: dict = field(default_factory=lambda: dict(hidden_size=96, intermediate_size=256,
                                                     num_hidden_layers=1, num_attention_heads=3))
    target_steps: int = 480
    draft_steps: int = 240
    target_lr: float = 3e-3
    draft_lr: float = 3e-3
    target_mix: dict = field(default_factory=lambda: {"it": 0.25, "en": 0.25, "zh": 0.25, "es": 0.25})
    draft_mix: dict = field(default_factory=lambda: {"it": 0.1, "en": 0.7, "zh": 0.1, "es": 0.1})
    threads: int = 2


def read_docs(lang: str, split: str) -> list[str]:
    path = CORPUS / f"{lang}.{split}.txt"
    if not path.exists():
        raise SystemExit(f"error: {path} is missing: run `python -m workloads.build.corpus` first")
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]


def train_tokenizer(recipe: Recipe, docs: dict[str, list[str]]) -> PreTrainedTokenizerFast:
    """Byte-level BPE: no unknown tokens in any language; BOS is prepended on encode."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=recipe.vocab_size, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=True)
    texts = [d for lang in LANGS for d in docs[lang]]
    random.Random(recipe.seed).shuffle(texts)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=recipe.max_positions, clean_up_tokenization_spaces=False)


def tokens_per_char(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> float:
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    return sum(map(len, ids)) / max(1, sum(map(len, docs)))


def stream(tokenizer: PreTrainedTokenizerFast, docs: list[str]) -> torch.Tensor:
    """All documents as one token stream: ``<s> doc </s> <s> doc </s> …`` (sequences are packed)."""
    ids = tokenizer(docs)["input_ids"]  # BOS added by the post-processor
    eos = tokenizer.eos_token_id
    return torch.tensor([t for seq in ids for t in (*seq, eos)], dtype=torch.long)


def batches(streams: dict[str, torch.Tensor], mix: dict[str, float], recipe: Recipe, gen: torch.Generator):
    """Infinite batches ``[B, seq_len + 1]``: each row a random window of a language drawn from ``mix``."""
    langs = list(mix)
    weights = torch.tensor([mix[lang] for lang in langs])
    while True:
        rows = []
        for i in torch.multinomial(weights, recipe.batch_size, replacement=True, generator=gen).tolist():
            s = streams[langs[i]]
            start = int(torch.randint(0, len(s) - recipe.seq_len - 1, (1,), generator=gen))
            rows.append(s[start:start + recipe.seq_len + 1])
        yield torch.stack(rows)


def make_model(recipe: Recipe, shape: dict, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=recipe.max_positions,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         rope_theta=10000.0, **shape)
    return LlamaForCausalLM(config)


def lr_at(step: int, total: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def train(model: LlamaForCausalLM, data, steps: int, peak_lr: float, desc: str,
          teacher: LlamaForCausalLM | None = None) -> list[float]:
    """Plain AdamW loop. With a ``teacher`` the loss is cross-entropy against its softmax (distillation)."""
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc=desc, unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        batch = next(data)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16):  # avx512_bf16/AMX: ~2x faster; fp32 master weights
            logits = model(input_ids=inputs).logits.float()
        if teacher is None:
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        else:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                soft = teacher(input_ids=inputs).logits.float().softmax(-1)
            loss = -(soft * logits.log_softmax(-1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
    model.eval()
    return losses


@torch.no_grad()
def evaluate(target, draft, streams: dict[str, torch.Tensor], recipe: Recipe) -> dict[str, dict]:
    """Held-out CE of both models and α = mean Σ min(p, q) at T=1, teacher-forced on validation text."""
    out = {}
    for lang, s in streams.items():
        n = min(8, (len(s) - 1) // recipe.seq_len)
        x = s[: n * recipe.seq_len + 1]
        inputs = x[:-1].view(n, recipe.seq_len)
        labels = x[1:].view(n, recipe.seq_len)
        lt, ld = target(input_ids=inputs).logits.float(), draft(input_ids=inputs).logits.float()
        ce_t, ce_d = (torch.nn.functional.cross_entropy(lg.flatten(0, 1), labels.flatten()).item()
                      for lg in (lt, ld))
        alpha = torch.minimum(lt.softmax(-1), ld.softmax(-1)).sum(-1).mean().item()
        out[lang] = {"target_ce": ce_t, "draft_ce": ce_d, "alpha_T1": alpha, "tokens": n * recipe.seq_len}
    return out


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.to(torch.bfloat16).save_pretrained(path)  # bf16 on disk halves the repo footprint
    model.float()
    tokenizer.save_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--target-steps", type=int, default=Recipe.target_steps)
    parser.add_argument("--draft-steps", type=int, default=Recipe.draft_steps)
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    args = parser.parse_args()
    recipe = Recipe(seed=args.seed, target_steps=args.target_steps, draft_steps=args.draft_steps)
    torch.set_num_threads(recipe.threads)
    torch.set_flush_denormal(True)  # denormals slowed CPU training 4x (offline-models.md)
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    train_docs = {lang: read_docs(lang, "train") for lang in LANGS}
    valid_docs = {lang: read_docs(lang, "valid") for lang in LANGS}

    tokenizer = train_tokenizer(recipe, train_docs)
    tpc = {lang: tokens_per_char(tokenizer, valid_docs[lang]) for lang in LANGS}
    print("tokens per character:", {k: round(v, 3) for k, v in tpc.items()})
    t_tok = time.perf_counter() - t0
    train_streams = {lang: stream(tokenizer, train_docs[lang]) for lang in tqdm(LANGS, desc="encode")}
    valid_streams = {lang: stream(tokenizer, valid_docs[lang]) for lang in LANGS}

    gen = torch.Generator().manual_seed(recipe.seed)
    target = make_model(recipe, recipe.target, tokenizer)
    t1 = time.perf_counter()
    target_losses = train(target, batches(train_streams, recipe.target_mix, recipe, gen), recipe.target_steps,
                          recipe.target_lr, "target")
    t_target = time.perf_counter() - t1
    torch.manual_seed(recipe.seed + 1)
    draft = make_model(recipe, recipe.draft, tokenizer)
    t2 = time.perf_counter()
    draft_losses = train(draft, batches(train_streams, recipe.draft_mix, recipe, gen), recipe.draft_steps,
                         recipe.draft_lr, "draft (distil)", teacher=target)
    t_draft = time.perf_counter() - t2
    held_out = evaluate(target, draft, valid_streams, recipe)
    for lang, row in held_out.items():
        print(f"{lang}: target CE {row['target_ce']:.3f}  draft CE {row['draft_ce']:.3f}  "
              f"alpha(T=1) {row['alpha_T1']:.3f}")
    save(target, tokenizer, args.out / "target")
    save(draft, tokenizer, args.out / "draft")

    tail = lambda xs: sum(xs[-50:]) / len(xs[-50:])  # noqa: E731
    report = {
        "recipe": asdict(recipe),
        "params": {"target": target.num_parameters(), "draft": draft.num_parameters()},
        "tokens_per_char": tpc,
        "corpus_characters": {lang: sum(map(len, train_docs[lang])) for lang in LANGS},
        "train_tokens": {lang: len(s) for lang, s in train_streams.items()},
        "loss": {"target_first": target_losses[0], "target_last50": tail(target_losses),
                 "draft_first": draft_losses[0], "draft_last50": tail(draft_losses),
                 "target_curve": target_losses[::50], "draft_curve": draft_losses[::50]},
        "held_out": held_out,
        "seconds": {"tokenizer": t_tok, "target": t_target, "draft": t_draft,
                    "total": time.perf_counter() - t0},
        "machine": {"processor": platform.processor() or platform.machine(), "threads": recipe.threads},
        "metadata": base_metadata(),
    }
    write_json(args.out / "TRAINING.json", report)
    (args.out / "TRAINING.md").write_text(render_md(report), encoding="utf-8")
    print(f"saved to {args.out} in {report['seconds']['total']:.0f} s")


def render_md(r: dict) -> str:
    rec, s, loss = r["recipe"], r["seconds"], r["loss"]
    lines = [
        "# The embedded tiny pair (generated by `python -m spectune.models.train_tiny`)", "",
        f"Seed {rec['seed']}; byte-level BPE, vocab {rec['vocab_size']}; sequences of {rec['seq_len']} "
        f"tokens, batch {rec['batch_size']}; {rec['threads']} CPU threads on {r['machine']['processor']}.", "",
        f"- target: {rec['target']} — {r['params']['target']:,} params, {rec['target_steps']} steps, "
        f"lr {rec['target_lr']}, mix {rec['target_mix']}; loss {loss['target_first']:.3f} → "
        f"{loss['target_last50']:.3f} (mean of last 50 steps); {s['target']:.0f} s",
        f"- draft: {rec['draft']} — {r['params']['draft']:,} params, distilled from the target for "
        f"{rec['draft_steps']} steps, lr {rec['draft_lr']}, mix {rec['draft_mix']}; soft CE "
        f"{loss['draft_first']:.3f} → {loss['draft_last50']:.3f}; {s['draft']:.0f} s",
        f"- total wall time {s['total']:.0f} s (tokenizer {s['tokenizer']:.0f} s)", "",
        "| lang | tokens/char | target CE (held out) | draft CE | α at T=1 (held out) |",
        "|---|---|---|---|---|",
    ]
    for lang, row in r["held_out"].items():
        lines.append(f"| {lang} | {r['tokens_per_char'][lang]:.3f} | {row['target_ce']:.3f} | "
                     f"{row['draft_ce']:.3f} | {row['alpha_T1']:.3f} |")
    lines += ["", "Training text: Debian packages listed in workloads/build/corpus.py (build time only, "
              "never committed). Full numbers: TRAINING.json.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
