"""End to end through the local runtime with scripted policies: grading, format errors, pass@k, outputs."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from rlmix.config.swebench import SwebenchProConfig
from rlmix.agentic.grading import grade_patch
from rlmix.agentic.harbor import load_tasks
from rlmix.agentic.local import LocalRuntime
from rlmix.agentic.run import run_sample, run_swebench_eval
from rlmix.agentic.sandbox import InfraError
from rlmix.metrics.written import WRITTEN
from tests.test_agentic_fixtures import FIX, SUBMIT, TRUSTED, WRONG_FIX, ScriptedPolicy, make_task


def _cfg(tmp_path, **kw) -> SwebenchProConfig:
    return SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all", **{"turn_timeout_s": 10.0, **kw})


@pytest.fixture
def one_task(tmp_path):
    make_task(tmp_path / "tasks", "calc")
    return load_tasks(tmp_path / "tasks")["calc"]


def _one(tmp_path, task, script, **kw):
    cfg = _cfg(tmp_path, **kw)
    runtime = LocalRuntime(None, cfg.local_max_procs, None, cfg.turn_timeout_s, trusted=TRUSTED)
    return run_sample(task, 0, ScriptedPolicy(script), runtime, cfg)


def test_correct_policy_passes_and_wrong_patch_fails(tmp_path, one_task):
    good = _one(tmp_path, one_task, [FIX, SUBMIT])
    assert (good.outcome.reward, good.outcome.end_reason, good.outcome.infra_error) == (1.0, "submit", None)
    assert "-    return a - b\n+    return a + b" in good.patch and "test_calc" not in good.patch
    bad = _one(tmp_path, one_task, [WRONG_FIX, SUBMIT])
    assert bad.outcome.reward == 0.0 and "a * b" in bad.patch
    # Doing nothing fails too: the fixture's test really is fail-to-pass.
    assert _one(tmp_path, one_task, [SUBMIT]).outcome.reward == 0.0


def test_policy_that_edits_the_tests_cannot_pass(tmp_path, one_task):
    cheats = [
        "<bash>printf 'print(1)\\n' > test_calc.py</bash>",  # gut the test file
        "<bash>mkdir -p $LOGS_DIR/verifier && echo 1 > $LOGS_DIR/verifier/reward.txt</bash>",  # forge the reward
    ]
    res = _one(tmp_path, one_task, [*cheats, SUBMIT])
    assert "test_calc.py" in res.patch  # the edit was captured ...
    assert res.outcome.reward == 0.0  # ... and left out when grading
    # The same test edit next to a real fix still passes: only the test file is reset.
    assert _one(tmp_path, one_task, [cheats[0], FIX, SUBMIT]).outcome.reward == 1.0
    # Wrecking the repository's history is a failure, not an infrastructure problem to be excused.
    wreck = _one(tmp_path, one_task, [FIX, "<bash>rm -rf .git</bash>", SUBMIT])
    assert (wreck.outcome.reward, wreck.outcome.infra_error) == (0.0, None) and wreck.outcome.patch_error


def test_observations_and_state_persist_through_files(tmp_path, one_task):
    policy = ScriptedPolicy(["<bash>echo hi > note.txt; python3 test_calc.py</bash>", "<bash>cat note.txt</bash>",
                             SUBMIT])
    cfg = _cfg(tmp_path)
    run_sample(one_task, 0, policy, LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED), cfg)
    first, second = policy.seen[1][-1], policy.seen[2][-1]
    assert first.role == "tool" and first.text.startswith("[exit code 1]") and "fail-to-pass" in first.text
    assert second.text == "[exit code 0]\nhi\n"
    assert policy.seen[0][1].text.startswith("add(2, 3) returns -1")


def test_malformed_actions_are_counted_and_end_the_episode(tmp_path, one_task):
    res = _one(tmp_path, one_task, ["I would fix it.", "<bash>a</bash><bash>b</bash>", "<bash> </bash>", FIX],
               max_format_errors=3)
    o = res.outcome
    assert (o.end_reason, o.format_errors, o.actions, o.reward) == ("format_errors", 3, 3, 0.0)
    assert [t.action for t in res.episode.turns] == ["format_error"] * 3
    assert "2 <bash> blocks" in res.episode.turns[1].observation


@pytest.mark.slow  # waits out its time limits: seconds
def test_hung_command_hits_its_time_limit(tmp_path, one_task):
    # A background child holds the output pipe open too: the whole process group must go.
    res = _one(tmp_path, one_task, ["<bash>(sleep 987 &); sleep 987</bash>", FIX, SUBMIT], turn_timeout_s=1.0)
    turn = res.episode.turns[0]
    assert turn.timed_out and turn.exit_code == -1 and 1.0 <= turn.duration_s < 6.0
    assert turn.observation.startswith("[timed out after 1 s (killed)]")
    assert res.outcome.reward == 1.0  # the episode went on after the killed command
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline(p) == "sleep 987"]


def _cmdline(p: Path) -> str:
    try:
        return p.read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@pytest.mark.slow  # waits out its time limits: seconds
def test_max_turns_and_agent_timeout(tmp_path, one_task):
    many = _one(tmp_path, one_task, ["<bash>true</bash>"] * 10, max_turns=3)
    assert (many.outcome.end_reason, many.outcome.actions) == ("max_turns", 3)
    slow = _one(tmp_path, one_task, ["<bash>sleep 0.6</bash>"] * 10, agent_timeout_s=1.0)
    assert slow.outcome.end_reason == "agent_timeout" and slow.outcome.actions == 2
    # A command may not outlive the agent phase: it is cut at the agent timeout, not the turn timeout.
    hung = _one(tmp_path, one_task, ["<bash>sleep 30</bash>"] * 3, agent_timeout_s=1.5, turn_timeout_s=20.0)
    assert hung.episode.turns[0].timed_out and hung.episode.turns[0].duration_s < 5.0
    assert hung.outcome.end_reason == "agent_timeout" and hung.outcome.actions == 1


class FlakyRuntime:
    """A real LocalRuntime whose first ``failures`` starts fail like a dying container engine."""

    def __init__(self, failures: int):
        self.inner, self.failures, self.starts = LocalRuntime(None, 512, None, 10.0, trusted=TRUSTED), failures, 0

    def check(self, task):
        return self.inner.check(task)

    def prepare(self, task):
        self.inner.prepare(task)

    def start(self, task, network, proc=True):
        self.starts += 1
        if self.starts <= self.failures:
            raise InfraError("engine went away")
        return self.inner.start(task, network, proc)


def test_infra_failures_are_retried_then_reported_not_scored(tmp_path, one_task):
    patch = _one(tmp_path, one_task, [FIX, SUBMIT]).patch
    flaky = FlakyRuntime(failures=2)
    g = grade_patch(one_task, patch, flaky, retries=2)
    assert (g.reward, g.infra_error, g.attempts) == (1.0, None, 3)
    dead = grade_patch(one_task, patch, FlakyRuntime(failures=99), retries=1)
    assert (dead.infra_error, dead.attempts) == ("engine went away", 2)
    res = run_sample(one_task, 0, ScriptedPolicy([FIX, SUBMIT]), FlakyRuntime(failures=99), _cfg(tmp_path))
    assert res.outcome.end_reason == "infra_error" and res.outcome.infra_error == "engine went away"


def _script(task_id: str, sample: int) -> list[str]:
    """Task a: samples 0-1 fix it, 2 writes a wrong patch, 3 never writes an action. b: always wrong. c: always right."""
    if task_id == "c" or (task_id == "a" and sample < 2):
        return [FIX, SUBMIT]
    if task_id == "a" and sample == 3:
        return ["no action"] * 5
    return [WRONG_FIX, SUBMIT]


@pytest.mark.slow
def test_run_directory_pass_at_k_and_subset(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    (tmp_path / "hard.txt").write_text("a\nb\n")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="hard2", subset_file=str(tmp_path / "hard.txt"),
                            expected_subset_size=2, eval_all_tasks=True, max_format_errors=2)
    lines: list[str] = []
    out = tmp_path / "run"
    run = RecordingRun()
    summary = run_swebench_eval(cfg, ScriptedPolicy(_script), ks=[1, 2, 4], samples=4, out_dir=out,
                                progress=lines.append, wandb_run=run, groups={"easy": ["c", "b"], "none": ["z"]})
    assert len(lines) == 12 and lines[-1].startswith("[12/12] c #3: reward 1")
    # Hand-computed: (n, c) = a (4, 2), b (4, 0), c (4, 4). pass@2 for a = 1 - C(2,2)/C(4,2) = 5/6.
    per_task = {1: [0.5, 0.0, 1.0], 2: [5 / 6, 0.0, 1.0], 4: [1.0, 0.0, 1.0]}
    for name, idx in (("all", [0, 1, 2]), ("hard2", [0, 1]), ("easy", [2, 1])):
        for k, vals in per_task.items():
            v = [vals[i] for i in idx]
            mean = sum(v) / len(v)
            stderr = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v) / len(v))
            got = summary["sets"][name][f"pass@{k}"]
            assert got["mean"] == pytest.approx(mean) and got["stderr"] == pytest.approx(stderr), (name, k)
    assert summary["sets"]["none"]["num_tasks"] == 0 and summary["sets"]["none"]["pass@1"]["mean"] is None
    # Format errors: a#3 made 2 malformed actions out of 2; the 11 other episodes made 2 actions each.
    assert summary["format/error_rate"] == pytest.approx(2 / 24)
    assert summary["format/episode_end_frac"] == pytest.approx(1 / 12)
    assert summary["infra_failures"]["count"] == 0
    assert json.loads((out / "eval.json").read_text()) == summary
    assert WRITTEN[-1] == out / "eval.json"  # so a signal during the W&B upload after it names it (rlmix.cli)
    task_a = json.loads((out / "tasks" / "a.json").read_text())
    assert (task_a["n"], task_a["c"]) == (4, 2)
    log = [json.loads(x) for x in (out / "episodes" / "a" / "3.jsonl").read_text().splitlines()]
    assert [x.get("action") for x in log[:-1]] == ["format_error", "format_error"]
    assert log[-1]["outcome"]["end_reason"] == "format_errors"
    (logged,) = run.logged
    assert logged["eval/tasks"].data == [["a", True, 4, 2, 0.5, 0], ["b", True, 4, 0, 0.0, 0], ["c", False, 4, 4, 1.0, 0]]
    assert logged["eval/hard2/pass@4"] == 0.5 and logged["eval/all/pass@1_stderr"] == summary["sets"]["all"]["pass@1"]["stderr"]


class RecordingRun:
    """Outside the unit: stands in for a wandb run object (only ``log`` is used)."""

    def __init__(self):
        self.logged: list[dict] = []

    def log(self, data: dict) -> None:
        self.logged.append(data)


def test_subset_only_evaluates_the_subset(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    (tmp_path / "hard.txt").write_text("c\n")
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="hard1", subset_file=str(tmp_path / "hard.txt"),
                            expected_subset_size=1)
    summary = run_swebench_eval(cfg, ScriptedPolicy(_script), ks=[1], samples=1, out_dir=tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "tasks").iterdir()) == ["c.json"]
    assert summary["sets"]["hard1"]["pass@1"]["mean"] == 1.0 and summary["sets"]["all"]["num_tasks"] == 1


def test_checked_tasks_are_played_as_given_and_the_record_is_in_eval_json(tmp_path):
    """``rlmix eval`` checks the runtime and tasks once (``playable``) and hands them over, with what it
    scored (``record``): eval.json is written once, whole."""
    from rlmix.agentic.run import playable

    for t in ("a", "b"):
        make_task(tmp_path / "tasks", t)
    cfg = SwebenchProConfig(tasks_dir=str(tmp_path / "tasks"), trusted=TRUSTED, subset="all")
    play = playable(cfg)
    play = play._replace(tasks=[t for t in play.tasks if t.task_id == "b"])
    summary = run_swebench_eval(cfg, ScriptedPolicy(_script), ks=[1], samples=1, out_dir=tmp_path / "run",
                                play=play, record={"reward": None, "overrides": ["seed=1"]})
    assert sorted(p.name for p in (tmp_path / "run" / "tasks").iterdir()) == ["b.json"]
    written = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert written == summary and written["overrides"] == ["seed=1"] and written["sets"]["all"]["num_tasks"] == 1


class _Threads(ScriptedPolicy):
    """Records the threads its turns were asked from."""

    def __init__(self, script):
        super().__init__(script)
        self.threads: set[str] = set()

    def act(self, transcript):
        self.threads.add(threading.current_thread().name)
        return super().act(transcript)


@pytest.mark.slow
def test_concurrent_episodes_report_what_one_at_a_time_reports_in_task_order(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    cfg = _cfg(tmp_path, max_format_errors=2)
    summaries, lines, threads = [], [], []
    for concurrent in (1, 0):  # one at a time; all twelve at once
        out, policy = tmp_path / f"run{concurrent}", _Threads(_script)
        summaries.append(run_swebench_eval(cfg, policy, ks=[1, 2], samples=4, out_dir=out,
                                           progress=lines.append, concurrent=concurrent))
        assert json.loads((out / "tasks" / "a.json").read_text())["c"] == 2
        threads.append(len(policy.threads))
    assert summaries[1] == summaries[0]
    assert threads == [1, 12]
    assert [line.split("]")[0] for line in lines[12:]] == [f"[{i}/12" for i in range(1, 13)]


class _Failing:
    """A policy whose every turn raises, counting the episodes that reached it."""

    def __init__(self):
        self.calls = 0

    def act(self, transcript):
        self.calls += 1
        raise RuntimeError("policy down")


def test_an_episode_that_raises_ends_the_evaluation_without_starting_the_rest(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    policy = _Failing()
    with pytest.raises(RuntimeError, match="policy down"):
        run_swebench_eval(_cfg(tmp_path), policy, ks=[1], samples=4, out_dir=tmp_path / "run", concurrent=2)
    assert policy.calls < 12
    assert not (tmp_path / "run" / "eval.json").exists()


class _Interrupted(ScriptedPolicy):
    """Ten actions an episode; once every episode is at its first turn, task b's first sample is a Ctrl-C."""

    def __init__(self, episodes: int):
        super().__init__(lambda task_id, sample: ["<bash>true</bash>"] * 9 + [SUBMIT])
        self.all_running = threading.Barrier(episodes, timeout=60)
        self.interrupted = threading.Event()
        self.turns_after: dict[tuple[str, int], int] = {}

    def act(self, transcript):
        episode = (transcript.task_id, transcript.sample)
        if self.interrupted.is_set():
            self.turns_after[episode] = self.turns_after.get(episode, 0) + 1
        if len(transcript.messages) == 2:
            self.all_running.wait()
            if episode == ("b", 0):
                self.interrupted.set()
                raise KeyboardInterrupt
        return super().act(transcript)


@pytest.mark.slow
def test_an_interrupt_ends_the_running_episodes_at_their_next_turn(tmp_path):
    for t in ("a", "b", "c"):
        make_task(tmp_path / "tasks", t)
    policy = _Interrupted(episodes=12)
    with pytest.raises(KeyboardInterrupt):
        run_swebench_eval(_cfg(tmp_path), policy, ks=[1], samples=4, out_dir=tmp_path / "run", concurrent=0)
    # Every episode was running when the interrupt came. An episode already inside its turn then
    # finishes that turn; none starts another (each would take nine more without the stop).
    assert all(n <= 1 for n in policy.turns_after.values()), policy.turns_after
    assert not (tmp_path / "run" / "eval.json").exists()
