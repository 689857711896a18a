"""`python bench/c8_ar_work_probe.py [VARIANTS] [REPEATS]`: exploration on smollm2-eagle (bfloat16, 2 threads,
concurrency 8). Does per-step PPO doing AR's work (γ 0 every cycle) slow the target's own forwards?
AR, per-step PPO (the c = 8 run's files), the cycle PPO and AR again, each built fresh per repeat, the held-out
prompts in blocks of 8 (state kept across blocks, as the interleaved comparison does), order rotated per repeat.
Per (method, repeat), one JSON line: summed verify seconds, median verify at batch 8, minor faults, context switches.
Variants: ar, ppo, ppo-nosize (without the size policy), ppo-cycle, ar-beside-ppo (a per-step PPO built and kept
alive while AR runs). Recorded run: bench/results/archive/smollm2-eagle-c8-ar-work-probe-cpu-20261203.jsonl (made
before the cycles were keyed by block: its cycle figures are, per run, the first block's 47 cycles of 8 prompts). The
c = 8 run left the tree with the other explorations; restore its files first:
`git checkout 27cbd87 -- bench/results/smollm2-eagle-policies-c8-cpu-20261203`."""
import gc
import json
import resource
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from harness.tasks import schemas

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench/results/smollm2-eagle-policies-c8-cpu-20261203/train/c8"
variants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["ar", "ppo", "ppo-cycle", "ar2"]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
schemas.register()  # conf/'s schemas, as the entry module registers them
with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=["+workload=en", "models=smollm2-eagle", "hardware.threads=2",
                                                   "hardware.dtype=bfloat16", "workload.num_prompts=40"])
from policies.evaluate import learned_files, policy_node  # noqa: E402
from policies.registry import make_policy  # noqa: E402
from policies.train.ppo import split_requests  # noqa: E402
from spectune.measure import measure_point, requests_of  # noqa: E402
from workloads.setup import open_setup  # noqa: E402

setup = open_setup(cfg, "probe")
_, heldout = split_requests(requests_of(setup.workload.prompts, setup.workload.max_new_tokens), 24, 16)
blocks = [heldout[:8], heldout[8:]]

nodes = {  # the files evaluate hands each policy at concurrency 8
    "ppo": policy_node("ppo", **learned_files("ppo", RUN, 8)),
    "ppo-nosize": policy_node("ppo", gamma_path=learned_files("ppo", RUN, 8)["gamma_path"]),
    "ppo-cycle": policy_node("ppo-cycle", **learned_files("ppo-cycle", RUN, 8)),
}


held = []


def build(name):
    if name == "ar-beside-ppo":  # a per-step PPO built and kept alive, but AR runs
        held.append(make_policy(nodes["ppo"], 4))
        return None, 0
    if name.startswith("ar"):
        return None, 0
    return make_policy(nodes[name], 4), 4


out = []
for r in range(repeats):
    order = variants[r % len(variants):] + variants[: r % len(variants)]
    for name in order:
        policy, gamma = build(name)
        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        cycles = []
        for i, block in enumerate(blocks):
            _, cyc, _ = measure_point(setup.engine, block, policy, name, gamma, concurrency=8,
                                      warmup=1 if i == 0 else 0, max_context=setup.max_context,
                                      reset_policy=(i == 0))
            cycles.append(cyc.assign(block=i))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cy = pd.concat(cycles).groupby(["block", "cycle"]).agg(v=("verify_s", "first"), b=("batch_size", "first"),
                                                    d=("num_drafts", "sum"))
        row = {"repeat": r, "method": name, "verify_s": round(cy.v.sum(), 3),
               "med_b8_ms": round(1000 * cy[cy.b == 8].v.median(), 1), "cycles": len(cy), "drafts": int(cy.d.sum()),
               "minflt": ru1.ru_minflt - ru0.ru_minflt, "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw,
               "wall_s": round(time.perf_counter() - t0, 2), "threads": torch.get_num_threads()}
        print(json.dumps(row), flush=True)
        out.append(row)
        del policy
        held.clear()
        gc.collect()
t = pd.DataFrame(out)
print(t.groupby("method")[["verify_s", "med_b8_ms", "minflt", "nivcsw"]].median())
