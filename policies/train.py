"""`python -m policies.train +workload=it`: train the PPO depth policy in replay, as Learning to Draft does live.

Steps, all into the Hydra run directory:

1. Split the workload (its seeded shuffle): the first ``train.train_prompts`` prompts train, the next
   ``train.heldout_prompts`` are held out (``policies.evaluate``'s, never traced here). An empty split is an error.
2. Traces: ``train.traces`` (a ``task=trace`` file), or recorded here on the training split at ``train.max_depth``.
3. Costs: ``train.profile`` (a profile.json or a shipped name such as ``h200-llama3-8b-1b``; another setup's profile
   needs ``train.allow_profile_mismatch=true`` and is labelled synthetic), or measured here (``task=profile``).
4. PPO (stable-baselines3, MlpPolicy; n_steps 512, batch 64, 10 epochs, LTD's discount 0.99 and lr 3e-4 with
   a warm-up then linear decay: conf/train.yaml) on ``spectune/DraftDepth-v0`` over the training cycles, seeded,
   with TensorBoard logs and a progress bar. Every ``train.eval_every`` steps the deterministic policy is scored
   in replay on the validation cycles (a fraction of the training prompts never trained on): tokens/s next to the
   best fixed depth and the hindsight oracle on the same cycles (``curves.csv``, ``curves.png``).
5. At ``train.concurrency`` > 1, the verification-size policy (``policies/train_size.py``): PPO on
   ``spectune/VerifySize-v0`` replay with the depth policy fixed (each row drafted to the depth policy's replay
   decision), ``train.size_timesteps`` steps (one step = one batch's budget). Then ``train.rounds`` − 1 more rounds
   alternate depth and size training (co-adaptive, as LTD). Simplification: the depth environment does not model
   the size policy's cut, so a later depth round goes on training the depth policy (at its decayed learning rate)
   on the same environment; the size policy is then re-trained on the new depth decisions.
6. ``depth.zip`` (SB3's format, with ``spectune.json``: observation, actions, the profile) for ``policy=ppo
   policy.depth_path=...``, ``size.zip`` likewise for ``policy.size_path=...``, ``curves.csv`` (a ``policy``
   and a ``round`` column) and ``train.json`` with the final scores and the run's metadata.

7. ``train.live_steps`` > 0: the depth policy goes on training for that many steps on the live environment
   (``spectune/DraftDepth-v0``, ``backend="live"``: the engine on the training split, real synchronised time;
   ``policies/train_live.py``), after the replay rounds; its replay score is evaluated again (round ``live``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from harness import cli, rundir
from harness.errors import SpectuneError
from harness.io import write_figure
from harness.metadata import base_metadata
from harness.profile import Profile, load_profile
from harness.tasks._options import integer
from policies.envs.data import TraceSet
from policies.envs.observation import OBS_FIELDS

log = logging.getLogger("policies.train")


@dataclass(frozen=True)
class TrainSettings:
    traces: str | None
    profile: str | None
    allow_profile_mismatch: bool
    train_prompts: int
    heldout_prompts: int
    validation: float
    max_depth: int
    concurrency: int
    profile_repeats: int
    reward: str
    outcome: str
    profile_jitter: float
    timesteps: int
    eval_every: int
    ppo: dict[str, Any]
    rounds: int = 1
    size_timesteps: int = 0
    live_steps: int = 0
    calibrate_to: str | None = None

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TrainSettings:
        t = cfg.train
        validation = t.get("validation")
        if isinstance(validation, bool) or not isinstance(validation, int | float) or not 0 < validation < 1:
            raise SpectuneError(f"train.validation={validation!r} is invalid: a fraction in (0, 1)")
        if not isinstance(t.get("allow_profile_mismatch"), bool):
            raise SpectuneError(f"train.allow_profile_mismatch={t.get('allow_profile_mismatch')!r} is invalid: "
                                "true or false")
        ppo = OmegaConf.to_container(t.ppo, resolve=True)
        for key in ("n_steps", "batch_size", "n_epochs"):
            integer(ppo.get(key), f"train.ppo.{key}", lo=1)
        if not 0 <= float(ppo.get("warmup", 0)) < 1:
            raise SpectuneError(f"train.ppo.warmup={ppo.get('warmup')!r} is invalid: a fraction in [0, 1)")
        return cls(t.get("traces"), t.get("profile"), bool(t.allow_profile_mismatch),
                   integer(t.get("train_prompts"), "train.train_prompts", lo=1),
                   integer(t.get("heldout_prompts"), "train.heldout_prompts", lo=0), float(validation),
                   integer(t.get("max_depth"), "train.max_depth", lo=1),
                   integer(t.get("concurrency"), "train.concurrency", lo=1),
                   integer(t.get("profile_repeats"), "train.profile_repeats", lo=1), str(t.get("reward")),
                   str(t.get("outcome")), float(t.get("profile_jitter")),
                   integer(t.get("timesteps"), "train.timesteps", lo=1), integer(t.get("eval_every"),
                                                                                "train.eval_every", lo=1), ppo,
                   integer(t.get("rounds", 1), "train.rounds", lo=1),
                   integer(t.get("size_timesteps", 0), "train.size_timesteps", lo=0),
                   integer(t.get("live_steps", 0), "train.live_steps", lo=0), t.get("calibrate_to"))


class WarmupLinear:
    """Learning rate with a linear warm-up over the first ``warmup`` of training, then linear decay to 0 (LTD).
    SB3 calls it with the progress remaining (1 → 0)."""

    def __init__(self, lr: float, warmup: float) -> None:
        self.lr, self.warmup = float(lr), float(warmup)

    def __call__(self, progress_remaining: float) -> float:
        done = 1.0 - progress_remaining
        if done < self.warmup:
            return self.lr * max(done / self.warmup, 0.01)
        return self.lr * max(1.0 - (done - self.warmup) / (1.0 - self.warmup), 0.0)


def split_requests(requests: list, train: int, heldout: int) -> tuple[list, list]:
    """The first ``train`` requests (of the workload's seeded shuffle) and the next ``heldout``."""
    if len(requests) < train + heldout:
        raise SpectuneError(f"train.train_prompts={train} + train.heldout_prompts={heldout} is invalid: the workload "
                            f"has {len(requests)} prompts in its length band")
    return requests[:train], requests[train:train + heldout]


def replay_costs(traces: TraceSet, profile: Profile, max_depth: int) -> np.ndarray:
    """[N, max_depth + 1] seconds charged to each recorded (cycle, row) at each depth, as the environment does."""
    out = np.zeros((traces.count, max_depth + 1))
    for batch in np.unique(traces.batch_size):
        rows = traces.batch_size == batch
        b = int(batch)
        out[rows] = [(k * profile.t_draft(b) + profile.t_verify(b, k + 1) + profile.overhead(b)) / b
                     for k in range(max_depth + 1)]
    return out


def oracle_depths(tokens: np.ndarray, costs: np.ndarray, iterations: int = 50) -> np.ndarray:
    """The hindsight-best depth of every recorded cycle for total tokens / total time (Dinkelbach's method):
    with ρ the rate so far, each cycle takes argmax_k tokens_k − ρ·cost_k; ρ ← the new rate, until it stops
    rising. Exact for this ratio objective. Under greedy decoding and cheap verification it is the cycle's first
    mismatch; when verifying more positions costs more than it returns it stops earlier."""
    rate, depths = 0.0, np.zeros(len(tokens), dtype=int)
    index = np.arange(len(tokens))
    for _ in range(iterations):
        depths = np.argmax(tokens - rate * costs, axis=1)
        new = float(tokens[index, depths].sum() / costs[index, depths].sum())
        if new <= rate * (1 + 1e-12):
            break
        rate = new
    return depths


def replay_scores(traces: TraceSet, profile: Profile, max_depth: int, depths: np.ndarray) -> dict[str, Any]:
    """Replay tokens/s, on realised outcomes, of the given per-entry depths, of every fixed depth, and of the
    hindsight oracle (:func:`oracle_depths`)."""
    costs = replay_costs(traces, profile, max_depth)
    index = np.arange(traces.count)
    tokens = np.minimum(traces.leading[:, None], np.arange(max_depth + 1)[None, :]) + 1.0  # [N, K+1]
    fixed = tokens.sum(0) / costs.sum(0)
    best = int(np.argmax(fixed))
    oracle = oracle_depths(tokens, costs)
    rate = float(tokens[index, depths].sum() / costs[index, depths].sum())
    oracle_rate = float(tokens[index, oracle].sum() / costs[index, oracle].sum())
    return {"policy_tok_s": rate, "best_fixed_depth": best, "best_fixed_tok_s": float(fixed[best]),
            "oracle_tok_s": oracle_rate, "vs_best_fixed_pct": 100 * (rate / fixed[best] - 1),
            "oracle_vs_best_fixed_pct": 100 * (oracle_rate / fixed[best] - 1), "mean_depth": float(np.mean(depths)),
            "fixed_tok_s": fixed.tolist()}


def policy_depths(model: Any, env: Any, count: int) -> np.ndarray:
    """The deterministic policy's depth on each recorded entry (one episode per entry)."""
    depths = np.zeros(count, dtype=int)
    for entry in range(count):
        obs, _ = env.reset(options={"entry": entry})
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, done, _, info = env.step(int(action))
        depths[entry] = info["depth"]
    return depths


def _traces(settings: TrainSettings, cfg: DictConfig, run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """The training traces: given, or recorded here on the training split."""
    if settings.traces:
        loaded = TraceSet.load(settings.traces)  # validates the file
        return pd.read_parquet(settings.traces), loaded.metadata
    from harness.engine.traces import record
    from harness.tasks.trace import build_setup, check_depth, workload_requests

    with open_dict(cfg):
        cfg.workload.num_prompts = settings.train_prompts + settings.heldout_prompts
    try:
        setup = build_setup(cfg, "train")
    except SpectuneError as err:
        if "workload.num_prompts" not in str(err):
            raise
        raise SpectuneError(f"train.train_prompts={settings.train_prompts} + train.heldout_prompts="
                            f"{settings.heldout_prompts} is invalid: {err}") from None
    train, heldout = split_requests(workload_requests(setup.workload), settings.train_prompts,
                                    settings.heldout_prompts)
    check_depth(train, settings.max_depth, setup.max_context)
    log.info("tracing the training split: %d prompts of %s (held out: %d) at max_depth %d, concurrency %d",
             len(train), setup.workload.name, len(heldout), settings.max_depth, settings.concurrency)
    session = setup.engine.session(train, None, settings.concurrency, keep_laws=True)
    frame = record(session, train, settings.max_depth)
    metadata = {**setup.metadata, "max_depth": settings.max_depth, "concurrency": settings.concurrency,
                "split": {"train": [r.prompt_id for r in train], "heldout": [r.prompt_id for r in heldout]}}
    rundir.TRACES.write(run_dir, frame)
    rundir.TRACES_METADATA.write(run_dir, metadata)
    return frame, metadata


def _profile(settings: TrainSettings, cfg: DictConfig, run_dir: Path) -> Profile:
    if settings.profile:
        return load_profile(settings.profile)
    from harness.tasks import profile as profile_task

    task = {"name": "profile", "batch_sizes": sorted({1, settings.concurrency}), "max_depth": settings.max_depth,
            "repeats": settings.profile_repeats, "warmup": 1, "label": None}
    profile_cfg = cfg.copy()
    with open_dict(profile_cfg):
        profile_cfg.task = task
    log.info("measuring the cost profile of this setup (train.profile unset)")
    profile_task.run(profile_cfg, run_dir)
    return load_profile(rundir.PROFILE.path(run_dir))


def _split_validation(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = sorted(frame["request_id"].unique())
    cut = max(1, round(len(ids) * (1 - fraction)))
    if cut >= len(ids):
        raise SpectuneError(f"train.validation={fraction} leaves no validation prompts out of {len(ids)}: raise it "
                            "or train.train_prompts")
    held = set(ids[cut:])
    return frame[~frame["request_id"].isin(held)], frame[frame["request_id"].isin(held)]


def _ppo_model(settings: TrainSettings, env: Any, seed: int, run_dir: Path) -> Any:
    from stable_baselines3 import PPO

    ppo = settings.ppo
    return PPO("MlpPolicy", env, n_steps=int(ppo["n_steps"]), batch_size=int(ppo["batch_size"]),
               n_epochs=int(ppo["n_epochs"]), gamma=float(ppo["gamma"]),
               learning_rate=WarmupLinear(float(ppo["learning_rate"]), float(ppo["warmup"])),
               policy_kwargs={"net_arch": list(ppo["net_arch"])}, seed=seed, device="cpu",
               tensorboard_log=str(run_dir / "tensorboard"), verbose=0)


def _save(model: Any, settings: TrainSettings, path: Path, extra: dict[str, Any]) -> None:
    """Save with a plain-number learning rate (no pickled schedule code in the file), then annotate."""
    from policies.sb3_files import annotate_policy_file

    model.learning_rate = float(settings.ppo["learning_rate"])
    model._setup_lr_schedule()
    model.save(path)
    annotate_policy_file(path, extra)


def _calibrated(profile: Profile, frame: pd.DataFrame, trace_meta: dict, settings: TrainSettings,
                run_dir: Path) -> Profile:
    """``train.calibrate_to``: a grid of live tokens/s per γ on the training prompts (CSV or Parquet with columns
    gamma, tok_s and optionally concurrency), to which the profile is calibrated (``policies.calibrate``)."""
    from policies.calibrate import calibrate_profile

    path = Path(settings.calibrate_to)
    if not path.is_file():
        raise SpectuneError(f"train.calibrate_to={settings.calibrate_to!r} is not found: give the grid.csv of "
                            "python -m policies.evaluate (live tokens/s per γ on the same training prompts)")
    grid = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if "concurrency" in grid:
        grid = grid[grid["concurrency"] == settings.concurrency]
    missing = [c for c in ("gamma", "tok_s") if c not in grid]
    if missing or not len(grid):
        raise SpectuneError(f"train.calibrate_to={settings.calibrate_to!r} is invalid: it needs rows with columns "
                            f"gamma and tok_s at concurrency {settings.concurrency}")
    calibrated, _ = calibrate_profile(profile, TraceSet(frame, trace_meta, "training traces"), grid)
    rundir.PROFILE_CALIBRATED.write(run_dir, calibrated.to_json())
    return calibrated


def run(cfg: DictConfig, run_dir: Path) -> int:
    from policies.envs.depth import DraftDepthEnv

    settings = TrainSettings.from_cfg(cfg)
    frame, trace_meta = _traces(settings, cfg, run_dir)
    profile = _profile(settings, cfg, run_dir)
    if settings.calibrate_to:
        profile = _calibrated(profile, frame, trace_meta, settings, run_dir)
    fit_frame, val_frame = _split_validation(frame, settings.validation)
    fit, val = TraceSet(fit_frame, trace_meta, "training cycles"), TraceSet(val_frame, trace_meta, "validation cycles")
    train_env = DraftDepthEnv("replay", fit, profile, settings.max_depth, settings.reward, settings.outcome,
                              settings.profile_jitter, settings.allow_profile_mismatch)
    val_env = DraftDepthEnv("replay", val, profile, settings.max_depth, settings.reward, "realised", 0.0,
                            settings.allow_profile_mismatch)
    train_env.reset(seed=int(cfg.seed))
    model = _ppo_model(settings, train_env, int(cfg.seed), run_dir)
    curves: list[dict[str, Any]] = []
    latest: list[dict[str, Any]] = [{}]
    round_index = [1]

    def evaluate(step: int) -> dict[str, Any]:
        scores = replay_scores(val, profile, settings.max_depth, policy_depths(model, val_env, val.count))
        curves.append({"policy": "depth", "round": round_index[0], "timesteps": step,
                       **{k: v for k, v in scores.items() if k != "fixed_tok_s"}})
        latest[0] = scores
        log.info("step %6d: replay %.1f tok/s, best fixed depth %d %.1f tok/s (%+.1f%%), oracle %.1f tok/s, "
                 "mean depth %.2f", step, scores["policy_tok_s"], scores["best_fixed_depth"],
                 scores["best_fixed_tok_s"], scores["vs_best_fixed_pct"], scores["oracle_tok_s"],
                 scores["mean_depth"])
        return scores

    def train_depth() -> dict[str, Any]:
        model.learn(settings.timesteps, callback=every(settings.eval_every, evaluate), progress_bar=True,
                    tb_log_name="depth",
                    reset_num_timesteps=round_index[0] == 1)
        if curves[-1]["timesteps"] != model.num_timesteps or curves[-1]["policy"] != "depth":
            return evaluate(model.num_timesteps)
        return latest[0]

    evaluate(0)
    final = train_depth()
    size_final = None
    if settings.concurrency > 1:
        from policies.train_size import size_rounds

        size_final = size_rounds(settings, cfg, run_dir, profile, frame, trace_meta, model, curves, round_index,
                                 train_depth)
        final = latest[0]
    if settings.live_steps:
        from policies.train_live import live_finetune

        round_index[0] = "live"
        live_finetune(model, cfg, settings, profile)
        final = evaluate(model.num_timesteps)
    synthetic = train_env.synthetic
    path = rundir.DEPTH_POLICY.path(run_dir)
    _save(model, settings, path, {"observation": list(OBS_FIELDS), "actions": ["stop", "continue"],
                                  "profile": profile.to_json(), "max_depth": settings.max_depth,
                                  "synthetic": synthetic, "trained_on": trace_meta.get("workload"),
                                  "validation": final})
    curve_frame = pd.DataFrame(curves)
    rundir.CURVES_CSV.write(run_dir, curve_frame)
    _plot(curve_frame[curve_frame["policy"] == "depth"], rundir.CURVES_PNG.path(run_dir))
    rundir.TRAIN.write(run_dir, {"settings": asdict(settings), "final_validation": final,
                                 "size_validation": size_final, "synthetic": synthetic,
                                 "profile": profile.label, "traces_metadata": trace_meta, "metadata": {
                                     **base_metadata(), "config": OmegaConf.to_container(cfg, resolve=True)}})
    log.info("wrote %s (policy=ppo policy.depth_path=%s%s)%s", path, path,
             f" policy.size_path={rundir.SIZE_POLICY.path(run_dir)}" if size_final else "",
             f"  [{synthetic}]" if synthetic else "")
    return 0


def _plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(frame["timesteps"], frame["policy_tok_s"], marker="o", label="PPO depth policy")
    axis.plot(frame["timesteps"], frame["best_fixed_tok_s"], linestyle="--", label="best fixed depth")
    axis.plot(frame["timesteps"], frame["oracle_tok_s"], linestyle=":", label="oracle (hindsight)")
    axis.set_xlabel("PPO steps")
    axis.set_ylabel("replay tokens/s (validation cycles)")
    axis.legend()
    write_figure(path, figure)
    plt.close(figure)


def every(steps: int, evaluate: Callable[[int], Any]) -> Any:
    """An SB3 callback calling ``evaluate(num_timesteps)`` every ``steps`` environment steps (replay curves)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Periodic(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % steps < self.model.n_envs:
                evaluate(self.num_timesteps)
            return True

    return Periodic()


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(run, cfg)


if __name__ == "__main__":
    cli.hydra_entry(main, "train")
