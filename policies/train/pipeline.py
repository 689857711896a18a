"""The training pipeline as a library function: the PPO γ policy trained in replay, as Learning to Draft
does live. ``python -m harness task=train`` runs it (and its alias ``python -m policies.train``); ``task=evaluate``
calls it for the policies it compares (one definition of the stages, no application calling another).

Steps, all into the given run directory:

1. Split the workload (its seeded shuffle): the first ``train.train_prompts`` prompts train, the next
   ``train.heldout_prompts`` are held out (``policies.evaluate``'s, never traced here). An empty split is an error.
2. Traces: ``train.traces`` (a ``task=trace`` file), or recorded here on the training split at ``train.max_gamma``.
3. Costs: ``train.profile`` (a profile.json or a shipped name such as ``h200-llama3-8b-1b``; another setup's profile
   needs ``train.allow_profile_mismatch=true`` and is labelled synthetic), or measured here on the same loaded
   models (:func:`spectune.measure.profiling.measure_profile`, as ``task=profile`` does; ``profile.json``).
4. PPO (stable-baselines3, MlpPolicy; n_steps 512, batch 64, 10 epochs, LTD's discount 0.99 and lr 3e-4 with
   a warm-up then linear decay: conf/task/train.yaml) on ``spectune/DraftGamma-v0`` over the training cycles, seeded,
   with TensorBoard logs and a progress bar. Every ``train.eval_every`` steps the deterministic policy is scored
   in replay on the validation cycles (a fraction of the training prompts never trained on): tokens/s next to the
   best fixed γ and the hindsight oracle on the same cycles (``curves.csv``, ``curves.png``, and TensorBoard's
   ``replay/*`` scalars: :class:`policies.train.ppo.EvalCallback`).
5. At ``train.concurrency`` > 1, the verification-size policy (``policies/train/size.py``): PPO on
   ``spectune/VerifySize-v0`` replay with the γ policy fixed (each row drafted to the γ policy's replay
   decision), ``train.size_timesteps`` steps (one step = one batch's budget). Then ``train.rounds`` − 1 more rounds
   alternate γ and size training (co-adaptive, as LTD). Simplification: the γ environment does not model
   the size policy's cut, so a later γ round goes on training the γ policy (at its decayed learning rate)
   on the same environment; the size policy is then re-trained on the new γ decisions.
6. ``gamma.zip`` (SB3's format, with ``spectune.json``: observation, actions, the profile, and its decisions
   distilled into thresholds on the training traces, ``policies/ppo_distilled.py``) for ``policy=ppo`` or
   ``policy=ppo-distilled`` with ``policy.gamma_path=...``, ``size.zip`` likewise for ``policy.size_path=...``,
   ``curves.csv`` (a ``policy`` and a ``round`` column) and ``train.json`` with the final scores and the run's metadata.

7. ``train.cycle_timesteps`` > 0: the cycle policy, PPO on ``spectune/CycleGamma-v0`` (the γ chosen once per
   cycle, before drafting: the per-step policy's comparison piece) on the same training cycles, profile and PPO
   settings, evaluated alike (``curves.csv`` rows with ``policy="cycle"``), written to ``cycle.zip`` for
   ``policy=ppo-cycle policy.path=...``. It runs after the γ policy is saved, and off by default.

8. ``train.live_steps`` > 0: the γ policy goes on training for that many steps on the live environment
   (``spectune/DraftGamma-v0``, ``backend="live"``: the engine on the training split, real synchronised time, or
   the profile's costs with ``train.live_time=profile``; ``policies/train/live.py``), after the replay rounds; its
   replay score is evaluated again (round ``live``).

:func:`train_policies` reads as these stages, each taking values and returning values; the models are loaded once per
process (:func:`spectune.measure.models.load_models`) for the traces, the profile and the live stage.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from policies.envs.data import TraceSet, read_traces
from policies.envs.observation import CYCLE, GAMMA
from policies.envs.replay import replay_scores
from policies.ppo_distilled import distill_into
from policies.train.ppo import CycleTraining, GammaTraining, save_policy, split_requests
from policies.train.schema import TrainConfig
from spectune.config import typed
from spectune.costmodel.profile import Profile, load_profile
from spectune.errors import SpectuneError
from spectune.io import write_figure
from spectune.options import integer
from spectune.run import rundir
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    traces: str | None
    profile: str | None
    allow_profile_mismatch: bool
    train_prompts: int
    heldout_prompts: int
    validation: float
    max_gamma: int
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
    live_time: str = "measured"
    cycle_timesteps: int = 0
    calibrate_per_gamma: bool = False
    features: tuple[str, ...] | None = None  # the γ policy's observation (None: the default, OBS_FIELDS)

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TrainSettings:
        """The ``train`` node, before any model loads: its types from the schema (policies/train/schema.py), then
        the ranges and choices here; each error one line (SpectuneError) naming the key."""
        t = typed(TrainConfig, cfg.train, "train")
        if not 0 < t.validation < 1:
            raise SpectuneError(f"train.validation={t.validation!r} is invalid: a fraction in (0, 1)")
        for key in ("n_steps", "batch_size", "n_epochs"):
            integer(getattr(t.ppo, key), f"train.ppo.{key}", lo=1)
        if not 0 <= t.ppo.warmup < 1:
            raise SpectuneError(f"train.ppo.warmup={t.ppo.warmup!r} is invalid: a fraction in [0, 1)")
        if t.live_time not in ("measured", "profile"):
            raise SpectuneError(f"train.live_time={t.live_time!r} is invalid: choose measured or profile")
        train_prompts = integer(t.train_prompts, "train.train_prompts", lo=1)
        if t.traces is None:  # traced here, one request per training prompt: the split is known before any model loads
            _validation_cut(train_prompts, t.validation)
        return cls(t.traces, t.profile, t.allow_profile_mismatch, train_prompts,
                   integer(t.heldout_prompts, "train.heldout_prompts", lo=0), t.validation,
                   integer(t.max_gamma, "train.max_gamma", lo=1), integer(t.concurrency, "train.concurrency", lo=1),
                   integer(t.profile_repeats, "train.profile_repeats", lo=1), t.reward, t.outcome, t.profile_jitter,
                   integer(t.timesteps, "train.timesteps", lo=1), integer(t.eval_every, "train.eval_every", lo=1),
                   asdict(t.ppo), integer(t.rounds, "train.rounds", lo=1),
                   integer(t.size_timesteps, "train.size_timesteps", lo=0),
                   integer(t.live_steps, "train.live_steps", lo=0), t.calibrate_to, t.live_time,
                   integer(t.cycle_timesteps, "train.cycle_timesteps", lo=0), t.calibrate_per_gamma,
                   check_features(t.features))


def check_features(features: list[str] | None) -> tuple[str, ...] | None:
    """``train.features``: distinct names of the γ observation's fields (None: its default), or one line naming them."""
    if features is None:
        return None
    unknown = [name for name in features if name not in GAMMA.fields]
    if not features or unknown or len(set(features)) != len(features):
        raise SpectuneError(f"train.features={list(features)!r} is invalid: give distinct names of "
                            f"{', '.join(GAMMA.fields)} (or null: {', '.join(GAMMA.features)})")
    return tuple(features)


def split_setup(cfg: DictConfig, settings: TrainSettings, task: str) -> tuple[Any, list, list]:
    """The engine on the configured models and the workload's training and held-out requests."""
    from workloads.setup import open_setup

    split_cfg = cfg.copy()
    with open_dict(split_cfg):
        split_cfg.workload.num_prompts = settings.train_prompts + settings.heldout_prompts
    try:
        setup = open_setup(split_cfg, task)
    except SpectuneError as err:
        if "workload.num_prompts" not in str(err):
            raise
        raise SpectuneError(f"train.train_prompts={settings.train_prompts} + train.heldout_prompts="
                            f"{settings.heldout_prompts} is invalid: {err}") from None
    from spectune.measure.point import requests_of

    workload = setup.workload
    train, heldout = split_requests(requests_of(workload.prompts, workload.max_new_tokens, workload.ignore_eos),
                                    settings.train_prompts, settings.heldout_prompts)
    return setup, train, heldout


# -- the stages, in order ---------------------------------------------------------------------------------
def training_traces(settings: TrainSettings, cfg: DictConfig, run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """1. The training traces: given, or recorded here on the training split at ``train.max_gamma``."""
    if settings.traces:
        return read_traces(settings.traces)
    from spectune.engine.traces import record
    from spectune.measure.point import check_context_fits

    setup, train, heldout = split_setup(cfg, settings, "train")
    check_context_fits(train, settings.max_gamma, setup.max_context)
    log.info("tracing the training split: %d prompts of %s (held out: %d) at max_gamma %d, concurrency %d",
             len(train), setup.workload.name, len(heldout), settings.max_gamma, settings.concurrency)
    session = setup.engine.session(train, None, settings.concurrency, keep_laws=True)
    frame = record(session, train, settings.max_gamma)
    metadata = {**setup.metadata, "max_gamma": settings.max_gamma, "concurrency": settings.concurrency,
                "split": {"train": [r.prompt_id for r in train], "heldout": [r.prompt_id for r in heldout]}}
    rundir.TRACES.write(run_dir, frame)
    rundir.TRACES_METADATA.write(run_dir, metadata)
    return frame, metadata


def cost_profile(settings: TrainSettings, cfg: DictConfig, run_dir: Path) -> Profile:
    """2. The costs: ``train.profile``, or measured here on this setup (``profile.json``)."""
    if settings.profile:
        return load_profile(settings.profile)
    from spectune.measure.profiling import measure_profile

    log.info("measuring the cost profile of this setup (train.profile unset)")
    setup, train, heldout = split_setup(cfg, settings, "profile")
    profile = measure_profile(setup.engine, train + heldout, setup.models, sorted({1, settings.concurrency}),
                              settings.max_gamma, 1, settings.profile_repeats,
                              f"{cfg.models.name}-{cfg.hardware.name}", setup.metadata)
    rundir.PROFILE.write(run_dir, profile.to_json())
    return profile


def _calibrated(profile: Profile, traces: TraceSet, settings: TrainSettings, run_dir: Path) -> Profile:
    """``train.calibrate_to``: a grid of live tokens/s per γ on the training prompts (CSV or Parquet with columns
    gamma, tok_s and optionally concurrency), to which the profile is calibrated (``policies.train.calibrate``)."""
    from policies.train.calibrate import calibrate_profile

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
    calibrated, _ = calibrate_profile(profile, traces, grid, per_gamma=settings.calibrate_per_gamma)
    rundir.PROFILE_CALIBRATED.write(run_dir, calibrated.to_json())
    return calibrated


OWN_HISTORY_MARGIN_PCT = 2.0  # how far below the best fixed γ the own-history replay may fall before a warning


def own_history_gap(network_tok_s: float, traces: TraceSet, profile: Profile, max_gamma: int) -> float:
    """The γ policy's replay tokens/s with its own decisions' history (``network_tok_s``: replayed through
    :func:`policies.envs.replay.replay_gammas`, where recent acceptance follows what the policy verified, as live)
    against the best fixed γ on the same traces, in %; a warning below −:data:`OWN_HISTORY_MARGIN_PCT`.

    Why: an episode of the γ environment is one recorded cycle whose recent acceptance comes from the recording,
    where every cycle drafted. Live, a policy that stops speculating on a request stops measuring its acceptance:
    a PPO policy that speculated only above a recent acceptance of 0.45 stopped for good after one rejected chain
    on 15 of 24 English requests (bench/results/adaptive-suffix-smollm2-cpu-20261206), while its validation in the
    environment said +2.7% over the fixed γ. Under a model-free draft the PPO policies now keep measuring (shadow
    acceptance tests, ``policy.shadow_trials``; the replay gives them too, and that file replays at +2.8%); a draft
    model has no such test, so the check stays."""
    fixed = replay_scores(traces, profile, max_gamma, np.zeros(traces.count, dtype=int), rate="request",
                          oracles=False)
    gap = 100 * (network_tok_s / fixed["best_fixed_tok_s"] - 1)
    if gap < -OWN_HISTORY_MARGIN_PCT:
        log.warning("replayed with its own decisions' history, the γ policy is %+.1f%% against the best fixed γ %d "
                    "on the training traces (%.1f vs %.1f tok/s); its environment scored it on recorded histories, "
                    "where every cycle drafted (a policy reading recent_acceptance that stops speculating on a "
                    "request stops measuring it): time it against the fixed γ before trusting it",
                    gap, fixed["best_fixed_gamma"], network_tok_s, fixed["best_fixed_tok_s"])
    return gap


def _validation_cut(prompts: int, fraction: float) -> int:
    """How many of ``prompts`` training prompts PPO trains on (the rest validate it); one line if none is left."""
    cut = max(1, round(prompts * (1 - fraction)))
    if cut >= prompts:
        raise SpectuneError(f"train.validation={fraction} leaves no validation prompts out of {prompts}: raise it "
                            "or train.train_prompts")
    return cut


def _split_validation(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    ids = sorted(frame["request_id"].unique())
    held = set(ids[_validation_cut(len(ids), fraction):])
    return frame[~frame["request_id"].isin(held)], frame[frame["request_id"].isin(held)]


def train_policies(cfg: DictConfig, run_dir: Path) -> int:
    """traces → profile (calibrated when asked) → γ policy → size rounds (batches) → live fine-tuning →
    (optionally) the cycle policy."""
    settings = TrainSettings.from_cfg(cfg)
    seed = int(cfg.seed)
    frame, trace_meta = training_traces(settings, cfg, run_dir)
    traces = TraceSet(frame, trace_meta, str(settings.traces or "training traces"))  # validated before any work
    profile = cost_profile(settings, cfg, run_dir)
    if settings.calibrate_to:
        profile = _calibrated(profile, traces, settings, run_dir)
    fit_frame, val_frame = _split_validation(frame, settings.validation)
    curves: list[dict[str, Any]] = []
    training = GammaTraining(TraceSet(fit_frame, trace_meta, "training cycles"),
                             TraceSet(val_frame, trace_meta, "validation cycles"), profile, settings.max_gamma,
                             settings.reward, settings.outcome, settings.profile_jitter,
                             settings.allow_profile_mismatch, settings.ppo, seed, run_dir, curves,
                             features=settings.features)
    training.evaluate(0, 1)
    final = training.train(settings.timesteps, settings.eval_every, 1)
    size_final = None
    if settings.concurrency > 1:
        from policies.train.size import size_rounds

        size_final = size_rounds(settings, seed, run_dir, profile, frame, trace_meta, training)
        final = training.latest
    if settings.live_steps:
        from policies.train.live import live_finetune

        setup, train, _ = split_setup(cfg, settings, "train")
        live_finetune(training.model, setup.engine, train, settings, profile, seed)
        final = training.evaluate(training.model.num_timesteps, "live")
    synthetic = training.env.synthetic
    path = rundir.GAMMA_POLICY.path(run_dir)
    observation = GAMMA.of(settings.features) if settings.features else GAMMA
    extra = {"observation": observation.schema(), "actions": ["stop", "continue"], "profile": profile.to_json(),
             "max_gamma": settings.max_gamma, "synthetic": synthetic, "trained_on": trace_meta.get("workload"),
             "validation": final}
    save_policy(training.model, settings.ppo, path, extra)
    distilled = distill_into(path, traces, profile, settings.max_gamma)  # policy=ppo-distilled reads it
    log.info("distilled the γ policy into q(x) thresholds %s (agreement %s) and step 0's recent acceptance >= "
             "%s (agreement %s); replay %.1f tok/s, the network's %.1f", [round(t, 4) for t in distilled.thresholds],
             distilled.overall, distilled.start_threshold, distilled.start_agreement, distilled.distilled_tok_s,
             distilled.network_tok_s)
    own_history_gap(distilled.network_tok_s, traces, profile, settings.max_gamma)
    cycle_final = _cycle_policy(settings, seed, run_dir, profile, training, trace_meta, curves) \
        if settings.cycle_timesteps else None
    curve_frame = pd.DataFrame(curves)
    rundir.CURVES_CSV.write(run_dir, curve_frame)
    _plot(curve_frame[curve_frame["policy"] == "gamma"], rundir.CURVES_PNG.path(run_dir))
    rundir.TRAIN.write(run_dir, {"settings": asdict(settings), "final_validation": final,
                                 "size_validation": size_final, "synthetic": synthetic,
                                 **({"cycle_validation": cycle_final} if cycle_final else {}),
                                 "profile": profile.label, "traces_metadata": trace_meta, "metadata": {
                                     **base_metadata(), "config": OmegaConf.to_container(cfg, resolve=True)}})
    log.info("wrote %s (policy=ppo policy.gamma_path=%s%s)%s", path, path,
             f" policy.size_path={rundir.SIZE_POLICY.path(run_dir)}" if size_final else "",
             f"  [{synthetic}]" if synthetic else "")
    return 0


def _cycle_policy(settings: TrainSettings, seed: int, run_dir: Path, profile: Profile, training: GammaTraining,
                  trace_meta: dict, curves: list[dict[str, Any]]) -> dict[str, Any]:
    """The cycle policy on the γ policy's training and validation cycles; writes ``cycle.zip``."""
    cycle = CycleTraining(training.env.traces, training.val, profile, settings.max_gamma, settings.reward,
                          settings.outcome, settings.profile_jitter, settings.allow_profile_mismatch, settings.ppo,
                          seed, run_dir, curves)
    cycle.evaluate(0, 1)
    final = cycle.train(settings.cycle_timesteps, settings.eval_every, 1)
    path = rundir.CYCLE_POLICY.path(run_dir)
    save_policy(cycle.model, settings.ppo, path, {"observation": CYCLE.schema(), "actions": "gamma",
                                                  "profile": profile.to_json(), "max_gamma": settings.max_gamma,
                                                  "synthetic": cycle.env.synthetic,
                                                  "trained_on": trace_meta.get("workload"), "validation": final})
    log.info("wrote %s (policy=ppo-cycle policy.path=%s)", path, path)
    return final


def _plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(frame["timesteps"], frame["policy_tok_s"], marker="o", label="PPO γ policy")
    axis.plot(frame["timesteps"], frame["best_fixed_tok_s"], linestyle="--", label="best fixed γ")
    axis.plot(frame["timesteps"], frame["oracle_tok_s"], linestyle=":", label="oracle (hindsight)")
    axis.set_xlabel("PPO steps")
    axis.set_ylabel("replay tokens/s (validation cycles)")
    axis.legend()
    write_figure(path, figure)
    plt.close(figure)
