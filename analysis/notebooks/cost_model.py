# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The cost model against the measurement
#
# S(γ) = E (1 + o) / (c γ + g(γ) + o), E = 1 + Σ_{i≤γ} P(first i drafts accepted), in units of one AR step.
#
# 1. **In sample**: every term measured in the runs themselves (acceptance from `cycles.parquet`, costs from
#    the cycles' draft/verify/rest seconds over the AR step). If this misses the TPOT-based speed-up, the
#    time goes somewhere the formula does not look (prefill, scheduling), not into a wrong term.
# 2. **Out of sample** (when `profile` and `traces` are given, or found below `results_dir`): costs from
#    `task=profile`, acceptance from `task=trace`, as `python -m analysis.costmodel` does.

# %%
from pathlib import Path

from IPython.display import Markdown, display

from analysis import plots
from analysis.costmodel.cli import measured
from analysis.costmodel.cli import run as fit_and_compare
from analysis.costmodel.model import sweep
from analysis.load import load_cycles
from spectune.run import rundir

# %% tags=["parameters"]
results_dir = "multirun"  # a bench run or sweep with fixed-γ runs and the AR baseline
profile = ""  # profile.json written by the profile task; empty: look below results_dir
traces = ""  # traces.parquet written by the trace task; empty: look below results_dir

# %%
runs = measured(results_dir)
runs["in_sample_error"] = runs["in_sample_speedup"] / runs["measured_speedup"] - 1
display(runs[["run", "gamma", "batch_size", "language", "measured_speedup", "in_sample_speedup", "in_sample_error",
              "measured_E", "measured_draft", "measured_verify", "measured_overhead"]])

# %% [markdown]
# ## Acceptance: joint P(first i accepted) against α^i

# %%
positions = plots.per_position_acceptance(load_cycles(results_dir))
display(positions)
display(plots.show(plots.per_position_figure(positions), "_No speculative cycles._"))

# %% [markdown]
# ## The model's curve with the measured acceptance and batch-one costs

# %%
one = runs[runs["batch_size"] == runs["batch_size"].min()]
c = float((one["measured_draft"] / one["gamma"]).mean())
verify = one.groupby("gamma")["measured_verify"].mean().to_dict()
joint = positions.groupby("position")["joint_acceptance"].mean().tolist()
alpha = joint[0]
curve = sweep([alpha], [c], sorted(verify), g=verify, overhead=float(one["measured_overhead"].mean()), joint=joint)
display(curve)

# %% [markdown]
# ## Out of sample: profile + traces

# %%
found = {file: next(iter(sorted(Path(results_dir).rglob(file.name))), None) for file in (rundir.PROFILE, rundir.TRACES)}
profile = profile or found[rundir.PROFILE]
traces = traces or found[rundir.TRACES]
if profile and traces:
    table = fit_and_compare(Path(profile), Path(traces), Path(results_dir))
    display(table)
    display(plots.show(plots.costmodel_figure(table)))
else:
    display(Markdown("_No profile.json / traces.parquet given or found: run `python -m harness task=profile` and "
                     "`python -m harness task=trace +workload=NAME`, then pass `-p profile ... -p traces ...`._"))
