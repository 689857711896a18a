"""Job logs: the console keeps its plain look, the run directory's __main__.log keeps the same lines timestamped."""

from __future__ import annotations

import logging
import re
import warnings

from spectune.run.logs import BelowLevel, capture_warnings

STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[harness\.tasks\.costmodel\]\[INFO\] - ")


def test_tables_go_plain_to_stdout_and_timestamped_to_the_job_log(cli, tmp_path):
    proc = cli("task=costmodel", "task.plot=false", run_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Cost model: S = E / (c*γ + g(γ) + overhead)")  # no timestamp, no level
    assert any(re.match(r"^ alpha=0\.7\s+0\.05\s+6\s", line) for line in lines), proc.stdout
    assert not any(line.startswith("[") for line in lines)

    log = (tmp_path / "__main__.log").read_text(encoding="utf-8").splitlines()
    assert STAMP.match(log[0]) and log[0].endswith("Cost model: S = E / (c*γ + g(γ) + overhead), γ = 1..16, "
                                                   "g = 1.0, overhead = 0")
    table = [line for line in log if STAMP.match(line)]
    assert [STAMP.sub("", line) for line in table] == lines  # every console line, in order, stamped


def test_an_error_is_one_plain_line_on_stderr_and_lands_in_the_log(cli, tmp_path):
    proc = cli("task=costmodel", "task.gamma_max=0", run_dir=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: task.gamma_max=0") and errors[0] == proc.stderr.strip()
    log = (tmp_path / "__main__.log").read_text(encoding="utf-8")
    assert "[ERROR] - error: task.gamma_max=0" in log


def test_warnings_are_captured_into_logging(caplog):
    capture_warnings()
    try:
        with caplog.at_level(logging.WARNING, logger="py.warnings"), warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a tokenizer was slow", UserWarning, stacklevel=1)
        assert any("a tokenizer was slow" in r.getMessage() and r.name == "py.warnings" for r in caplog.records)
    finally:
        logging.captureWarnings(False)


def test_stdout_handler_passes_only_records_below_warning():
    keep = BelowLevel("WARNING")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert keep.filter(record)
    for level in (logging.WARNING, logging.ERROR):
        assert not keep.filter(logging.LogRecord("x", level, __file__, 1, "m", None, None))
