"""Controlled lag (``loop.lag``): which weights and which sampler generate each request, fixed by the config.

In the free-running loop a sample's policy version is whatever its sampler held when it was free,
so the lag a run sees depends on how fast each process happened to be, and the same seed can give
two different runs. With ``loop.lag = s`` request ``i`` is trained, unless groups are filtered out,
by the step that starts at trainer version ``p(i) = i // requests_per_step``; it is generated from
weights version ``max(p(i) − s, floor)`` (rounded down to a version that was published, every
``loop.weight_sync_every`` steps), by sampler ``i mod n`` of the n samplers alive. A batch is
taken only when every request before its last group has come back. Everything a step trains on is
then a function of the config and the seed, not of the machine's speed: a rerun gives the same
metrics (timing aside). ``s = 0`` is synchronous on-policy training.

``floor`` is the oldest version the run can still hand out: its start, or the checkpoint a
replaced trainer came back from (the first ``s`` steps after either are generated at that version,
as nothing older exists).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlmix.assembly.producers import request_group
from rlmix.rollout import Rollouts


@dataclass(frozen=True)
class LagSchedule:
    lag: int
    requests_per_step: int  # loop.groups_per_step // loop.groups_per_request
    sync_every: int  # loop.weight_sync_every
    floor: int = 0

    def step_of(self, request_id: int) -> int:
        """The trainer version at which request ``request_id`` is planned to be trained."""
        return request_id // self.requests_per_step

    def first_request(self, step: int) -> int:
        """The first request planned for trainer version ``step``: where a run that goes on from a
        checkpoint at ``step`` starts (the ones after it were generated ahead, from weights the run
        no longer holds, and are generated again)."""
        return step * self.requests_per_step

    def version(self, request_id: int) -> int:
        """The weights version that generates request ``request_id``."""
        v = max(self.step_of(request_id) - self.lag, self.floor)
        return max(v - v % self.sync_every, self.floor)

    @staticmethod
    def sampler(request_id: int, alive: int) -> int:
        """Which of the ``alive`` samplers (in fleet order) generates request ``request_id``."""
        return request_id % alive


def request_of(part: Rollouts, group_size: int, groups_per_request: int) -> int:
    """The request a buffered part came from (its first row's group, ``request_group``)."""
    return request_group(int(part.group_ids[0]), group_size) // groups_per_request
