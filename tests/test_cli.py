"""The two front doors (spectune.cli), as a user meets them: real subprocesses of every command line with bad input.

Hydra applications (python -m harness, policies.train, policies.evaluate) and argparse ones (analysis.report,
analysis.costmodel, analysis.comparison, policies.train.fit_classifier) answer bad input the same way: one line
``error: ...`` on stderr, exit code 2, nothing written; in a multirun, ``error.json`` in the failed job's
directory, the other jobs run, and the sweep exits 2.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spectune import rundir

HYDRA_APPS = [
    ("harness", ["task=costmodel", "task.alfas=[0.5]"], "error: task.alfas is not a key of the config"),
    pytest.param("policies.train", ["train.max_deph=4"], "error: train.max_deph is not a key of the config"),
    ("harness", ["task=trace", "task.max_depth=8"], "error: task.max_depth is now task.max_gamma: the draft length is "
     "named gamma everywhere (give task.max_gamma=...)"),
    pytest.param("policies.evaluate", ["models=llama-9b"], "error: models='llama-9b' is unknown: choose one of"),
    ("harness", ["-m", "+workload=it,en", "workload.num_prompts=2"],  # Hydra's own error spans several lines
     "error: workload.num_prompts=2 cannot be set while +workload=... is swept"),
    pytest.param("policies.train", ["train.validation=1.5"],
                 "error: train.validation=1.5 is invalid: a fraction in (0, 1)"),
]


def _one_error_line(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]


@pytest.mark.parametrize(("module", "args", "message"), HYDRA_APPS)
def test_hydra_apps_answer_bad_input_in_one_line_with_exit_2(cli, tmp_path, module, args, message):
    """Checked before a job starts (a key or option), or raised inside the job (train.validation)."""
    done = cli(*args, run_dir=tmp_path / "run", module=module, timeout=300)
    _one_error_line(done, message)
    written = sorted(p.name for p in (tmp_path / "run").glob("*")) if (tmp_path / "run").exists() else []
    assert set(written) <= {".hydra", "train.log", "evaluate.log", "__main__.log"}, written  # logs only, no results


def _cli_paths(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    missing = str(tmp_path / "missing")
    return {
        "analysis.report": ([missing], f"error: {missing} does not exist"),
        "analysis.comparison": ([], "error: the following arguments are required: paths "
                                    "(see python -m analysis.comparison --help)"),
        "analysis.costmodel": (["--profile", f"{missing}.json", "--traces", f"{missing}.parquet", missing],
                               f"error: profile='{missing}.json' is not found"),
        "policies.train.fit_classifier": ([f"{missing}.parquet", str(tmp_path / "out.json")],
                                    f"error: traces='{missing}.parquet' is not found"),
    }


@pytest.mark.parametrize("module", [pytest.param("analysis.report"),
                                    pytest.param("analysis.comparison"), "analysis.costmodel",
                                    "policies.train.fit_classifier"])
def test_argparse_apps_answer_bad_input_in_one_line_with_exit_2(cli, tmp_path, module):
    args, message = _cli_paths(tmp_path)[module]
    done = cli(*args, module=module, timeout=300)
    _one_error_line(done, message)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow(reason="two Hydra multiruns through the CLI (harness and policies.train), a job of each fails")
@pytest.mark.parametrize(("module", "sweep", "bad_job", "message"), [
    ("harness", ["task=costmodel", "task.plot=false", "task.gamma_min=0,1"], "0", "task.gamma_min=0 is invalid"),
    ("policies.train", ["train.validation=1.5,0"], "0", "train.validation=1.5 is invalid: a fraction in (0, 1)"),
])
def test_a_multirun_job_with_bad_input_writes_error_json_and_the_sweep_exits_2(cli, tmp_path, module, sweep, bad_job,
                                                                               message):
    done = cli("-m", *sweep, f"hydra.sweep.dir={tmp_path}", module=module, timeout=600)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    error = rundir.ERROR.read(tmp_path / bad_job)
    assert message in error["error"] and error["overrides"][-1] == sweep[-1].split(",")[0], error
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and all("\n" not in e for e in errors) and any(message in e for e in errors), done.stderr[-2000:]
    assert errors[-1].startswith("error: ") and "job(s) of the sweep failed" in errors[-1]
    if module == "harness":  # the other job ran to the end
        assert not rundir.ERROR.exists(tmp_path / "1") and rundir.COSTMODEL_JSON.exists(tmp_path / "1")


def test_the_sweep_callback_lists_failed_jobs_and_exits_2(tmp_path, caplog):
    """harness.sweeps.FailedJobsExit at a multirun's end, in process: one error line per failed job (from its
    error.json), a closing line, exit code 2; a sweep without failures ends normally."""
    from omegaconf import OmegaConf

    from harness.sweeps import FailedJobsExit

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    (tmp_path / "0").mkdir()
    FailedJobsExit().on_multirun_end(config)  # nothing failed: returns
    rundir.ERROR.write(tmp_path / "1", {"error": "gamma=0 is invalid: must be >= 1", "overrides": ["gamma=0"]})
    with pytest.raises(SystemExit) as stop:
        FailedJobsExit().on_multirun_end(config)
    assert stop.value.code == 2
    lines = [r.getMessage() for r in caplog.records if r.name == "harness.sweeps"]
    assert lines == ["error: job 1 (gamma=0): gamma=0 is invalid: must be >= 1",
                     f"error: 1 job(s) of the sweep failed; the others' results are in {tmp_path}"]
