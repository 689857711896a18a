"""The run directory: every file a run writes, by name, with its reader and its writer.

A run directory is the contract between the jobs that write it (the harness tasks, ``policies.train``,
``policies.evaluate``, the analysis command lines) and those that read it back (``analysis.load``, resume,
``policies.evaluate`` reading a training run, the notebooks). Naming each file once here keeps the two sides
from drifting: ``rundir.SUMMARY.write(run_dir, body)`` and ``rundir.SUMMARY.read(run_dir)``.

Writers are the atomic ones of :mod:`spectune.io` (a killed run never leaves a truncated file). Readers fail in
one line naming the file (:class:`~spectune.errors.SpectuneError`) on a half-written or foreign file.

Format version. The metadata a run writes (``metadata.json``, ``traces.metadata.json`` and the ``metadata`` block
that other result files embed, all from :func:`spectune.run.metadata.base_metadata`) carries ``format_version``:

- 1: everything written before the version was recorded (no ``format_version`` key). Read as version 1.
- 2: ``format_version`` recorded; the files and columns are those of version 1.

A reader refuses a version newer than :data:`FORMAT_VERSION` (written by a newer spectune) in one line.

Names. The draft length is ``gamma`` in every file (``max_gamma``, ``mean_gamma``, ``gamma.zip``, ...); files
written before 2026-12-05 called it ``depth`` in places (``max_depth``, ``depth.zip``). The readers here pass
what they read through :mod:`spectune.names`, which holds that mapping: old files read with the new names, new
files pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from spectune import names
from spectune.errors import SpectuneError
from spectune.io import write_csv, write_figure, write_json, write_parquet, write_text

FORMAT_VERSION = 2
UNVERSIONED = 1  # metadata without a format_version key: written before the version was recorded
VERSION_KEY = "format_version"

Kind = Literal["json", "parquet", "csv", "text", "figure", "policy"]


def current_model_path(name_or_path: Any) -> Any:
    """A shipped model's path as configs name it now: older run directories and profiles (before 2026-12-05)
    name the models shipped in the repository under ``harness/models/``, since moved to ``spectune/models/``."""
    if isinstance(name_or_path, str) and name_or_path.startswith("harness/models/"):
        return "spectune/" + name_or_path.removeprefix("harness/")
    return name_or_path


def read_json(path: Path | str) -> dict[str, Any]:
    """A JSON object from ``path``; a half-written or foreign file fails in one line naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise SpectuneError(f"{path} is not valid JSON (half-written or not a spectune file): "
                            f"{err.msg} at line {err.lineno}") from None
    except OSError as err:
        raise SpectuneError(f"{path} cannot be read: {err.strerror}") from None
    if not isinstance(data, dict):
        raise SpectuneError(f"{path} is not a spectune result: expected a JSON object, found {type(data).__name__}")
    return names.upgrade(data)


def read_parquet(path: Path | str, required: Iterable[str] = ()) -> pd.DataFrame:
    """A Parquet table through pyarrow; unreadable (half-written, not Parquet) or foreign (missing the columns
    that define it) fails in one line naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SpectuneError(f"{path} is not a readable Parquet file (half-written or corrupt): {reason}") from None
    present = {names.current_column(c) for c in table.column_names}  # a file written before: its columns' names now
    missing = [c for c in required if c not in present]
    if missing:
        raise SpectuneError(f"{path} is not a spectune {Path(path).stem} table: missing columns {', '.join(missing)}")
    return names.upgrade_frame(table.to_pandas())


def format_version(meta: dict[str, Any], where: Path | str = "metadata") -> int:
    """The format version ``meta`` was written in: :data:`UNVERSIONED` when it records none, an error when it is
    not a version this spectune reads."""
    version = meta.get(VERSION_KEY, UNVERSIONED)
    if isinstance(version, bool) or not isinstance(version, int) or version < UNVERSIONED:
        raise SpectuneError(f"{where}: format_version={version!r} is invalid: must be an integer >= {UNVERSIONED}")
    if version > FORMAT_VERSION:
        raise SpectuneError(f"{where} was written in run format {version}, newer than this spectune reads "
                            f"(<= {FORMAT_VERSION}): update spectune to read it")
    return version


def stamp(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the format version this spectune writes (first, so a reader sees it at the top)."""
    return {VERSION_KEY: FORMAT_VERSION, **{k: v for k, v in meta.items() if k != VERSION_KEY}}


@dataclass(frozen=True)
class RunFile:
    """One file of a run directory: its name, its format, and for a table the columns that define it.

    ``metadata`` files get the format version stamped on writing and checked (or filled in, for files
    older than the version) on reading.
    """

    name: str
    kind: Kind
    required: tuple[str, ...] = ()
    metadata: bool = False

    def named(self, **fields: Any) -> RunFile:
        """The file of a family (``grid_c{concurrency}.csv``) for these fields."""
        return RunFile(self.name.format(**fields), self.kind, self.required, self.metadata)

    def path(self, run_dir: Path | str) -> Path:
        return Path(run_dir) / self.name

    def found(self, run_dir: Path | str) -> Path:
        """The file to read in ``run_dir``: :meth:`path`, or the name a run written before gave it
        (:data:`spectune.names.FILES`: ``depth.zip`` for this ``gamma.zip``) when only that one is there."""
        return names.run_file(run_dir, self.name)

    def beside(self, path: Path | str) -> Path:
        """This file next to another one (``traces.metadata.json`` beside a ``traces.parquet``)."""
        return Path(path).with_name(self.name)

    def exists(self, run_dir: Path | str) -> bool:
        return self.found(run_dir).is_file()

    def write(self, run_dir: Path | str, data: Any) -> Path:
        """Write ``data`` (a dict, a DataFrame, a str or a figure, by kind) atomically into ``run_dir``."""
        path = self.path(run_dir)
        if self.kind == "json":
            return write_json(path, stamp(data) if self.metadata else data)
        if self.kind == "parquet":
            return write_parquet(path, data)
        if self.kind == "csv":
            return write_csv(path, data)
        if self.kind == "text":
            return write_text(path, data)
        if self.kind == "figure":
            return write_figure(path, data)
        raise TypeError(f"{self.name} is written by its own library (SB3's save), not by RunFile.write")

    def read_if_present(self, run_dir: Path | str, default: Any = None) -> Any:
        """:meth:`read`, or ``default`` when the run has no such file (an optional sidecar)."""
        return self.read(run_dir) if self.exists(run_dir) else default

    def read(self, run_dir: Path | str) -> Any:
        """The file's content: a dict (JSON; metadata with its ``format_version``), a DataFrame (Parquet/CSV,
        checked for the defining columns) or a str; under the name a run written before gave it (:meth:`found`)."""
        path = self.found(run_dir)
        if self.kind == "json":
            data = read_json(path)
            if self.metadata:
                data = {VERSION_KEY: format_version(data, path), **data}
            return data
        if self.kind == "parquet":
            return read_parquet(path, self.required)
        if self.kind == "csv":
            try:
                frame = pd.read_csv(path)
            except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
                raise SpectuneError(f"{path} is not a readable CSV file: {str(err).splitlines()[0]}") from None
            frame = names.upgrade_frame(frame)
            missing = [c for c in self.required if c not in frame]
            if missing:
                raise SpectuneError(f"{path} is not a spectune {self.name} table: missing columns {', '.join(missing)}")
            return frame
        if self.kind == "text":
            return path.read_text(encoding="utf-8")
        raise TypeError(f"{self.name} is read by its own library (matplotlib, SB3), not by RunFile.read")


# ---- what a run writes ------------------------------------------------------------------------------------
# Metadata: packages, git commit, host, hardware, models, config (spectune.run.metadata).
METADATA = RunFile("metadata.json", "json", metadata=True)
# task=bench, task=tune, policies.evaluate: per-method results, per-request and per-cycle records.
SUMMARY = RunFile("summary.json", "json")
REQUESTS = RunFile("requests.parquet", "parquet",
                   ("method", "request_id", "prompt_id", "status", "ttft_ms", "tpot_ms", "output_tokens"))
CYCLES = RunFile("cycles.parquet", "parquet", ("method", "cycle", "request_id", "gamma", "num_drafts", "accepted",
                                               "emitted"))
RECOMMENDATION = RunFile("recommendation.json", "json")  # task=tune
# task=trace and policies.train: recorded cycles and their metadata (a sidecar: it names no summary).
TRACES = RunFile("traces.parquet", "parquet", ("cycle", "row", "position", "accept_prob", "accepted"))
TRACES_METADATA = RunFile("traces.metadata.json", "json", metadata=True)
# task=profile and policies.train: the hardware cost profile (spectune.costmodel.profile reads it).
PROFILE = RunFile("profile.json", "json")
PROFILE_CALIBRATED = RunFile("profile.calibrated.json", "json")
# task=predict: prompt lookup replayed from greedy outputs, a row per (request, γ), and its per-category summary.
PREDICTION = RunFile("prediction.parquet", "parquet", ("request_id", "category", "gamma", "cycles", "accepted"))
PREDICTION_SUMMARY = RunFile("prediction.json", "json")
# task=verify, task=acceptance, task=costmodel.
VERIFY = RunFile("verify.json", "json")
# task=verify engine=llamacpp: one row per (spec type, prompt), AR's and the speculative output compared
VERIFY_GREEDY = RunFile("greedy.parquet", "parquet", ("spec_type", "prompt_id", "equal", "verdict"))
ACCEPTANCE = RunFile("acceptance.json", "json")
COVERAGE = RunFile("coverage.json", "json")  # task=coverage: every no-difference comparison and their coverage
COVERAGE_RECORDS = RunFile("records.parquet", "parquet", ("comparison", "method", "repeat", "request_id", "status",
                                                          "output_tokens", "e2el_ms", "duration_s"))
COSTMODEL_CSV = RunFile("costmodel.csv", "csv")
COSTMODEL_JSON = RunFile("costmodel.json", "json")
COSTMODEL_PNG = RunFile("costmodel.png", "figure")
# python -m analysis.costmodel: the fitted cost model against a run's measurement.
COSTMODEL_FIT_CSV = RunFile("costmodel_fit.csv", "csv")
COSTMODEL_FIT_JSON = RunFile("costmodel_fit.json", "json")
# python -m analysis.report.
REPORT = RunFile("report.md", "text")
REPORT_FIGURE = RunFile("{name}.png", "figure")  # a figure report.md embeds: .named(name=...)
# policies.train: learned policies (SB3 archives), settings and validation, learning curves, the classifier.
GAMMA_POLICY = RunFile("gamma.zip", "policy")
SIZE_POLICY = RunFile("size.zip", "policy")
CYCLE_POLICY = RunFile("cycle.zip", "policy")  # train.cycle_timesteps > 0: policy=ppo-cycle's file
TRAIN = RunFile("train.json", "json")
CURVES_CSV = RunFile("curves.csv", "csv")
CURVES_PNG = RunFile("curves.png", "figure")
CLASSIFIER = RunFile("classifier.json", "json")
# policies.evaluate: the grid's points and the policies against the best fixed γ.
GRID = RunFile("grid.parquet", "parquet")
GRID_CSV = RunFile("grid_c{concurrency}.csv", "csv")  # the grid at one concurrency, for calibration: .named()
TUNING = RunFile("tuning.csv", "csv")  # threshold baselines replayed on the training traces, per value tried
# The held-out prompts traced at one concurrency, for the oracle's replay: .named(concurrency=...).
HELDOUT_TRACES = RunFile("heldout_traces_c{concurrency}.parquet", "parquet", TRACES.required)
COMPARISON = RunFile("comparison.parquet", "parquet",
                     ("language", "concurrency", "policy", "method", "vs_best_fixed_pct", "vs_best_fixed_pct_ci95_lo",
                      "vs_best_fixed_pct_ci95_hi"))
COMPARISON_MD = RunFile("comparison.md", "text")
# A run over several prompt categories: per (concurrency, method, category) tokens, seconds and speed-up over the
# best fixed γ (by_category.parquet before 2026-12-06: spectune.names).
BY_CATEGORY = RunFile("by_category.parquet", "parquet", ("concurrency", "method", "category"))
CONDITIONS = RunFile("conditions.json", "json")  # policies.evaluate: what else ran during each measured point
# A job of a multirun that failed on bad input (spectune.run.cli): the sweep goes on, the sweep's end reports it.
ERROR = RunFile("error.json", "json")

FILES: tuple[RunFile, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, RunFile))
