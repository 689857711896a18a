"""Fit the acceptance classifier of ``policy=acceptance-classifier`` on recorded traces.

    python -m policies.train.fit_classifier TRACES.parquet OUT.json [--hidden 16] [--target accepted]

``TRACES.parquet`` comes from ``python -m harness task=trace``; its ``traces.metadata.json`` (models, hardware,
workload) is copied into the model file's metadata, so a model fitted for one pair is recognisable as such.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from policies.classifier import fit_classifier, save_classifier
from policies.envs.data import read_traces
from spectune.run import cli

log = logging.getLogger(__name__)


def fit_file(traces: str | Path, out: str | Path, hidden: list[int], target: str, epochs: int, seed: int) -> Path:
    """Read the traces, fit, write the model file (atomic) with the traces' provenance."""
    frame, recorded = read_traces(traces)
    model = fit_classifier(frame, hidden, target, epochs, seed)
    return save_classifier(model, out, {"traces": str(Path(traces).resolve()), "rows": len(frame), "target": target,
                                        "hidden": hidden, "epochs": epochs, "seed": seed, "traces_metadata": recorded})


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m policies.train.fit_classifier", description=__doc__.splitlines()[0])
    parser.add_argument("traces")
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, nargs="*", default=[])
    parser.add_argument("--target", default="accept_prob", choices=["accept_prob", "accepted"])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    return cli.run_command(parser, _fit, argv)


def _fit(args: argparse.Namespace) -> None:
    log.info("wrote %s", fit_file(args.traces, args.out, args.hidden, args.target, args.epochs, args.seed))


if __name__ == "__main__":
    raise SystemExit(main())
