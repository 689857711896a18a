"""What the pinning tests compare: deterministic results of the embedded tiny pair on a fixed seed.

Run ``python -m tests.pinning --record`` to rewrite ``tests/data/pinning/golden.json`` after a change that is
meant to alter behaviour (and say so in the commit); ``tests/test_pinning.py`` compares against it.

Everything here is deterministic on a CPU: keyed random streams (seed, stream, request, position), seeded PPO,
and costs read from a shipped profile (``tiny-cpu-2core-vm``) instead of the clock, including the live
fine-tuning (``train.live_time=profile``). What reads the clock (a grid's best γ, the bandit's live rewards,
tokens/s of a bench) cannot be pinned; see ``tests/test_pinning.py``.

Large values are stored as sha256 hashes of their bytes (stated per key: ``*_sha256``), small ones as values.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "pinning" / "golden.json"
PROFILE = "tiny-cpu-2core-vm"
MAX_GAMMA = 4
WORKLOAD = ("+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=4", "workload.max_new_tokens=12")
TIMING = ("draft_s", "verify_s")  # trace columns read from the clock
# The live runs pinned: (label, policy node, γ) at concurrency 1 and 2 (the bandit reads the clock: replay only).
ENGINE_POLICIES = (("ar", None, 0, (1,)), ("fixed3", {"name": "fixed"}, 3, (1, 2)),
                   ("confidence", {"name": "confidence", "threshold": 0.4}, 4, (2,)),
                   ("hf-heuristic", {"name": "hf-heuristic", "max_gamma": 32}, 2, (1,)),
                   ("svip", {"name": "svip", "h": 0.3}, 4, (2,)))
REPLAY_POLICIES = (*((label, node, gamma) for label, node, gamma, _ in ENGINE_POLICIES[1:]),
                   ("bandit", {"name": "bandit", "min_gamma": 0, "exploration": 1.0}, 4),
                   ("adaedl", {"name": "adaedl", "c_e": 0.5, "lam": 0.3, "epsilon": 0.01, "beta": 0.9,
                               "lam_min": 0.0, "lam_max": 0.95}, 4))
TRAIN = ("train.train_prompts=5", "train.heldout_prompts=1", "train.max_gamma=4", "train.concurrency=2",
         f"train.profile={PROFILE}", "train.allow_profile_mismatch=true", "train.timesteps=128",
         "train.eval_every=64", "train.ppo.n_steps=64", "train.ppo.batch_size=32", "train.ppo.n_epochs=2",
         "train.rounds=2", "train.size_timesteps=64", "train.live_steps=32", "train.live_time=profile")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def frame_sha256(frame: pd.DataFrame) -> str:
    """sha256 over the column names, dtypes and every column's values (strings joined with NUL)."""
    digest = hashlib.sha256()
    for name in frame.columns:
        column = frame[name]
        digest.update(name.encode())
        if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            digest.update(np.ascontiguousarray(column.to_numpy()).tobytes())
        else:  # strings (object or arrow-backed): their text, not the objects' addresses
            digest.update("\0".join(map(str, column.tolist())).encode())
    return digest.hexdigest()


def weights_sha256(path: Path) -> dict[str, str]:
    """sha256 of every tensor of an SB3 file's ``policy.pth`` (by name), and of all of them together."""
    import torch

    with zipfile.ZipFile(path) as archive:
        state = torch.load(io.BytesIO(archive.read("policy.pth")), map_location="cpu", weights_only=True)
    out = {name: sha256(tensor.detach().contiguous().numpy().tobytes()) for name, tensor in sorted(state.items())}
    out["all"] = sha256("".join(out.values()).encode())
    return out


def compose(config: str, *overrides: str) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tests.conftest import register_schemas

    register_schemas()  # as the entry modules do (this module also runs outside pytest)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name=config, overrides=list(overrides))


def open_engine() -> tuple[Any, list]:
    """The engine on the embedded pair and the workload's requests (models loaded once)."""
    from spectune.measure.point import requests_of
    from workloads.setup import open_setup

    setup = open_setup(compose("config", *WORKLOAD), "pinning")
    return setup.engine, requests_of(setup.workload.prompts, setup.workload.max_new_tokens)


def make(node: dict | None, gamma: int) -> Any:
    from policies.registry import make_policy

    return make_policy(node, gamma) if node is not None else None


def engine_runs(engine: Any, requests: list, gamma_zip: Path) -> dict[str, Any]:
    """Output token ids per request and (request, γ, drafts, accepted, emitted) per cycle, per policy × batch."""
    ppo = {"name": "ppo", "gamma_path": str(gamma_zip), "trust_pickle": False, "profile": None,
           "allow_profile_mismatch": False, "deterministic": True, "seed": 0}
    out = {}
    for label, node, gamma, batches in (*ENGINE_POLICIES, ("ppo", ppo, MAX_GAMMA, (1, 2))):
        for concurrency in batches:
            result = engine.run(requests, make(node, gamma), concurrency)
            out[f"{label}/c{concurrency}"] = {
                "tokens": {str(r.request_id): r.output_ids for r in result.requests},
                "cycles": [[c.request_id, c.gamma, c.num_drafts, c.accepted, c.emitted] for c in result.cycles]}
    return out


def trace_frame(engine: Any, requests: list) -> pd.DataFrame:
    from spectune.engine.traces import record

    return record(engine.session(requests, None, 2, keep_laws=True), requests, MAX_GAMMA)


def float_columns(frame: pd.DataFrame) -> list[str]:
    return [name for name in frame.columns if pd.api.types.is_float_dtype(frame[name])]


def traces_summary(frame: pd.DataFrame) -> dict[str, Any]:
    """The whole frame's sha256 (bit for bit: it also identifies the floating-point path that made it), the
    sha256 of its exact columns (tokens, counts, flags: the same on every CPU) and its float columns' values
    (for a comparison with a tolerance on another CPU's path)."""
    pinned = frame.drop(columns=list(TIMING))
    floats = float_columns(pinned)
    return {"columns": list(frame.columns), "rows": len(frame), "frame_sha256": frame_sha256(pinned),
            "exact_sha256": frame_sha256(pinned.drop(columns=floats)),
            "floats": {name: pinned[name].tolist() for name in floats},
            "accepted": int(frame["accepted"].sum()), "cycles": int(frame["cycle"].nunique())}


def replay(frame: pd.DataFrame, gamma_zip: Path) -> dict[str, Any]:
    """Replay scores (tokens/s charged by the profile) of each policy, fixed γ and the oracle on the traces."""
    from policies.envs.data import TraceSet
    from policies.envs.replay import replay_gammas, replay_scores, replay_table
    from spectune.costmodel.profile import load_profile

    profile = load_profile(PROFILE)
    traces = TraceSet(frame, {"concurrency": 2}, "pinning traces")
    ppo = {"name": "ppo", "gamma_path": str(gamma_zip), "trust_pickle": False, "profile": None,
           "allow_profile_mismatch": False, "deterministic": True, "seed": 0}
    policies = {label: make(node, gamma) for label, node, gamma in (*REPLAY_POLICIES, ("ppo", ppo, MAX_GAMMA))}
    table = replay_table(policies, traces, profile, MAX_GAMMA, fixed_gamma=2)
    gammas = {label: replay_gammas(make(node, gamma), traces, MAX_GAMMA, profile).tolist()
              for label, node, gamma in (*REPLAY_POLICIES, ("ppo", ppo, MAX_GAMMA))}
    scores = replay_scores(traces, profile, MAX_GAMMA, np.asarray(gammas["confidence"]))
    return {"table": table.to_dict(orient="list"), "gammas": gammas, "scores": scores}


def train(run_dir: Path) -> dict[str, Any]:
    """``task=train`` in process: traces of the split, the shipped profile, γ PPO, size rounds at
    concurrency 2, live fine-tuning with the profile's costs. The weights and the replay curves."""
    from policies.train.pipeline import train_policies

    cfg = compose("config", "task=train", WORKLOAD[0], "workload.max_new_tokens=10", *TRAIN)
    assert train_policies(cfg, run_dir) == 0
    curves = pd.read_csv(run_dir / "curves.csv")
    record = json.loads((run_dir / "train.json").read_text(encoding="utf-8"))
    return {"gamma_weights_sha256": weights_sha256(run_dir / "gamma.zip"),
            "size_weights_sha256": weights_sha256(run_dir / "size.zip"),
            "traces_sha256": frame_sha256(pd.read_parquet(run_dir / "traces.parquet").drop(columns=list(TIMING))),
            "curves": curves.to_dict(orient="list"), "final_validation": record["final_validation"],
            "size_validation": record["size_validation"]}


def compute(work: Path) -> dict[str, Any]:
    """Every pinned value (in order: training writes the gamma.zip the engine and the replay then use)."""
    trained = train(work / "train")
    gamma_zip = work / "train" / "gamma.zip"
    engine, requests = open_engine()
    frame = trace_frame(engine, requests)
    return {"train": trained, "engine": engine_runs(engine, requests, gamma_zip), "traces": traces_summary(frame),
            "replay": replay(frame, gamma_zip)}


def jsonable(value: Any) -> Any:
    """Plain JSON types (numpy scalars → Python; NaN stays NaN, as json writes it)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=f"write {GOLDEN.relative_to(REPO)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        values = jsonable(compute(Path(work)))
    if args.record:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    else:
        print(json.dumps(values, indent=1, sort_keys=True)[:4000])


if __name__ == "__main__":
    main()
