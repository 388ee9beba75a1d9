"""loop.dynamic_sampling (drop groups whose rewards are all equal, fill from the buffer) and loop.overlong."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlmix.config.schema import LoopConfig, Overlong
from rlmix.assembly.producers import ERROR_GROUP_BASE
from rlmix.correction.advantages import uniform_groups
from rlmix.metrics.aggregate import uniform_groups_frac
from rlmix.orchestration.filters import filter_part, group_lengths, take_groups
from rlmix.rollout import Rollouts

SIZE = 2


def part(rewards: list[float], first_group: int = 0, cut: tuple[int, ...] = ()) -> Rollouts:
    """A scored request: len(rewards) // SIZE groups of SIZE rows, 3 generated tokens each."""
    b = len(rewards)
    return Rollouts(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_lens=torch.full((b,), 2),
        completion_ids=torch.ones(b, 3, dtype=torch.long), mask=torch.ones(b, 3, dtype=torch.bool),
        sampler_logprobs=torch.zeros(b, 3), policy_version=torch.zeros(b, dtype=torch.long), pool=("p",) * b,
        finish_reason=tuple("length" if i in cut else "stop" for i in range(b)),
        group_ids=torch.arange(b) // SIZE + first_group, rewards=torch.tensor(rewards),
        format_ok=torch.ones(b, dtype=torch.bool), reward_errors=torch.zeros(b, dtype=torch.bool),
    )


CFG = LoopConfig(group_size=SIZE, groups_per_step=4, groups_per_request=2)


def test_uniform_groups():
    group = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    assert uniform_groups(rewards, group, 4).tolist() == [False, True, True, True]


def agentic_part(lengths: list[int], rewards: list[float], first_group: int = 0) -> Rollouts:
    """Groups of uneven size, as an agentic request brings them when the sandbox lost episodes."""
    ids = [first_group + g for g, n in enumerate(lengths) for _ in range(n)]
    return replace(part(rewards), group_ids=torch.tensor(ids))


def test_groups_are_counted_by_id_a_short_group_does_not_shift_the_next():
    p = agentic_part([3, 2, 2], [1, 0, 1, 1, 1, 0, 0])  # groups of 3 samples; two lost one each
    assert group_lengths(p, 3) == [3, 2, 2]
    out = filter_part(p, replace(CFG, group_size=3, dynamic_sampling=True))
    assert (out.groups, out.dropped) == (3, 2)
    assert out.part.group_ids.tolist() == [0, 0, 0] and out.part.rewards.tolist() == [1, 0, 1]


def test_a_failed_rewards_row_stays_in_its_group():
    """A row whose reward raised has an id of its own (a group of one for the baseline), but it is
    one of its problem's samples: counted and cut with them."""
    p = part([1, 0, 1, 1])
    p = replace(p, group_ids=torch.tensor([0, ERROR_GROUP_BASE + 0 * SIZE + 1, 1, 1]))
    assert group_lengths(p, SIZE) == [2, 2]
    taken = take_groups([p], 1, SIZE)
    assert len(taken[0]) == 2


def test_a_batch_never_splits_a_short_group():
    buffer = [agentic_part([3, 1], [1, 0, 1, 0], 0), agentic_part([2, 3], [1, 0, 0, 1, 0], 2)]
    taken = take_groups(buffer, 3, 3)
    assert [p.group_ids.tolist() for p in taken] == [[0, 0, 0, 1], [2, 2]]
    assert [p.group_ids.tolist() for p in buffer] == [[3, 3, 3]]


def test_every_step_logs_its_share_of_uniform_groups():
    """reward/uniform_groups_frac counts groups by id, whatever their size or order (episodes may be
    left out of a group), and is logged whether or not dynamic sampling drops them."""
    from rlmix.metrics.aggregate import reward_metrics

    rewards = torch.tensor([0.0, 1.0, 0.5, 0.0, 0.5, 0.0, 1.0])
    groups = torch.tensor([7, 7, 3, 9, 3, 9, 5])  # 7: mixed; 3, 9, 5 (one row): uniform
    assert uniform_groups_frac(groups, rewards) == pytest.approx(3 / 4)
    assert reward_metrics(part([1, 1, 0, 1, 0, 0]))["reward/uniform_groups_frac"] == pytest.approx(2 / 3)
    assert "reward/uniform_groups_frac" not in reward_metrics(replace(part([1, 0]), group_ids=None))


def test_the_defaults_leave_every_group_as_it_came():
    p = part([1, 1, 0, 0], cut=(1,))
    out = filter_part(p, CFG)
    assert out.part is p and (out.groups, out.dropped, out.overlong) == (2, 0, 1)


def test_dynamic_sampling_drops_the_groups_with_equal_rewards():
    out = filter_part(part([1, 0, 1, 1, 0, 0, 0.5, 0.25]), replace(CFG, dynamic_sampling=True))
    assert (out.groups, out.dropped) == (4, 2)
    assert out.part.rewards.tolist() == [1, 0, 0.5, 0.25] and out.part.group_ids.tolist() == [0, 0, 3, 3]
    none = filter_part(part([1, 1, 0, 0]), replace(CFG, dynamic_sampling=True))
    assert none.part is None and none.dropped == 2


def test_overlong_filter_takes_cut_completions_out_of_the_loss_only():
    out = filter_part(part([1, 0, 1, 1], cut=(0, 3)), replace(CFG, overlong=Overlong.filter))
    assert out.part.mask.any(dim=1).tolist() == [False, True, True, False]
    assert out.part.rewards.tolist() == [1, 0, 1, 1] and out.overlong == 2


def test_overlong_penalty_comes_before_the_uniform_test():
    """A cut sample in an all-correct group is penalised, so the group is no longer uniform."""
    cfg = replace(CFG, overlong=Overlong.penalty, overlong_penalty=0.5, dynamic_sampling=True)
    out = filter_part(part([1, 1, 0, 0], cut=(1,)), cfg)
    assert out.part.rewards.tolist() == [1, 0.5] and out.dropped == 1
    assert out.part.mask.all()


def test_a_batch_takes_exactly_its_groups_cutting_a_part_between_groups():
    buffer = [part([1, 0, 0, 1], 0), part([1, 0], 2), part([0, 1, 1, 0], 3)]
    taken = take_groups(buffer, 4, SIZE)
    assert [p.group_ids.tolist() for p in taken] == [[0, 0, 1, 1], [2, 2], [3, 3]]
    assert [p.group_ids.tolist() for p in buffer] == [[4, 4]]


def test_the_loop_fills_its_batch_from_the_kept_groups():
    from rlmix.orchestration.loop import AsyncLoop

    loop = AsyncLoop(replace(CFG, dynamic_sampling=True), trainer=None, samplers=[], task=None, seed=0, pad_id=0)
    for request in ([1, 1, 0, 1], [0, 0, 1, 0], [1, 0, 0, 0], [1, 0, 1, 1]):  # 8 groups, 3 of them uniform
        out = filter_part(part(request, first_group=len(loop.buffer) * 2), loop.cfg)
        if out.part is not None:
            loop.buffer.append(out.part)
    batch = loop._take_batch()
    assert len(batch) == 4 * SIZE and set(batch.group_ids.tolist()) == {1, 3, 4, 6}
    assert uniform_groups_frac(batch.group_ids, batch.rewards) == 0
    assert loop._take_batch() is None  # nothing kept is left: no second batch


def test_the_loop_takes_a_batch_of_short_groups_by_their_count():
    """Groups short of ``group_size`` rows still make a batch of ``groups_per_step`` groups, and the
    buffer reports the groups it holds, not its rows / ``group_size``."""
    from rlmix.orchestration.loop import AsyncLoop

    cfg = replace(CFG, group_size=3)
    loop = AsyncLoop(cfg, trainer=None, samplers=[], task=None, seed=0, pad_id=0)
    loop.buffer = [agentic_part([2, 3], [1, 0, 1, 0, 0], 0), agentic_part([1, 2, 3], [1, 1, 0, 0, 1, 0], 2)]
    assert loop._groups_ahead() == 5
    batch = loop._take_batch()
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 1, 2, 3, 3]
    assert [p.group_ids.tolist() for p in loop.buffer] == [[4, 4, 4]]


@pytest.mark.parametrize("override, key", [
    ("loop.overlong=truncate", "loop.overlong"),
    ("loop.overlong_penalty=-1", "loop.overlong_penalty=-1"),
])
def test_bad_keys_are_refused_in_one_line(override, key):
    from rlmix.commands.compose import compose_run_config
    from rlmix.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{key}") as err:
        compose_run_config(["+experiment=smoke", override])
    assert "\n" not in str(err.value)
