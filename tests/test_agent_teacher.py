"""The embedded agent model's teacher: scripted minicode_agent episodes and how they are tokenised."""

from __future__ import annotations

import random

from rlmix.agentic.actions import SUBMIT_ACTION
from rlmix.config.swebench import MiniCodeAgentConfig
from rlmix.embedded.minicode import MiniCode
from rlmix.embedded.minicode_agent import answer_action
from rlmix.embedded.minicode_agent.model import build_agent_tokenizer
from rlmix.embedded.minicode_agent.scripted import MAX_WRONG, scripted_episode, tool_output
from rlmix.embedded.minicode_agent.warmstart import episode_tokens

LEVELS = (1, 2)


def episodes(n: int = 400):
    rng = random.Random(0)
    problems = MiniCode(levels=LEVELS, seed=0).sample(n, seed=1)
    return [(p, scripted_episode(p, LEVELS, rng)) for p in problems]


def tries(messages) -> list[str]:
    return [m.text.split("'")[1] for m in messages if m.role == "assistant" and "./mc" in m.text]


def test_every_episode_answers_and_submits_within_the_tasks_turns():
    for problem, messages in episodes():
        policy = [m.text for m in messages if m.role == "assistant"]
        assert len(policy) <= MiniCodeAgentConfig.max_turns
        assert policy[-1] == SUBMIT_ACTION and policy[-2].startswith("<bash>echo '")
        assert len(set(tries(messages))) == len(tries(messages))  # never the same candidate twice


def test_an_episode_answers_the_reference_once_it_passes_and_its_best_try_when_out_of_tries():
    gave_up = found = 0
    for problem, messages in episodes():
        done = tries(messages)
        answered = [m.text for m in messages if m.role == "assistant"][-2]
        if problem.payload.program in done:
            found += 1
            assert done[-1] == problem.payload.program and answered == answer_action(problem.payload.program)
            assert all(" no" in tool_output(p, problem.payload) for p in done[:-1])
        else:
            gave_up += 1
            assert len(done) == MAX_WRONG
            oks = {p: tool_output(p, problem.payload).count(" ok") for p in done}
            best = answered.split("'")[1]
            assert best in done and oks[best] == max(oks.values())
    assert gave_up and found > gave_up  # both kinds are taught


def test_the_loss_covers_the_policy_tokens_only_and_the_stream_is_the_runtimes():
    tokenizer = build_agent_tokenizer()
    problem, messages = next((p, m) for p, m in episodes() if len(tries(m)) > 1)
    ids, mask = episode_tokens(tokenizer, messages)
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "".join(m.text + tokenizer.eos_token for m in messages if m.role == "assistant")
    assert tokenizer.decode(ids).startswith(tokenizer.bos_token + "<|user|>" + problem.prompt + tokenizer.eos_token)
