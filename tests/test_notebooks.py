"""The analysis notebooks: committed clean, paired with their jupytext scripts, and run top to bottom by
papermill on the real tiny sweep (one per session), producing the tables and figures they promise."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from tests.conftest import REPO, SMALL_BENCH

NOTEBOOKS = REPO / "analysis" / "notebooks"
NAMES = ("sweep_overview", "cost_model", "policies_vs_grid")


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_without_outputs_and_matches_its_script(name):
    import jupytext

    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "results_dir = " in tagged[0].source
    script = jupytext.read(NOTEBOOKS / f"{name}.py")
    assert [c.source for c in script.cells] == [c.source for c in notebook.cells], "run jupytext --sync"


def _execute(name: str, results_dir: Path, out: Path, **parameters: str) -> nbformat.NotebookNode:
    import papermill

    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out),
                               parameters={"results_dir": str(results_dir), **parameters}, cwd=str(REPO),
                               kernel_name="python3", progress_bar=False)
    return nbformat.read(out, as_version=4)


def _outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    return [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]


def _count(notebook: nbformat.NotebookNode, mime: str, contains: str = "") -> int:
    return sum(1 for o in _outputs(notebook) if contains in str(o.get("data", {}).get(mime, "")) and
               mime in o.get("data", {}))


@pytest.fixture
def results(tiny_sweep, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_sweep, tmp_path / "sweep"))


@pytest.mark.slow(reason="executes a notebook in a Jupyter kernel (papermill)")
def test_sweep_overview_runs_and_shows_tables_and_figures(results, tmp_path):
    notebook = _execute("sweep_overview", results, tmp_path / "out.ipynb")
    assert not [o for o in _outputs(notebook) if o.output_type == "error"]
    assert _count(notebook, "text/html", "tpot_speedup") >= 2  # the grid points and the speed-up table
    assert _count(notebook, "text/html", "output_throughput") >= 1
    # speed-up vs γ, TTFT, TPOT, accepted lengths, per-position acceptance, throughput and p99 TPOT vs load
    assert _count(notebook, "image/png") == 7
    assert _count(notebook, "text/markdown", "swept: cfg.concurrency") == 1


@pytest.mark.slow(reason="executes a notebook in a Jupyter kernel (papermill)")
def test_cost_model_notebook_checks_the_formula_in_sample(results, tmp_path):
    notebook = _execute("cost_model", results, tmp_path / "out.ipynb")
    assert not [o for o in _outputs(notebook) if o.output_type == "error"]
    assert _count(notebook, "text/html", "in_sample_speedup") == 1
    assert _count(notebook, "text/html", "joint_acceptance") == 1
    assert _count(notebook, "image/png") == 1  # per-position acceptance; no profile/traces in a bench sweep
    assert _count(notebook, "text/markdown", "No profile.json / traces.parquet") == 1


@pytest.mark.slow(reason="runs task=profile and task=trace, then a notebook in a Jupyter kernel")
def test_cost_model_notebook_fits_a_real_profile_and_traces(results, tiny_cost_inputs, tmp_path):
    profile, traces = tiny_cost_inputs
    notebook = _execute("cost_model", results, tmp_path / "out.ipynb", profile=str(profile), traces=str(traces))
    assert not [o for o in _outputs(notebook) if o.output_type == "error"]
    assert _count(notebook, "text/html", "predicted_speedup") == 1
    assert _count(notebook, "image/png") == 2  # per-position acceptance, the fit against the measurement
    assert (results / "costmodel_fit.csv").exists()


@pytest.mark.slow(reason="executes a notebook in a Jupyter kernel (papermill)")
def test_policies_notebook_says_when_there_is_nothing_to_compare(results, tmp_path):
    notebook = _execute("policies_vs_grid", results, tmp_path / "out.ipynb")
    assert not [o for o in _outputs(notebook) if o.output_type == "error"]
    assert _count(notebook, "text/html", "tpot_speedup") == 1
    assert _count(notebook, "text/markdown", "No adaptive policy in these results") == 1


@pytest.mark.slow(reason="a bench run through the CLI, then a notebook in a Jupyter kernel")
def test_policies_notebook_compares_a_policy_with_the_grid(results, tmp_path, cli):
    done = cli(*SMALL_BENCH, "policy=confidence", "gamma=[2]", run_dir=results / "confidence")
    assert done.returncode == 0, done.stderr[-2000:]
    notebook = _execute("policies_vs_grid", results, tmp_path / "out.ipynb")
    assert not [o for o in _outputs(notebook) if o.output_type == "error"]
    assert _count(notebook, "text/html", "confidence:gamma=2") == 1  # the policy's row in the speed-up table
    assert _count(notebook, "text/html", "best_fixed") == 1
    assert _count(notebook, "image/png") == 1
