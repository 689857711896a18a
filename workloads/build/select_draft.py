"""`python -m workloads.build.select_draft DIR [DIR ...]`: compare candidate smollm2 drafts on a selection set.

Choosing between two training recipes by the held-out curve would select on prompts that ``task=acceptance``
later reports (the curve's 8 per language are among its 16). The selection set is another slice of the held-out
prompts: numbers ``SELECT`` of each bundled workload's default seeded shuffle, past every prefix an evaluation
takes (``task=acceptance``/``bench``: 16, ``policies.evaluate``: 96) and never trained on (training starts past
128). The target samples one continuation per prompt (T = 1, seeded, shards in the work folder); each candidate
is scored by the curve's measure, Σ over the teacher's top-k ids inside the draft vocabulary of min(p, q) (a lower
bound of α), per language. A draft that reads the target's features (EAGLE-style) is scored at its first draft step
(the target's features in), its second step beside it; the continuations carry the target's features for that (the
hook that keeps them changes no computation, so they are the same continuations). A feature draft is also scored
on the same prompts' greedy continuations by its argmax agreement with the target (greedy acceptance at the
first draft step).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from spectune.models import draft_vocab, feature_draft
from workloads.build.distil import LANGS, load_target
from workloads.build.teacher_data import sample_set, split_prompts
from workloads.build.train_draft import Recipe, evaluate, work_folder

SELECT = slice(96, 128)


def selection_set(work: Path, recipe: Recipe):
    """The target's continuations of the selection prompts, sampled and greedy (sampled once, then read from
    ``work/select-features`` and ``work/select-greedy``)."""
    target, tokenizer, _ = load_target(getattr(torch, recipe.teacher_dtype))
    prompts = []
    for lang in LANGS:
        _, held_out = split_prompts(tokenizer, lang, recipe.holdout, seed=recipe.seed)
        prompts += [(lang, p) for p in held_out[SELECT]]
    eos = tokenizer.eos_token_id
    seqs = sample_set(target, prompts, work / "select-features", recipe.gen_batch, max_new=recipe.max_new_tokens,
                      top_k=recipe.top_k, eos=eos, pad=eos, seed=recipe.seed + 2, progress=lambda x: x, features=True)
    greedy = sample_set(target, prompts, work / "select-greedy", recipe.gen_batch, max_new=recipe.max_new_tokens,
                        top_k=recipe.top_k, eos=eos, pad=eos, seed=recipe.seed + 2, progress=lambda x: x,
                        features=True, greedy=True)
    return seqs, greedy, target, eos


def score(directory: Path, seqs, greedy, target, eos: int
          ) -> tuple[dict[str, float], dict[str, float] | None, dict[str, float] | None]:
    """(the bound per language at the first draft step, at the second for a feature draft, else None; a feature
    draft's argmax agreement on the greedy continuations at its first step, else None)."""
    from transformers import LlamaForCausalLM

    if feature_draft.is_feature_draft(directory):
        from workloads.build import train_feature_draft

        draft = feature_draft.load(directory).attach(target.float())
        d2t = draft.lm_head.draft_to_target
        t2d = draft_vocab.target_to_draft_map(d2t, target.config.vocab_size)
        steps = train_feature_draft.evaluate(draft, seqs, t2d, d2t.numel(), eos)
        top1 = train_feature_draft.evaluate(draft, greedy, t2d, d2t.numel(), eos, depth=1, measure="top1")
        return steps["depth1"], steps["depth2"], top1["depth1"]
    draft = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    d2t, full_vocab_size = draft_vocab.read_map(directory, draft.config)
    return evaluate(draft, seqs, draft_vocab.target_to_draft_map(d2t, full_vocab_size), d2t.numel()), None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", type=Path, nargs="+", help="draft folders (as train_draft --out writes them)")
    parser.add_argument("--work", type=Path, default=None, help="where the selection shards live (default: the cache)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for directory in args.drafts:
        if not draft_vocab.is_reduced(directory) and not feature_draft.is_feature_draft(directory):
            sys.stderr.write(f"error: draft folder {str(directory)!r} holds no {draft_vocab.MAP_FILE}: give folders "
                             "that python -m workloads.build.train_draft --out wrote\n")
            raise SystemExit(2)
    recipe = Recipe()
    torch.set_num_threads(recipe.threads)
    seqs, greedy, target, eos = selection_set(args.work or work_folder(recipe), recipe)
    positions = {lang: sum(len(s.continuation) for s in seqs if s.language == lang) for lang in LANGS}
    print(f"selection set: held-out prompts {SELECT.start}..{SELECT.stop - 1} per language, positions {positions}")
    print("| draft | draft step | " + " | ".join(LANGS) + " | mean |")
    print("|---|---|" + "---:|" * (len(LANGS) + 1))
    greedy_rows = []
    for directory in args.drafts:
        first, second, top1 = score(directory, seqs, greedy, target, eos)
        for step, alpha in (("1" if second else "any", first), ("2", second)):
            if alpha is not None:
                print(f"| {directory} | {step} | " + " | ".join(f"{alpha[lang]:.4f}" for lang in LANGS)
                      + f" | {sum(alpha.values()) / len(alpha):.4f} |")
        if top1 is not None:
            greedy_rows.append(f"| {directory} | " + " | ".join(f"{top1[lang]:.4f}" for lang in LANGS)
                               + f" | {sum(top1.values()) / len(top1):.4f} |")
    if greedy_rows:
        print("\nargmax agreement on the greedy continuations (feature drafts, draft step 1)")
        print("| draft | " + " | ".join(LANGS) + " | mean |")
        print("|---|" + "---:|" * (len(LANGS) + 1))
        print("\n".join(greedy_rows))


if __name__ == "__main__":
    main()
