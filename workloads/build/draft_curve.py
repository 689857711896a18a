"""The smollm2 draft's α against training minutes, from its TRAINING.json: a Markdown table and a figure.

    python -m workloads.build.draft_curve --png bench/results/smollm2-draft-curve.png

Prints the table TRAINING.md carries (held-out Σ min(p, q) over the teacher's top-k ids inside the draft
vocabulary: a lower bound of α) and draws the same numbers per language against training minutes. For a draft that
reads the target's features (``--draft harness/models/smollm2/feature-draft``) the numbers are its first draft
step's (the target's features in), the curve's ``depth1``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workloads.build.train_draft import LANGS, OUT


def first_step(alpha: dict) -> dict[str, float]:
    """The bound per language at a cycle's first draft step (a feature draft's curve holds one per step)."""
    return alpha.get("depth1", alpha)


def table(curve: list[dict]) -> str:
    lines = ["| step | minutes | " + " | ".join(LANGS) + " | load |", "|---:|---:|" + "---:|" * len(LANGS) + "---:|"]
    for point in curve:
        alpha = first_step(point["alpha_lb"])
        lines.append(f"| {point['step']} | {point['train_minutes']:.1f} | "
                     + " | ".join(f"{alpha.get(lang, float('nan')):.3f}" for lang in LANGS)
                     + f" | {point.get('load_avg', float('nan')):.1f} |")
    return "\n".join(lines)


def figure(curve: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.io import write_figure

    fig, axis = plt.subplots(figsize=(6, 3.5))
    minutes = [p["train_minutes"] for p in curve]
    for lang in LANGS:
        axis.plot(minutes, [first_step(p["alpha_lb"]).get(lang) for p in curve], marker=".", label=lang)
    axis.set_xlabel("training minutes (CPU)")
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
    curve = json.loads(record_path.read_text())["curve"]
    sys.stdout.write(table(curve) + "\n")
    if args.png:
        figure(curve, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
