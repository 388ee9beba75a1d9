"""The model-backed policy adapter and the episode token record, with a fake Sampler and tokenizer."""

from __future__ import annotations

import pytest
import torch

from rlmix.agentic.actions import SYSTEM_PROMPT
from rlmix.agentic.episode import EpisodeLimits, run_episode
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from rlmix.agentic.policy import Message, ModelPolicy
from rlmix.tasks.chat import HeaderFormat
from rlmix.agentic.records import episodes_to_rollouts
from rlmix.agentic.sandbox import snapshot_baseline
from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts, SamplingParams, concat_rollouts
from rlmix.samplers.base import Sampler
from tests.test_agentic_fixtures import FIX, SUBMIT, TRUSTED, make_task


class CharTokenizer:
    """One token per character (id = code point): encode/decode round-trip exactly."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in token_ids)


class ScriptedSampler:
    """Outside the unit: a Sampler that 'generates' fixed replies, log q(token i) = -(i + 1) / 100."""

    pool = "fake"

    def __init__(self, replies: list[str], routed: bool = False):
        self.replies, self.prompts, self.params = replies, [], []
        self.routed = routed  # record "experts" (call number, position) at each fed position, as an MoE pool does

    @property
    def version(self) -> int:
        return 7

    def load_weights(self, weights, version: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def generate(self, prompts, params: SamplingParams) -> Rollouts:
        self.prompts.append(list(prompts[0]))
        self.params.append(params)
        full = [ord(c) for c in self.replies[len(self.prompts) - 1]]
        ids = full[: params.max_new_tokens]
        T = len(ids)
        routes = None
        if self.routed:  # (1, P + T + 2, M=1, k=2); the last generated token and the padding have none
            fed = len(prompts[0]) + T - 1
            routes = torch.full((1, len(prompts[0]) + T + 2, 1, 2), -1, dtype=torch.int16)
            routes[0, :fed, 0, 0], routes[0, :fed, 0, 1] = len(self.prompts) - 1, torch.arange(fed)
        return Rollouts(
            prompt_ids=torch.tensor([prompts[0]]), prompt_lens=torch.tensor([len(prompts[0])]),
            completion_ids=torch.tensor([ids + [0, 0]]), mask=torch.tensor([[True] * T + [False, False]]),
            sampler_logprobs=torch.tensor([[-(i + 1) / 100 for i in range(T)] + [0.0, 0.0]]),
            policy_version=torch.tensor([self.version]), pool=(self.pool,),
            finish_reason=(FINISH_STOP if len(ids) == len(full) else FINISH_LENGTH,), routed_experts=routes)


def _episode(tmp_path, replies, max_total_tokens, routed: bool = False):
    make_task(tmp_path / "tasks", "calc")
    task = load_tasks(tmp_path / "tasks")["calc"]
    sampler = ScriptedSampler(replies, routed)
    policy = ModelPolicy(CharTokenizer(), sampler, SamplingParams(max_new_tokens=200))
    sandbox = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED).start(task, network=False)
    try:
        snapshot_baseline(sandbox)
        limits = EpisodeLimits(max_turns=5, turn_timeout_s=10.0, agent_timeout_s=60.0,
                               max_total_tokens=max_total_tokens, max_format_errors=2, max_output_chars=300)
        return run_episode(task, 0, policy, sandbox, limits), sampler, task
    finally:
        sandbox.close()


def test_fake_sampler_satisfies_the_protocol():
    assert isinstance(ScriptedSampler([]), Sampler)


def test_token_record_masks_policy_tokens_and_is_never_retokenised(tmp_path):
    episode, sampler, task = _episode(tmp_path, [f"I will patch it. {FIX}", SUBMIT], max_total_tokens=10_000)
    assert episode.end_reason == "submit" and len(sampler.prompts) == 2
    chat, t = HeaderFormat(), episode.tokens
    first = chat.render([Message("system", SYSTEM_PROMPT), Message("user", task.instruction)]) + "<|assistant|>\n"
    assert sampler.prompts[0] == [ord(c) for c in first] and t.prompt_len == len(first)
    # The second prompt extends the first by exactly the generated tokens plus the rendered observation.
    gen0 = [ord(c) for c in f"I will patch it. {FIX}"]
    obs = chat.render([Message("tool", episode.turns[0].observation)]) + "<|assistant|>\n"
    assert sampler.prompts[1] == sampler.prompts[0] + gen0 + [ord(c) for c in obs]
    assert t.ids == sampler.prompts[1] + [ord(c) for c in SUBMIT]
    policy_text = "".join(chr(i) for i, m in zip(t.ids, t.mask) if m)
    assert policy_text == f"I will patch it. {FIX}{SUBMIT}" and not any(t.mask[: t.prompt_len])
    expected_lp = [-(i + 1) / 100 for i in range(len(gen0))] + [-(i + 1) / 100 for i in range(len(SUBMIT))]
    assert [lp for lp, m in zip(t.sampler_logprobs, t.mask) if m] == pytest.approx(expected_lp)
    assert all(lp == 0.0 for lp, m in zip(t.sampler_logprobs, t.mask) if not m)
    assert t.policy_version == 7


def test_episodes_become_rollouts(tmp_path):
    ep, _, _ = _episode(tmp_path, [FIX, SUBMIT], max_total_tokens=10_000)
    short, _, _ = _episode(tmp_path / "b", [SUBMIT], max_total_tokens=10_000)
    r = episodes_to_rollouts([ep, short], rewards=[1.0, 0.0], pad_id=0)
    L0, L1 = len(ep.tokens.ids) - ep.tokens.prompt_len, len(short.tokens.ids) - short.tokens.prompt_len
    assert r.completion_ids.shape == (2, L0) and r.prompt_lens.tolist() == [ep.tokens.prompt_len] * 2
    assert r.mask.sum(dim=1).tolist() == [len(FIX) + len(SUBMIT), len(SUBMIT)]
    assert not r.mask[1, L1:].any() and r.sampler_logprobs[~r.mask].abs().sum() == 0
    assert r.rewards.tolist() == [1.0, 0.0] and r.finish_reason == (FINISH_STOP, FINISH_STOP)
    assert r.group_ids.tolist() == [0, 0] and r.format_ok.tolist() == [True, True]
    assert len(concat_rollouts([r, r], pad_id=0)) == 4


def test_only_episodes_a_budget_cut_short_count_as_cut(tmp_path):
    """``loop.overlong`` filters or penalises finish reason ``length``: an episode out of turns is cut
    short, one that ended on its own malformed actions is not (its reward stays in the loss)."""
    malformed, _, _ = _episode(tmp_path / "a", ["no action here", "none here either"], max_total_tokens=10_000)
    out_of_turns, _, _ = _episode(tmp_path / "b", [FIX] * 5, max_total_tokens=10_000)
    assert (malformed.end_reason, out_of_turns.end_reason) == ("format_errors", "max_turns")
    r = episodes_to_rollouts([malformed, out_of_turns], rewards=[0.0, 0.0], pad_id=0)
    assert r.finish_reason == (FINISH_STOP, FINISH_LENGTH) and r.format_ok.tolist() == [False, True]


def test_an_episodes_expert_record_keeps_each_policy_tokens_own_call(tmp_path):
    """A mixture-of-experts pool's routes: the position that gave a policy token its log-prob keeps
    the routes of the call that drew the token; the prompt and observations those of the last call
    that fed them; the last token, never fed, none."""
    ep, sampler, _ = _episode(tmp_path, [FIX, SUBMIT], max_total_tokens=10_000, routed=True)
    short, _, _ = _episode(tmp_path / "b", [SUBMIT], max_total_tokens=10_000)  # a pool that records none
    r = episodes_to_rollouts([ep, short], rewards=[1.0, 0.0], pad_id=0)
    routes = r.routed_experts
    assert routes.shape == (2, r.prompt_ids.shape[1] + r.completion_ids.shape[1], 1, 2)
    assert (routes[1] == -1).all()
    mask = ep.tokens.mask
    second = len(sampler.prompts[1])  # where the second turn's tokens start
    drew = {p - 1: 0 if p < second else 1 for p, m in enumerate(mask) if m}
    call, position = routes[0, :, 0, 0].tolist(), routes[0, :, 0, 1].tolist()
    last = len(mask) - 1
    for p in range(last):
        assert position[p] == p and call[p] == drew.get(p, 1), p
    assert call[last:] == [-1] * (len(call) - last)
    assert any(call[p] == 0 for p in drew) and call[second - 2] == 1  # an observation after turn 1: call 1


def test_token_budget_ends_the_episode(tmp_path):
    make_task(tmp_path / "probe", "calc")
    chat = HeaderFormat()
    prompt_len = len(chat.render([Message("system", SYSTEM_PROMPT),
                                  Message("user", load_tasks(tmp_path / "probe")["calc"].instruction)])
                     + "<|assistant|>\n")
    budget = prompt_len + len(FIX) + 20  # room for the first reply, not for the observation after it
    episode, sampler, _ = _episode(tmp_path, [FIX, SUBMIT], max_total_tokens=budget)
    assert episode.end_reason == "token_budget"
    assert len(episode.tokens.ids) <= budget
    assert sampler.params[0].max_new_tokens == budget - prompt_len
    assert len(sampler.prompts) == 1  # the second turn found no room to generate
    assert len(episode.turns) == 1 and episode.turns[0].exit_code == 0  # the first command did run
    assert episode.tokens.policy_version == 7


def test_a_last_turn_the_budget_cuts_is_still_an_action(tmp_path):
    """Its tokens are in the record and trained; it used to vanish from the turn log, the actions and
    the format errors."""
    cut = "I think the answer is " + "x" * 60
    _, probe, _ = _episode(tmp_path / "probe", [FIX, cut, SUBMIT], max_total_tokens=10_000)
    budget = len(probe.prompts[1]) + 10  # the second turn gets 10 tokens, and nothing is left after it
    episode, sampler, _ = _episode(tmp_path / "run", [FIX, cut], max_total_tokens=budget)
    assert episode.end_reason == "token_budget" and len(sampler.prompts) == 2
    assert [t.action for t in episode.turns] == ["command", "format_error"]
    assert episode.format_errors == 1 and episode.turns[1].policy_text == cut[:10]
    assert sum(t.policy_tokens for t in episode.turns) == sum(episode.tokens.mask)


def test_model_policy_through_the_entry_point(tmp_path):
    from rlmix.agentic import run_swebench_eval
    from rlmix.config.swebench import SwebenchProConfig
    from tests.test_agentic_fixtures import WRONG_FIX

    make_task(tmp_path / "tasks", "calc")
    sampler = ScriptedSampler([FIX, SUBMIT, WRONG_FIX, SUBMIT])
    policy = ModelPolicy(CharTokenizer(), sampler, SamplingParams(max_new_tokens=100))
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all", turn_timeout_s=10.0)
    summary = run_swebench_eval(cfg, policy, ks=[1, 2], samples=2, out_dir=tmp_path / "run")
    assert summary["sets"]["all"]["pass@1"]["mean"] == 0.5 and summary["sets"]["all"]["pass@2"]["mean"] == 1.0
    # Each sample starts from the same first prompt: no tokens leak from one episode into the next.
    assert sampler.prompts[2] == sampler.prompts[0]
    import json

    last = json.loads((tmp_path / "run" / "episodes" / "calc" / "1.jsonl").read_text().splitlines()[-1])["tokens"]
    assert last["ids"] == sampler.prompts[3] + [ord(c) for c in SUBMIT]
    assert sum(last["mask"]) == len(WRONG_FIX) + len(SUBMIT) and last["policy_version"] == 7


def test_each_turn_and_sample_draws_with_its_own_seed_and_a_rerun_repeats_them(tmp_path):
    """A fixed seed reused for every call drew every turn with the same random numbers (the same
    action again after every observation, identical samples of a task): each turn derives its own."""
    from rlmix.agentic import run_swebench_eval
    from rlmix.config.swebench import SwebenchProConfig
    from tests.test_agentic_fixtures import WRONG_FIX

    make_task(tmp_path / "tasks", "calc")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all", turn_timeout_s=10.0)
    seeds = []
    for rerun in range(2):
        sampler = ScriptedSampler([FIX, SUBMIT, WRONG_FIX, SUBMIT])
        policy = ModelPolicy(CharTokenizer(), sampler, SamplingParams(max_new_tokens=100, seed=5))
        run_swebench_eval(cfg, policy, ks=[1], samples=2, out_dir=tmp_path / f"run{rerun}")
        seeds.append([p.seed for p in sampler.params])
    assert len(set(seeds[0])) == 4 and seeds[1] == seeds[0]


def test_a_real_sampler_draws_two_samples_of_one_task_apart(tmp_path):
    from rlmix.agentic.policy import Transcript
    from rlmix.embedded.minicode_agent.model import build_agent_tokenizer
    from rlmix.samplers.accelerators import resolve_view
    from rlmix.samplers.torch_sampler import TorchSampler
    from tests.agentic_models import tiny_agent_model

    model_dir = tiny_agent_model(tmp_path / "model")
    tokenizer = build_agent_tokenizer()
    sampler = TorchSampler(model_dir, resolve_view("CPU", "fp32"), "eval")
    policy = ModelPolicy(tokenizer, sampler, SamplingParams(max_new_tokens=24, seed=0,
                                                            stop_token_ids=(tokenizer.eos_token_id,)))

    def first_turn(sample: int) -> tuple[int, ...]:
        return policy.act(Transcript("t", sample, [Message("user", "12345>54321?")], tokens_left=400)).token_ids

    assert first_turn(0) == first_turn(0) and first_turn(0) != first_turn(1)
