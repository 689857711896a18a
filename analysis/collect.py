"""Gather bench runs (single runs or a Hydra multirun sweep directory) into pandas tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.bench_table import bench_table


def find_runs(root: Path | str) -> list[Path]:
    """Every directory below ``root`` (itself included) that holds a bench ``summary.json``."""
    root = Path(root)
    return sorted(p.parent for p in root.rglob("summary.json") if (p.parent / "metadata.json").exists())


def load_summaries(root: Path | str) -> pd.DataFrame:
    """One row per (run, method) with the run's workload, concurrency, hardware and models alongside."""
    rows = []
    for run in find_runs(root):
        summary = json.loads((run / "summary.json").read_text())
        meta = json.loads((run / "metadata.json").read_text())
        table = bench_table(summary["methods"]).reset_index()
        context = {
            "run": str(run),
            "workload": summary["workload"],
            "concurrency": meta["settings"]["concurrency"],
            "request_rate": meta["settings"]["request_rate"],
            "hardware": meta["hardware"]["setup"],
            "execution_path": meta["hardware"]["execution_path"],
            "target": meta["models"]["target"]["name_or_path"],
            "draft": meta["models"]["draft"]["name_or_path"],
        }
        for record in table.to_dict("records"):
            rows.append({**context, **record})
    return pd.DataFrame(rows)


def load_requests(root: Path | str) -> pd.DataFrame:
    """All per-request records of all runs below ``root`` (column ``run`` tells them apart)."""
    frames = []
    for run in find_runs(root):
        if (run / "requests.parquet").exists():
            frame = pd.read_parquet(run / "requests.parquet")
            frame.insert(0, "run", str(run))
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
