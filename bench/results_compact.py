"""Keep the committed results within their budget: compact the records, and take superseded archive entries out of
the tree with their line kept.

    python bench/results_compact.py bench/results/NEW [...]           # compact every Parquet file below, in place
    python bench/results_compact.py --archive NAME [...] [--commit C]  # archive/NAME leaves the tree, its line stays

Compacting drops the per-token lists no page reads — each request's token times and inter-token latencies
(``token_times_s``, ``itls_ms``: the TTFT/TPOT/ITL figures are in ``summary.json`` already) and each cycle's start
time (``start_s``) — and rewrites every Parquet file losslessly (zstd, byte-stream split for floats): each file is
read back and compared with the original, column by column, values and dtypes exact, before it replaces it. What
the pages, tests and replays read stays: the output ids (greedy exactness), the cycles' counts and costs, traces.
A server engine's logs (``servers/*.log``: each server's own output) are gzipped, losslessly (read back and compared
byte for byte first): ``zcat RUN/servers/ar.log.gz`` reads one.

Archiving an entry records its line of ``archive/README.md`` and the commit that holds it in
``archive/removed.json``; ``git checkout <commit> -- bench/results/archive/NAME`` restores it. Run
``python -m analysis.results_index`` afterwards.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = REPO / "bench" / "results" / "archive"
UNREAD_REQUESTS, UNREAD_CYCLES = ("token_times_s", "itls_ms"), ("start_s",)

log = logging.getLogger("results_compact")


def _without(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The table less ``columns``, its pandas metadata (column list, dtypes) kept in step."""
    gone = [c for c in columns if c in table.column_names]
    if not gone:
        return table
    table = table.drop_columns(gone)
    meta = dict(table.schema.metadata or {})
    if b"pandas" in meta:
        pandas_meta = json.loads(meta[b"pandas"])
        pandas_meta["columns"] = [c for c in pandas_meta["columns"] if c.get("field_name") not in gone]
        meta[b"pandas"] = json.dumps(pandas_meta).encode()
    return table.replace_schema_metadata(meta)


def unread(name: str) -> tuple[str, ...]:
    """The columns of a run file (by its name) that no page, test or replay reads."""
    from spectune.run import rundir  # after main() put this checkout first on the path

    return {rundir.REQUESTS.name: UNREAD_REQUESTS, rundir.CYCLES.name: UNREAD_CYCLES}.get(name, ())


def compact_bytes(path: Path) -> tuple[bytes, list[str]]:
    """The compacted file's bytes and the columns it leaves out."""
    table = pq.read_table(path)
    dropped = [c for c in unread(path.name) if c in table.column_names]
    table = _without(table, tuple(dropped))
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", compression_level=19, use_byte_stream_split=floats or False,
                   use_dictionary=[c for c in table.column_names if c not in floats])
    return out.getvalue(), dropped


def _same(before: pd.DataFrame, after: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(before, after, check_exact=True, check_dtype=True, check_column_type=True)


def compact(path: Path) -> tuple[int, int]:
    """Compact one Parquet file in place, after checking that it reads back equal; (bytes before, after)."""
    data, dropped = compact_bytes(path)
    before = pd.read_parquet(path).drop(columns=dropped)
    after = pd.read_parquet(io.BytesIO(data))
    _same(before, after)
    size = path.stat().st_size
    if len(data) >= size and not dropped:
        return size, size
    path.write_bytes(data)
    return size, len(data)


def gzip_log(path: Path) -> tuple[int, int]:
    """A server's log gzipped beside it (``<name>.log.gz``), after checking that it reads back byte for byte; the
    plain file is removed. (bytes before, after)"""
    raw = path.read_bytes()
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    if gzip.decompress(packed) != raw:
        raise SystemExit(f"{path}: the gzipped log does not read back equal; left as it is")
    path.with_name(path.name + ".gz").write_bytes(packed)
    path.unlink()
    return len(raw), len(packed)


def archive(names: list[str], commit: str) -> None:
    """Take ``archive/NAME`` out of the tree, keeping its line (and ``commit``, which holds it: the file's commit, or
    the entry's own where it differs)."""
    from analysis.results_archive import REMOVED, removed, what

    held, entries = removed(ARCHIVE)
    for name in names:
        path = ARCHIVE / name
        rel = path.relative_to(REPO).as_posix()
        if subprocess.run(["git", "cat-file", "-e", f"{commit}:{rel}"], cwd=REPO, check=False).returncode != 0:
            raise SystemExit(f"{commit} does not hold {rel}: it could not be restored from there")
        entries.append({"name": name, "what": what(path)} | ({"commit": commit} if held and held != commit else {}))
        subprocess.run(["git", "rm", "-r", "-q", rel], cwd=REPO, check=True)
        log.info("archive/%s left the tree (git checkout %s -- %s restores it)", name, commit[:7], rel)
    entries.sort(key=lambda e: e["name"])
    data = {"commit": held or commit, "entries": entries}
    (ARCHIVE / REMOVED).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/results_compact.py", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="results folders whose Parquet files to compact")
    parser.add_argument("--archive", nargs="+", default=[], metavar="NAME", help="archive entries to take out")
    parser.add_argument("--commit", help="the commit that holds them (default: HEAD)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.path.insert(0, str(REPO))
    if args.archive:
        commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                               check=True).stdout.strip()
        archive(args.archive, commit)
    total_before = total_after = 0
    for path in sorted(p for folder in args.folders for p in folder.rglob("*.parquet")):
        before, after = compact(path)
        total_before += before
        total_after += after
        log.info("%s: %d -> %d bytes", path, before, after)
    if args.folders:
        log.info("Parquet files: %d -> %d bytes", total_before, total_after)
    logs = sorted(p for folder in args.folders for p in folder.rglob("servers/*.log"))
    if logs:
        sizes = [gzip_log(p) for p in logs]
        log.info("server logs: %d -> %d bytes (gzipped)", sum(b for b, _ in sizes), sum(a for _, a in sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
