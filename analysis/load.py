"""Tidy pandas frames from run directories, Hydra multirun directories, or lists of them.

Every recorded field keeps its recorded name (vLLM's names in ``summary.json``, the Parquet columns as
written), so fields added later come along without a change here. Each row also carries its run's
context: the run directory, the Hydra job number, the overrides (``overrides``), every config value
flattened under ``cfg.<dotted key>`` (from ``.hydra/config.yaml``, read with OmegaConf), and the key
metadata a comparison needs (models, dtype, hardware, execution path, git commit) under short names.

Runs of different models or hardware are refused unless ``allow_mixed=True``: a frame that silently
pools an H200 and a laptop, or two target models, gives numbers that mean nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from spectune.engine.records import DEFAULT_CATEGORY
from spectune.errors import SpectuneError
from spectune.methods import BASELINE, is_fixed_label
from spectune.run import rundir
from spectune.run.rundir import read_json, read_parquet

__all__ = ["read_json", "read_parquet"]  # the run directory's readers, for the analysis code and notebooks

log = logging.getLogger(__name__)

Paths = Path | str | Sequence[Path | str]

# File names and the columns that define each table: spectune.run.rundir (the rest load under their recorded names).
SUMMARY = rundir.SUMMARY.name
# What makes two runs comparable: same models (and weights) and same hardware and execution path.
MODEL_KEYS = ("target", "target_revision", "target_sha256", "draft", "draft_revision", "draft_sha256", "dtype")
HARDWARE_KEYS = ("hardware", "device", "device_name", "execution_path", "processor", "cpu_count")


def fixed_gamma(labels: pd.Series) -> pd.Series:
    """True where a method label names a fixed γ (spectune.methods.is_fixed_label): a frame's grid rows, beside
    AR and the adaptive rules."""
    return pd.Series([isinstance(v, str) and is_fixed_label(v) for v in labels], index=labels.index, dtype=bool)


def _as_list(paths: Paths) -> list[Path]:
    if isinstance(paths, str | Path):
        return [Path(paths)]
    return [Path(p) for p in paths]


def find_dirs(paths: Paths, marker: str) -> list[Path]:
    """Directories at or below ``paths`` that hold ``marker``; a missing path is an error, not an empty result."""
    found: list[Path] = []
    for root in _as_list(paths):
        if not root.exists():
            raise SpectuneError(f"{root} does not exist: give a run directory, a multirun directory or a list")
        if root.is_file():
            root = root.parent
        found.extend(p.parent for p in sorted(root.rglob(marker)))
    return sorted(dict.fromkeys(found))


def find_runs(paths: Paths) -> list[Path]:
    """Every bench run (a directory with ``summary.json``) at or below ``paths``."""
    return find_dirs(paths, SUMMARY)


def _hashable(value: Any) -> Any:
    """Lists become tuples so config columns can be grouped on (``cfg.gamma`` may be a list)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def _config_columns(run: Path) -> dict[str, Any]:
    """``overrides`` and every config leaf as ``cfg.<key>`` (read with OmegaConf, flattened by pandas)."""
    hydra = run / ".hydra"
    out: dict[str, Any] = {}
    if (hydra / "overrides.yaml").exists():
        out["overrides"] = " ".join(str(o) for o in OmegaConf.to_container(OmegaConf.load(hydra / "overrides.yaml")))
    if (hydra / "config.yaml").exists():
        config = OmegaConf.to_container(OmegaConf.load(hydra / "config.yaml"), resolve=False)
        flat = pd.json_normalize(config, sep=".").iloc[0].to_dict()
        out.update({f"cfg.{k}": _hashable(v) for k, v in flat.items()})
    return out


def _metadata_columns(meta: dict[str, Any]) -> dict[str, Any]:
    """Key metadata under short names (what tells runs apart and what a comparison must hold fixed)."""
    models, hardware, host = meta.get("models") or {}, meta.get("hardware") or {}, meta.get("host") or {}
    target, draft = models.get("target") or {}, models.get("draft") or {}
    settings, workload, sampling = meta.get("settings") or {}, meta.get("workload") or {}, meta.get("sampling") or {}
    out = {
        "models": models.get("name"),
        # runs from before the library move name the shipped models under harness/models/: the same models
        "target": rundir.current_model_path(target.get("name_or_path")), "target_revision": target.get("revision"),
        "target_sha256": json.dumps(target.get("weights_sha256"), sort_keys=True) if target else None,
        "draft": rundir.current_model_path(draft.get("name_or_path")), "draft_revision": draft.get("revision"),
        "draft_sha256": json.dumps(draft.get("weights_sha256"), sort_keys=True) if draft else None,
        "dtype": hardware.get("dtype", target.get("dtype")),
        "hardware": hardware.get("setup"), "device": hardware.get("device"),
        "device_name": hardware.get("device_name", host.get("cuda_device")),
        "execution_path": hardware.get("execution_path"),
        "processor": host.get("processor"), "cpu_count": host.get("cpu_count"),
        "git_commit": (meta.get("git") or {}).get("commit"), "git_dirty": (meta.get("git") or {}).get("dirty"),
        "created_utc": meta.get("created_utc"), "format_version": meta.get(rundir.VERSION_KEY),
        "workload": workload.get("name"), "language": workload.get("language"),
        "concurrency": settings.get("concurrency"), "request_rate": settings.get("request_rate"),
        "load": meta.get("load"), "sampler": meta.get("sampler"),
        "temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"), "top_k": sampling.get("top_k"),
    }
    return out


def run_context(run: Path, metadata_file: rundir.RunFile = rundir.METADATA) -> dict[str, Any]:
    """The columns every row of ``run`` carries: where it is, its job, its config and its key metadata
    (``format_version``: the run format its metadata was written in, 1 for runs older than the version)."""
    run = Path(run)
    meta = metadata_file.read_if_present(run, {})
    sweep = run.parent if (run.parent / "multirun.yaml").exists() else None
    context: dict[str, Any] = {"run": str(run), "sweep": str(sweep) if sweep else None,
                               "job": int(run.name) if sweep is not None and run.name.isdigit() else None}
    context.update(_metadata_columns(meta))
    context.update(_config_columns(run))
    return context


def check_comparable(frame: pd.DataFrame, allow_mixed: bool = False) -> None:
    """Refuse runs of different models or hardware unless ``allow_mixed`` (one line naming two runs that differ)."""
    if allow_mixed or frame.empty or "run" not in frame:
        return
    for kind, keys in (("models", MODEL_KEYS), ("hardware", HARDWARE_KEYS)):
        cols = [k for k in keys if k in frame]
        if not cols:
            continue
        ids = frame[["run", *cols]].astype(str).drop_duplicates(subset=cols)
        if len(ids) > 1:
            a, b = ids.iloc[0], ids.iloc[1]
            diff = next(c for c in cols if a[c] != b[c])
            raise SpectuneError(f"{b['run']} has different {kind} from {a['run']} ({diff}: {b[diff]} vs {a[diff]}): "
                                "pass allow_mixed=True (--allow-mixed) to load them together")


def _no_results(paths: Paths, what: str) -> SpectuneError:
    where = ", ".join(str(p) for p in _as_list(paths))
    return SpectuneError(f"{where} holds no spectune results: no {what} at or below it")


def _report_failed_jobs(paths: Paths) -> None:
    for err in find_dirs(paths, rundir.ERROR.name):
        if not rundir.SUMMARY.exists(err):
            log.warning(f"skipped {err}: the job failed ({rundir.ERROR.read(err).get('error')})")


def load_summaries(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, method): every field of ``summary.json`` under its recorded name, plus the run context.

    A recorded field wins over a context column of the same name. ``bench_table(frame.to_dict("records"))``
    of one run's rows is the printed table.
    """
    runs = find_runs(paths)
    if not runs:
        raise _no_results(paths, SUMMARY)
    _report_failed_jobs(paths)
    rows = []
    for run in runs:
        summary = read_json(run / SUMMARY)
        methods = summary.get("methods")
        if not isinstance(methods, list) or not all(isinstance(m, dict) and "method" in m for m in methods):
            raise SpectuneError(f"{run / SUMMARY} is not a bench summary: expected a 'methods' list of "
                                "objects with a 'method' field")
        context = run_context(run)
        # Scalars of the run (workload, repeats, ...) go on every row; nested blocks (statistics, ranking,
        # points) stay out of it: load_points reads the per-repeat points.
        top = {k: v for k, v in summary.items() if k not in ("methods", "points") and not isinstance(v, dict | list)}
        rows.extend({**context, **top, **method} for method in methods)
    frame = pd.DataFrame(rows)
    check_comparable(frame, allow_mixed)
    return frame


def load_points(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, method, repeat) from the ``points`` of ``summary.json`` (runs with repeats), every
    field under its recorded name plus the run context; runs without points contribute nothing."""
    rows = []
    for run in find_runs(paths):
        points = read_json(run / SUMMARY).get("points") or []
        if not isinstance(points, list) or not all(isinstance(p, dict) and "method" in p for p in points):
            raise SpectuneError(f"{run / SUMMARY} has malformed points: expected a list of objects with 'method'")
        context = run_context(run)
        rows.extend({**context, **point} for point in points)
    if not rows:
        raise _no_results(paths, "per-repeat points in summary.json")
    frame = pd.DataFrame(rows)
    check_comparable(frame, allow_mixed)
    return frame


def load_table(paths: Paths, file: rundir.RunFile, allow_mixed: bool, marker: str = SUMMARY,
                metadata_file: rundir.RunFile = rundir.METADATA) -> pd.DataFrame:
    """``file`` of every run at or below ``paths`` (a run: a directory holding ``marker``), with its run context."""
    runs = [r for r in find_dirs(paths, marker) if file.exists(r)]
    if not runs:
        raise _no_results(paths, file.name)
    frames = []
    for run in runs:
        frame = file.read(run)
        context = pd.DataFrame([run_context(run, metadata_file)] * len(frame), index=frame.index)
        frames.append(pd.concat([context.drop(columns=[c for c in context if c in frame]), frame], axis=1))
    out = pd.concat(frames, ignore_index=True)
    check_comparable(out, allow_mixed)
    return out


def load_requests(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, method, request) from ``requests.parquet``, with the run context. Runs recorded before
    requests carried their category get their workload's (:func:`default_category`) in the ``category`` column
    (a ``task`` column, its name before, is renamed on reading: :mod:`spectune.names`)."""
    frame = load_table(paths, rundir.REQUESTS, allow_mixed)
    defaults = frame["run"].map({run: default_category(rundir.METADATA.read_if_present(Path(run), {}))
                                 for run in frame["run"].unique()})
    frame["category"] = frame["category"].fillna(defaults) if "category" in frame else defaults
    return frame


def default_category(meta: dict[str, Any]) -> str:
    """The category of a run's requests where they do not say: the workload's only category, else the dialogue
    lines (``chat-lines``, every workload's category before workloads had categories)."""
    categories = ((meta.get("workload") or {}).get("source") or {}).get("categories") or []
    return str(categories[0]) if len(categories) == 1 else DEFAULT_CATEGORY


def load_cycles(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, method, cycle, request) from ``cycles.parquet``, with the run context."""
    return load_table(paths, rundir.CYCLES, allow_mixed)


def load_traces(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, cycle, row, draft position) from ``traces.parquet`` (``task=trace``), with the run
    context taken from ``traces.metadata.json``."""
    return load_table(paths, rundir.TRACES, allow_mixed, marker=rundir.TRACES.name,
                       metadata_file=rundir.TRACES_METADATA)


def add_speedups(summaries: pd.DataFrame) -> pd.DataFrame:
    """Add ``tpot_speedup`` (the AR's mean TPOT over the method's, same run: decode only, prefill left out)
    and, where the run did not record one, ``speedup`` (output throughput over the same run's AR, as the
    printed table). A recorded ``speedup`` (pooled over repeats, with its CI) is kept. NaN without a baseline."""
    out = summaries.copy()
    for col in ("output_throughput", "mean_tpot_ms"):
        if col not in out:
            out[col] = float("nan")
    ar = out[out["method"] == BASELINE].drop_duplicates("run").set_index("run")
    ratio = out["output_throughput"] / out["run"].map(ar["output_throughput"])
    out["speedup"] = out["speedup"].fillna(ratio) if "speedup" in out else ratio
    out["tpot_speedup"] = out["run"].map(ar["mean_tpot_ms"]) / out["mean_tpot_ms"]
    return out


def swept(frame: pd.DataFrame) -> list[str]:
    """The ``cfg.*`` columns whose value differs between runs (what a sweep varied)."""
    cols = [c for c in frame.columns if c.startswith("cfg.") and not c.startswith("cfg.hydra")]
    per_run = frame.drop_duplicates("run")[cols] if "run" in frame else frame[cols]
    return [c for c in cols if per_run[c].astype(str).nunique() > 1]
