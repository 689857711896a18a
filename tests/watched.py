"""A γ policy that keeps every observation it builds, so tests can compare what the live policy observed with what
the environment builds for the same cycle and step (one definition of the observation)."""

from __future__ import annotations

from policies.ppo import PPOGamma


class Watched(PPOGamma):
    """PPOGamma that keeps every observation it builds: (cycle, draft step, [slots, F] float32); step -1 is the
    step-0 decision's, before drafting."""

    def reset(self) -> None:
        super().reset()
        self.cycle, self.seen = -1, []

    def begin_cycle(self, batch_size: int) -> int:
        self.cycle += 1
        return super().begin_cycle(batch_size)

    def observation(self, step):
        obs = super().observation(step)
        self.seen.append((self.cycle, step.step, obs.copy()))
        return obs

    def start_observation(self, context, batch_size):
        obs = super().start_observation(context, batch_size)
        self.seen.append((self.cycle, -1, obs.copy()))
        return obs

    def decide(self, step):
        """The deterministic steps decide through the split first layer, which builds no observation (its
        decisions are the actor's on this observation: test_policy_files.py::test_the_split_decision_is_the_actors_
        argmax); the observation is built here only to be compared with the environment's."""
        self.observation(step)
        return super().decide(step)
