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
# # Adaptive policies against the fixed-γ grid
#
# Runs of adaptive draft-length policies (`policy=confidence`, `policy=hf-heuristic`, ...) beside fixed-γ
# runs with the AR baseline, e.g. `python -m harness -m +workload=en policy=fixed,confidence`. The speed-up
# is TPOT-based with a paired bootstrap interval over prompts; the question is whether a policy beats the
# best fixed γ *in hindsight* by more than that interval.

# %%
from IPython.display import Markdown, display

from analysis import plots
from analysis.load import fixed_gamma, load_requests

# %% tags=["parameters"]
results_dir = "multirun"  # a sweep (or list of runs) holding fixed-γ and policy runs

# %%
speedups = plots.speedup_table(load_requests(results_dir))
policies = speedups[~fixed_gamma(speedups["method"])]
fixed = speedups[fixed_gamma(speedups["method"])]
display(speedups)

# %%
if policies.empty:
    display(Markdown("_No adaptive policy in these results (only fixed γ): nothing to compare yet._"))
else:
    best = fixed.sort_values("tpot_speedup").groupby(["language", "concurrency"]).tail(1)
    display(best.rename(columns={"method": "best_fixed"}))
    display(plots.show(plots.policies_vs_grid(speedups)))
