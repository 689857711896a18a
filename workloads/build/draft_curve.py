"""The smollm2 draft's α against training minutes, from its TRAINING.json: a Markdown table and a figure.

    python -m workloads.build.draft_curve --png bench/results/smollm2-draft-curve.png

Prints the table TRAINING.md carries (held-out Σ min(p, q) over the teacher's top-k ids inside the draft
vocabulary: a lower bound of α) and draws the same numbers per language against training minutes. For a draft that
reads the target's features (``--draft spectune/models/smollm2/feature-draft``) the numbers are its first draft
step's (the target's features in), the curve's ``gamma1``.

A fine-tuned draft's TRAINING.json keeps the record of the draft it started from under ``init`` (and so on back to
the first run): the whole history is drawn, each stage after the minutes of those before it, with a line where a
stage begins. Each stage scored its own held-out continuations (sampled again when it ran), so a step between the
last point of one stage and the first of the next is a change of sample, not of draft.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workloads.build.distil import LANGS
from workloads.build.train_draft import OUT


def first_step(alpha: dict) -> dict[str, float]:
    """The bound per language at a cycle's first draft step (a feature draft's curve holds one per step)."""
    return alpha.get("gamma1", alpha)


def stages(record: dict) -> list[tuple[str, list[dict]]]:
    """(label, curve) per training stage, the first run first: a fine-tune's record holds its start's under
    ``init``."""
    chain = []
    while record:
        chain.append(record)
        record = record.get("init") or {}
    out = []
    for i, rec in enumerate(reversed(chain)):
        recipe = rec.get("recipe", {})
        what = "training" if i == 0 else f"fine-tune {i}"
        rounds = f"rounds {recipe.get('first_round', 0)}-{recipe.get('rounds', 0) - 1}" if recipe else ""
        n = recipe.get("layers")
        layers = f", {n} layer{'s' if n != 1 else ''}" if n else ""
        out.append((f"{what} ({rounds}{layers})" if recipe else what, rec.get("curve", [])))
    return out


def table(curve: list[dict], stage: str | None = None) -> str:
    head = "| stage " if stage is not None else ""
    lines = [head + "| step | minutes | " + " | ".join(LANGS) + " | load |",
             ("|---" if stage is not None else "") + "|---:|---:|" + "---:|" * len(LANGS) + "---:|"]
    for point in curve:
        alpha = first_step(point["alpha_lb"])
        lines.append((f"| {stage} " if stage is not None else "") + f"| {point['step']} | "
                     f"{point['train_minutes']:.1f} | "
                     + " | ".join(f"{alpha.get(lang, float('nan')):.3f}" for lang in LANGS)
                     + f" | {point.get('load_avg', float('nan')):.1f} |")
    return "\n".join(lines)


def history_table(history: list[tuple[str, list[dict]]]) -> str:
    """One table over every stage (minutes are each stage's own; the stage column tells them apart)."""
    if len(history) == 1:
        return table(history[0][1])
    parts = [table(curve, label).splitlines() for label, curve in history]
    return "\n".join(parts[0] + [line for part in parts[1:] for line in part[2:]])


def figure(history: list[tuple[str, list[dict]]], path: Path) -> None:
    """α against cumulative training minutes over :func:`stages`' (label, curve) list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spectune.io import write_figure

    fig, axis = plt.subplots(figsize=(7, 3.8))
    offset, colours = 0.0, {}
    for i, (label, points) in enumerate(history):
        minutes = [offset + p["train_minutes"] for p in points]
        for lang in LANGS:
            line, = axis.plot(minutes, [first_step(p["alpha_lb"]).get(lang) for p in points], marker=".",
                              color=colours.get(lang), label=lang if i == 0 else None)
            colours[lang] = line.get_color()
        if i > 0:
            axis.axvline(offset, color="grey", linestyle=":", linewidth=1)
            axis.annotate(label, (offset, 0.02), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                          color="grey", xytext=(2, 0), textcoords="offset points")
        offset = minutes[-1] if minutes else offset
    axis.set_xlabel("training minutes (CPU), stages one after another")
    axis.set_ylabel("held-out α lower bound")
    axis.set_title("smollm2 draft: α against training time")
    axis.legend()
    write_figure(path, fig)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, default=OUT, help="the draft folder (with TRAINING.json)")
    parser.add_argument("--png", type=Path, default=None, help="also draw the curve here")
    args = parser.parse_args()
    record_path = args.draft / "TRAINING.json"
    if not record_path.is_file():
        raise SystemExit(f"error: --draft={str(args.draft)!r} holds no TRAINING.json (train it with "
                         "python -m workloads.build.train_draft)")
    history = stages(json.loads(record_path.read_text()))
    sys.stdout.write(history_table(history) + "\n")
    if args.png:
        figure(history, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
