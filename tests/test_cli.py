"""The two front doors (spectune.run.cli), as a user meets them: real subprocesses of every command line with bad input.

The Hydra application (python -m harness, the console script ``spectune``, and the aliases python -m policies.train
and policies.evaluate of its tasks train and evaluate) and the argparse ones (analysis.report, analysis.costmodel,
analysis.comparison, policies.train.fit_classifier) answer bad input the same way: one line ``error: ...`` on
stderr, exit code 2, nothing written; in a multirun, ``error.json`` in the failed job's directory, the other jobs
run, and the sweep exits 2.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from spectune.run import rundir

HYDRA_APPS = [
    ("harness", ["task=costmodel", "task.alfas=[0.5]"], "error: task.alfas is not a key of the config"),
    pytest.param("policies.train", ["train.max_deph=4"], "error: train.max_deph is not a key of the config"),
    ("harness", ["task=trace", "task.max_depth=8"], "error: task.max_depth is now task.max_gamma: the draft length is "
     "named gamma everywhere (give task.max_gamma=...)"),
    ("harness", ["+workload=en", "workload.tasks=[chat]"], "error: workload.tasks is now workload.categories: what a "
     "prompt asks for is its category (task= is the job) (give workload.categories=...)"),
    pytest.param("policies.evaluate", ["models=llama-9b"], "error: models='llama-9b' is unknown: choose one of"),
    ("harness", ["-m", "+workload=it,en", "workload.num_prompts=2"],  # Hydra's own error spans several lines
     "error: workload.num_prompts=2 cannot be set while +workload=... is swept"),
    pytest.param("policies.train", ["train.validation=1.5"],
                 "error: train.validation=1.5 is invalid: a fraction in (0, 1)"),
    ("harness", ["task=train", "train.max_deph=4"], "error: train.max_deph is not a key of the config"),
    ("harness", ["task=evaluate", "+workload=en", "evaluate.hindsight=maybe"],
     "error: evaluate.hindsight='maybe' is invalid: must be true or false"),
    ("harness", ["task=train", "+workload=en", "resume=true"],  # raised inside the job, before any model loads
     "error: resume=true is invalid with task=train: it does not resume"),
    ("policies.train", ["task=bench"],
     "error: task=bench is invalid with python -m policies.train: it runs task=train"),
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


@pytest.mark.parametrize("task", ["train", "evaluate"])
def test_the_aliases_help_names_the_front_door(cli, task):
    """``python -m policies.train|evaluate --help`` says first that ``python -m harness task=...`` is the front door,
    then prints Hydra's help of the composed config (its groups, the task group among them)."""
    done = cli("--help", module=f"policies.{task}", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"python -m policies.{task} is an alias of `python -m harness task={task}`, the "
                                  "front door"), done.stdout[:500]
    assert "task: " in done.stdout and "Powered by Hydra" in done.stdout


CONSOLE = "import sys; from harness.__main__ import entry; sys.argv[0] = 'spectune'; entry()"


def test_the_console_script_is_the_front_door(tmp_path):
    """pyproject.toml's ``spectune`` script names ``harness.__main__:entry``. Called as an installed script calls it (a
    real process that imports the function and calls it with the command line, ``python -c``: this checkout's code,
    nothing reinstalled), it runs a task into its run directory with the job log of ``python -m harness``, prints
    the pinned config for ``--cfg job``, and answers bad input in one line with exit code 2."""
    from tests import pin_outputs

    scripts = tomllib.loads((pin_outputs.REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts["spectune"].partition(":")
    assert (module, function) == ("harness.__main__", "entry") and callable(getattr(importlib.import_module(module),
                                                                                    function))

    def spectune(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CONSOLE, *args], cwd=pin_outputs.REPO, capture_output=True,
                              text=True, timeout=300)

    done = spectune("task=costmodel", "task.plot=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert rundir.COSTMODEL_JSON.exists(tmp_path / "run") and (tmp_path / "run" / "__main__.log").is_file()
    _, overrides = pin_outputs.config_overrides()["task-evaluate"]
    done = spectune(*overrides, "--cfg", "job")
    assert done.returncode == 0 and done.stdout == pin_outputs.read_recorded()["configs"]["task-evaluate"]
    _one_error_line(spectune("task=costmodel", "task.alfas=[0.5]"), "error: task.alfas is not a key of the config")


@pytest.mark.skipif(not entry_points(group="console_scripts", name="spectune") or not shutil.which("spectune"),
                    reason="the installed spectune predates its [project.scripts] entry: pip install -e . installs it")
def test_the_installed_console_script_runs_the_front_door(tmp_path):
    """The script pip installed, as a user types it (where the environment's install has it)."""
    done = subprocess.run([shutil.which("spectune"), "task=costmodel", "task.plot=false",
                           f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and rundir.COSTMODEL_JSON.exists(tmp_path), done.stderr[-2000:]
