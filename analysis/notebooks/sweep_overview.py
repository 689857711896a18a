# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Sweep overview
#
# One run or a whole Hydra multirun: what was swept, the printed tables (views of the tidy frames), the
# TPOT-based speed-up against γ with paired bootstrap intervals, latency distributions and acceptance.
# Set `results_dir` (papermill: `-p results_dir DIR`) and run top to bottom.

# %%
from IPython.display import Markdown, display

from analysis import plots
from analysis.bench_table import bench_table, format_table
from analysis.load import add_speedups, load_cycles, load_requests, load_summaries, swept

# %% tags=["parameters"]
results_dir = "multirun"  # a run directory or a multirun (sweep) directory
allow_mixed = False  # True to pool runs of different models or hardware

# %%
summaries = add_speedups(load_summaries(results_dir, allow_mixed=allow_mixed))
requests = load_requests(results_dir, allow_mixed=allow_mixed)
cycles = load_cycles(results_dir, allow_mixed=allow_mixed)
varied = swept(summaries)
display(Markdown(f"**{summaries['run'].nunique()} run(s)**, swept: {', '.join(varied) or 'nothing'}; "
                 f"models {summaries['target'].iloc[0]} / {summaries['draft'].iloc[0]}, "
                 f"hardware {summaries['hardware'].iloc[0]} ({summaries['execution_path'].iloc[0]})"))

# %% [markdown]
# ## Grid points (recorded field names)

# %%
overview = summaries[["run", *varied, "workload", "method", "gamma", "status", "output_throughput", "mean_tpot_ms",
                      "p99_tpot_ms", "spec_decode_acceptance_length", "speedup", "tpot_speedup"]]
display(overview)

# %% [markdown]
# ## The printed table of each run

# %%
for run, rows in summaries.groupby("run", sort=False):
    print(run)
    print(format_table(bench_table(rows.to_dict("records"))), end="\n\n")

# %% [markdown]
# ## Speed-up against γ

# %%
speedups = plots.speedup_table(requests)
display(speedups)
display(plots.show(plots.speedup_vs_gamma(speedups), "_No fixed-γ runs with an AR baseline._"))

# %% [markdown]
# ## Latency and acceptance

# %%
for metric in ("ttft_ms", "tpot_ms"):
    display(plots.show(plots.latency_distribution(requests, metric)))
positions = plots.per_position_acceptance(cycles)
display(positions)
for figure in (plots.accepted_length_histogram(cycles), plots.per_position_figure(positions)):
    display(plots.show(figure, "_No speculative cycles._"))

# %% [markdown]
# ## Load

# %%
for field, label in (("output_throughput", "output throughput (tokens/s)"), ("p99_tpot_ms", "p99 TPOT (ms)")):
    figure = plots.vs_concurrency(summaries, field, label, f"{label} against load")
    display(plots.show(figure, "_One concurrency only: nothing to plot against load._"))
