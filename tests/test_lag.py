"""Controlled lag (``loop.lag``, rlmix/orchestration/lag.py): the schedule by hand, and one seed
giving one run through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlmix.orchestration.lag import LagSchedule, request_of
from rlmix.assembly.producers import ERROR_GROUP_BASE
from tests.agentic_models import BRIEF_AGENT
from tests.test_train_e2e import read_metrics, rlmix_train_here


def test_each_request_is_generated_s_versions_behind_the_step_that_trains_it():
    lag = LagSchedule(lag=2, requests_per_step=4, sync_every=1)
    # requests 0-3 train at version 0, 4-7 at 1, ...; generated at max(step - 2, 0)
    assert [lag.version(i) for i in range(0, 24, 4)] == [0, 0, 0, 1, 2, 3]
    assert [lag.step_of(i) for i in (0, 3, 4, 23)] == [0, 0, 1, 5]
    synchronous = LagSchedule(lag=0, requests_per_step=4, sync_every=1)
    assert [synchronous.version(i) for i in range(0, 24, 4)] == [0, 1, 2, 3, 4, 5]


def test_versions_are_ones_that_were_published_and_none_before_the_floor():
    every3 = LagSchedule(lag=0, requests_per_step=1, sync_every=3)
    assert [every3.version(i) for i in range(8)] == [0, 0, 0, 3, 3, 3, 6, 6]
    restarted = LagSchedule(lag=2, requests_per_step=1, sync_every=1, floor=5)  # back at checkpoint step 5
    assert [restarted.version(i) for i in range(5, 10)] == [5, 5, 5, 6, 7]
    assert LagSchedule(lag=0, requests_per_step=1, sync_every=2, floor=5).version(6) == 6


def test_requests_go_round_the_samplers_alive():
    assert [LagSchedule.sampler(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_part_names_its_request_even_when_a_reward_failed():
    class Part:
        def __init__(self, group_ids):
            self.group_ids = torch.tensor(group_ids)

    group_size, per_request = 4, 2
    assert request_of(Part([10, 10, 11]), group_size, per_request) == 5
    failed = ERROR_GROUP_BASE + 10 * group_size + 1  # sample 1 of group 10 lost its reward
    assert request_of(Part([failed, 10, 11]), group_size, per_request) == 5


# How fast the machine was: the only thing allowed to differ. loop/buffered_groups counts the groups
# that had finished when a step ended, which is a race between the samplers and the trainer.
TIMING = ("time", "time/", "throughput/", "loop/buffered_groups", "agent/env_time_frac")


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


@pytest.mark.slow
def test_one_seed_gives_one_run(tmp_path, warm_ray):
    """Two runs of the same command with ``loop.lag=1`` log the same numbers at every step, and
    every step after the first trains on samples exactly one version old. Both go through the CLI's
    entry in this process: the second reuses the first's actor processes, reset, as a sweep's next
    job does, and must still log the same numbers."""
    args = ("+experiment=smoke", "loop.lag=1", "loop.steps=4", "logger.wandb.mode=disabled")
    runs = []
    for name in ("first", "second"):
        rlmix_train_here(*args, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        runs.append(read_metrics(tmp_path / name))
    first, second = runs
    assert len(first) == 4 and _without_timing(first) == _without_timing(second)
    assert [row["staleness/mean"] for row in first] == [0.0, 1.0, 1.0, 1.0]
    assert all(row["staleness/dropped_groups"] == 0 for row in first)
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert summary["status"] == "completed"


@pytest.mark.slow
def test_one_seed_gives_one_run_on_episodes(tmp_path, warm_ray):
    """The same promise on an episode task, whose concurrent episodes share sampler calls in
    whatever groups their timing makes: each seeded turn draws what it would draw alone."""
    args = ("+experiment=sc_mis", "task=minicode_agent", "task.levels=[1]", *BRIEF_AGENT, "fleet=smoke",
            "task.concurrent_episodes=1", "loop.lag=1", "loop.steps=2", "loop.groups_per_step=2", "loop.group_size=4", "loop.groups_per_request=2",
            "logger.wandb.mode=disabled")
    runs = []
    for name in ("first", "second"):
        rlmix_train_here(*args, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        runs.append(read_metrics(tmp_path / name))
    first, second = runs
    assert len(first) == 2 and first[0]["agent/turns_mean"] > 1  # episodes, with observations between turns
    assert _without_timing(first) == _without_timing(second)


@pytest.mark.slow
def test_a_resumed_run_goes_back_to_its_lag(tmp_path, warm_ray):
    """A run resumed from a checkpoint trains at its lag again once ``s`` steps have passed (the
    first ``s`` are generated at the checkpoint's weights, as nothing older exists). The checkpoint
    used to record the next request not yet issued, which the samplers had taken ``s`` steps ahead:
    every later request's planned step moved by the lag, and the resumed run trained at lag 0."""
    args = ("+experiment=smoke", "loop.lag=2", "logger.wandb.mode=disabled")
    run_dir = tmp_path / "run"
    rlmix_train_here(*args, "loop.steps=3", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    rlmix_train_here(*args, "loop.steps=6", f"resume={run_dir}", cwd=tmp_path)
    staleness = [row["staleness/mean"] for row in read_metrics(run_dir)]
    assert staleness == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
