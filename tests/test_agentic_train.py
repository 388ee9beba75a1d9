"""Episodes as training rows: the minicode_agent tool, the episode record through the real sampler
and sandbox, and the loss of every correction arm on an episode batch (environment tokens: zero gradient)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from rlmix.config.swebench import MiniCodeAgentConfig
from rlmix.embedded.minicode_agent import tool
from rlmix.agentic.train import EpisodeRollouts
from rlmix.assembly.parts import make_task
from rlmix.assembly.rules import resolve_correction
from rlmix.config.schema import CorrectionConfig
from rlmix.correction.weights import Objective
from rlmix.correction import MODES, CorrectionMode
from rlmix.rollout import END_REASONS, EPISODE_STATS, SamplingParams
from rlmix.embedded.minicode_lang import all_programs, run, show, unparse
from tests.agentic_models import tiny_agent_model


def test_the_sandbox_tool_computes_what_minicode_computes():
    rng = random.Random(0)
    inputs = ["", "0", "51234", "9081726354"] + ["".join(rng.choice("0123456789") for _ in range(5)) for _ in range(8)]
    for length in (1, 2):
        for program in all_programs(length):
            ops = tool.parse(unparse(program))
            for xs in inputs:
                assert tool.run(ops, xs) == show(run(program, tuple(int(c) for c in xs)))
    with pytest.raises(ValueError):
        tool.parse("rev|add9")


@pytest.fixture(scope="module")
def episode_batch(tmp_path_factory):
    """8 real episodes (2 problems x 4) of a random tiny model in real sandboxes, with head and support."""
    from rlmix.models.io import load_tokenizer
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler

    model_dir = tiny_agent_model(tmp_path_factory.mktemp("tiny") / "model")
    tokenizer = load_tokenizer(model_dir)
    sampler = TorchSampler(model_dir, resolve_view("CPU", "bf16"), pool="cpu")
    cfg = MiniCodeAgentConfig(max_turns=3)
    task = make_task(cfg, seed=0)
    params = SamplingParams(top_p=0.9, num_candidates=16, support_slots=128,
                            stop_token_ids=(tokenizer.eos_token_id,), seed=1)
    try:
        batch = EpisodeRollouts(cfg, task, tokenizer, "cpu")(sampler, tuple(task.sample(2, seed=0)), (7, 9), 4, params)
    finally:
        task.close()
    return batch, model_dir, tokenizer


def test_episode_record_carries_the_full_sampler_record(episode_batch):
    batch, _, _ = episode_batch
    assert len(batch) + batch.infra_errors == 8 and batch.infra_errors == 0
    assert batch.group_ids.tolist() == [7] * 4 + [9] * 4 and batch.pool == ("cpu",) * 8
    m = batch.mask
    # Environment tokens sit between policy turns: a completion is not one masked run.
    assert any((~m[b, : int(m[b].nonzero().max())]).any() for b in range(len(batch)))
    assert (batch.head_ids[m][:, 0] >= 0).all() and (batch.head_ids[~m] == -1).all()
    assert torch.isinf(batch.head_logprobs[~m]).all() and (batch.sampler_logprobs[~m] == 0).all()
    sampled = batch.completion_ids[m]
    in_support = batch.support_ids[m] == sampled[:, None]
    assert in_support.any(1).all()  # top-p replay: every drawn token is in its recorded support
    q = (batch.support_probs[m] * in_support).sum(1)
    assert torch.allclose(batch.sampler_logprobs[m], q.log(), atol=1e-5)
    stats = {name: batch.episode_stats[:, i] for i, name in enumerate(EPISODE_STATS)}
    assert torch.equal(stats["policy_tokens"], m.sum(1).float())
    last_policy = torch.stack([m[b].nonzero().max() for b in range(len(batch))])  # the submit or last turn
    assert (stats["episode_tokens"] >= batch.prompt_lens + last_policy + 1).all()
    assert (stats["episode_tokens"] <= batch.prompt_lens + m.shape[1]).all()
    assert (stats["episode_tokens"] - batch.prompt_lens).max() == m.shape[1]  # T is the longest completion
    assert ((stats["end_reason"] >= 0) & (stats["end_reason"] < len(END_REASONS))).all()
    assert (stats["env_s"] <= stats["wall_s"]).all() and (stats["env_s"] > 0).all()


ARMS = [(mode, objective) for mode, spec in MODES.items() for objective in Objective if objective in spec.objectives]


@pytest.mark.parametrize("replay_support", [True, False], ids=["topp_replay", "no_replay"])
@pytest.mark.parametrize("mode,objective", ARMS, ids=[f"{m.value}-{o.value}" for m, o in ARMS])
def test_every_arm_trains_on_episodes_and_environment_tokens_get_no_gradient(episode_batch, mode, objective,
                                                                              replay_support):
    from rlmix.models.io import load_causal_lm
    from rlmix.trainers.loss import batch_loss

    batch, model_dir, tokenizer = episode_batch
    batch = batch.replace(rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]))  # a signal in each group
    model = load_causal_lm(model_dir).train()
    # The output layer's input (final norm's output, (B, L, d)): the trainer may compute logits a
    # chunk at a time without a (B, L, V) tensor, but every position's logits are W h_j, so the loss
    # reaches position j's logits iff it reaches h_j; a zero gradient at h_j is a zero logits gradient.
    hidden_seen = []

    def keep_hidden(_module, _inputs, out):
        out.retain_grad()
        hidden_seen.append(out)

    model.model.norm.register_forward_hook(keep_hidden)
    cfg = resolve_correction(CorrectionConfig(mode=mode, objective=objective, replay_support=replay_support))
    advantages = batch.rewards - batch.rewards.view(2, 4).mean(1).repeat_interleave(4)
    out = batch_loss(model, batch, advantages, cfg, num_tokens=batch.num_tokens, pad_id=tokenizer.pad_token_id,
                     autocast=None)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    grad = hidden_seen[0].grad  # (B, L, d): position j predicts token j + 1
    B, T = batch.mask.shape
    predicts_policy = torch.zeros(grad.shape[:2], dtype=torch.bool)
    rows = torch.arange(B)[:, None].expand(B, T)
    predicts_policy[rows[batch.mask], (batch.prompt_lens[:, None] + torch.arange(T) - 1)[batch.mask]] = True
    assert (grad[~predicts_policy] == 0).all()  # exactly zero: prompt, observations, padding
    assert grad[predicts_policy].abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_every_correction_mode_is_covered():
    assert {m for m, _ in ARMS} == set(CorrectionMode)


def test_a_request_s_episodes_come_back_in_job_order_and_one_error_ends_the_others_at_their_next_turn():
    # run_episodes is the unit; each "episode" here is a loop of policy turns, as run_sample's is.
    import time
    from collections import Counter
    from types import SimpleNamespace

    from rlmix.agentic.run import EpisodesStopped, run_episodes

    turns, stopped, failing = Counter(), [], []

    class Turns:
        def __init__(self, job):
            self.job = job

        def act(self, transcript):
            turns[self.job] += 1
            if self.job in failing and turns[self.job] == 2:
                raise RuntimeError("sampler process lost")
            time.sleep(0.01)

    def play(job, policy, length=50):
        try:
            for _ in range(length - 5 * (job % 3)):  # finishing out of order
                policy.act(SimpleNamespace(task_id=f"t{job}", sample=0))
        except EpisodesStopped:
            stopped.append(job)
            raise
        return job

    assert run_episodes(lambda j, p: play(j, p, 12), range(6), Turns, workers=2) == list(range(6))
    turns.clear()
    failing.append(3)
    with pytest.raises(RuntimeError, match="sampler process lost"):
        run_episodes(play, range(8), Turns, workers=4)
    assert set(turns) == {0, 1, 2, 3}  # jobs 4-7 never started
    assert sorted(stopped) == [0, 1, 2] and all(turns[j] < 40 for j in (0, 1, 2))  # 40-50 turns had they run on


def test_the_failure_is_raised_not_the_episode_it_stopped_and_the_stop_does_not_wait_for_its_cleanup():
    # Episode 0's turn fails and its cleanup (closing its sandbox) lasts until episode 1 has ended;
    # episode 1 takes its next turn only after the failure. It must be stopped there, and the caller
    # must get episode 0's error although episode 1's EpisodesStopped comes back first.
    from types import SimpleNamespace

    from rlmix.agentic.run import EpisodesStopped, run_episodes

    second_started, failed, second_over = threading.Event(), threading.Event(), threading.Event()
    second = []

    class Policy:
        def __init__(self, job):
            self.job = job

        def act(self, transcript):
            if self.job == 0:
                failed.set()
                raise RuntimeError("sampler process lost")

    def play(job, policy):
        transcript = SimpleNamespace(task_id=f"t{job}", sample=0)
        if job == 0:
            try:
                assert second_started.wait(10)
                policy.act(transcript)
            finally:
                assert second_over.wait(10)  # the sandbox closes slowly
        try:
            second_started.set()
            assert failed.wait(10)
            policy.act(transcript)
            second.append("played on")
        except EpisodesStopped:
            second.append("stopped")
            raise
        finally:
            second_over.set()

    with pytest.raises(RuntimeError, match="sampler process lost"):
        run_episodes(play, [0, 1], Policy, workers=2)
    assert second == ["stopped"]


def test_a_task_drawn_twice_in_a_request_gets_samples_of_its_own():
    """Harbor task sets draw with replacement; a turn's seed comes from the task, the sample and the
    turn, so a second group of the same task numbered 0.. again drew the first group's episodes."""
    from types import SimpleNamespace

    from rlmix.agentic.train import episode_jobs

    task_set = SimpleNamespace(harbor_task=lambda problem: SimpleNamespace(task_id=problem))
    jobs = episode_jobs(task_set, ("c", "b", "a", "b"), (0, 1, 2, 3), 2)
    assert [(j.task.task_id, j.sample, j.group_id) for j in jobs] == [
        ("c", 0, 0), ("c", 1, 0), ("b", 0, 1), ("b", 1, 1), ("a", 0, 2), ("a", 1, 2), ("b", 2, 3), ("b", 3, 3)]
