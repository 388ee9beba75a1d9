"""Fault injection through the real CLI: killed actors, a killed driver, signals, non-finite steps.

Each test starts ``rlmix train`` in its own session, waits for a condition on disk (never a fixed
sleep), injects the fault into a process of that session only, and checks what the run left
behind. docs/reliability.md maps each fault to its test here.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

RLMIX = str(Path(sys.executable).with_name("rlmix"))
DEADLINE_S = 600  # generous: a loaded 2-core machine starts Ray and the actors slowly
SMOKE = ["+experiment=smoke", "logger=disabled"]


class Run:
    """One ``rlmix train`` process in its own session; every process it starts is cleaned up."""

    def __init__(self, tmp_path: Path, *args: str):
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([RLMIX, "train", *args], cwd=tmp_path, stdout=out, stderr=err,
                                         start_new_session=True)

    def wait_for(self, condition, what: str, running: bool = True) -> None:
        """Wait until ``condition()``; fails once the deadline passes, or (``running``) if the run ends first."""
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert not running or self.alive(), f"exited {self.proc.poll()} before {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.text()}"
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def hold_inside(self, run_dir: Path, method: str, after_steps: int, what: str) -> int:
        """Once ``after_steps`` steps are logged, stop (SIGSTOP) a process of this run that is running
        ``method`` (``"<Actor>.<method>"``) and is seen still inside it once stopped; returns its pid.
        Held there it can neither finish that call nor start another, so a fault lands where it is meant."""
        held: list[int] = []

        def inside() -> bool:
            if len(rows(run_dir)) < after_steps:
                return False
            for pid in actor_pids(self.proc.pid, method):
                os.kill(pid, signal.SIGSTOP)
                if title(pid) == f"ray::{method}":  # not a call that just ended
                    held.append(pid)
                    return True
                os.kill(pid, signal.SIGCONT)
            return False

        self.wait_for(inside, what)
        return held[0]

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=DEADLINE_S)
        finally:
            self.kill_session()

    def kill_session(self) -> None:
        """SIGKILL whatever is left of this run's session (Ray's processes after a driver kill)."""
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def text(self) -> str:
        return self.out.read_text()[-3000:] + self.err.read_text()[-3000:]


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def actor_pids(sid: int, actor: str) -> list[int]:
    """Processes of this session whose title is Ray's ``ray::<actor>...``."""
    return [pid for pid in session_pids(sid) if title(pid).startswith(f"ray::{actor}")]


def title(pid: int) -> str:
    """A process's title (Ray's ``ray::<Actor>[.<method>]``); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def complete(run_dir: Path) -> list[int]:
    from rlmix.assembly.checkpoints import CHECKPOINTS, problem, step_of

    dirs = (run_dir / CHECKPOINTS).glob("step_*")
    return sorted(step_of(p) for p in dirs if not problem(p))


def test_a_killed_sampler_is_restarted_and_every_step_is_trained_once(tmp_path):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=16", f"hydra.run.dir={run_dir}")
    # Killed in the middle of a request (Ray titles an actor's process ray::<Actor>.<method> while the
    # method runs): an idle sampler's death costs no request, so nothing would be re-issued.
    # Held inside generate before the kill: a request that ended between the look and the kill would
    # leave nothing to re-issue.
    generating = run.hold_inside(run_dir, "SamplerWorker.generate", 1, "a sampler generating after the first step")
    os.kill(generating, signal.SIGKILL)
    assert run.finish() == 0, run.text()
    got = rows(run_dir)
    assert [r["step"] for r in got] == list(range(1, 17))
    assert summary(run_dir)["fault"]["requests_reissued"] >= 1  # the dead actor's request was served again
    assert summary(run_dir)["status"] in ("completed", "collapsed")  # the smoke toy may collapse: not a fault
    assert "sampler " in run.text() and " died " in run.text()  # the warning (logged to the console)


def test_a_sampler_killed_while_idle_is_restarted_and_costs_no_request(tmp_path):
    """Synchronous training (max_staleness=0) starts no request while the trainer trains, so a sampler
    is idle for as long as the trainer is held inside a step (SIGSTOP). Killed then, its death costs
    no request: the re-created process, which has served nothing, refuses the next one before
    generating, and the driver counts a restart. (Whether the killed process had been sent weights
    by then depends on which sampler served steps 1 and 2; the refusal does not.)"""
    run_dir = tmp_path / "run"
    steps = 40  # room to catch the trainer inside a 0.2 s step under load: 8 were sometimes all missed
    run = Run(tmp_path, *SMOKE, f"loop.steps={steps}", "loop.max_staleness=0", f"hydra.run.dir={run_dir}")
    stopped = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    try:
        samplers = actor_pids(run.proc.pid, "SamplerWorker")
        assert len(samplers) == 2 and all(title(p) == "ray::SamplerWorker" for p in samplers), samplers
        os.kill(samplers[0], signal.SIGKILL)

        # Ray re-creates it before the step ends, so the next request meets the new process.
        def restarted() -> bool:
            now = actor_pids(run.proc.pid, "SamplerWorker")
            return samplers[0] not in now and len(now) == 2 and all(title(p) == "ray::SamplerWorker" for p in now)

        run.wait_for(restarted, "Ray restarting the sampler")
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert run.finish() == 0, run.text()
    assert [r["step"] for r in rows(run_dir)] == list(range(1, steps + 1))
    fault = summary(run_dir)["fault"]
    assert fault == {"sampler_restarts": 1, "requests_reissued": 0, "trainer_restarts": 0}, fault
    assert "was restarted by Ray while idle" in run.out.read_text() + run.err.read_text()


def test_a_killed_driver_resumes_from_the_newest_complete_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    common = [*SMOKE, "loop.checkpoint_every=2"]
    first = Run(tmp_path, *common, "loop.steps=200", f"hydra.run.dir={run_dir}")
    first.wait_for(lambda: len(complete(run_dir)) >= 2, "two complete checkpoints")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.finish()
    newest, previous = complete(run_dir)[-1], complete(run_dir)[-2]
    weights = run_dir / "checkpoints" / f"step_{newest}" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the newest checkpoint, cut short on disk
    total = newest + 3
    again = Run(tmp_path, *common, f"loop.steps={total}", f"resume={run_dir}")  # no hydra.run.dir: in place
    assert again.finish() == 0, again.text()
    out = again.out.read_text()
    assert f"skipping step_{newest}: model.safetensors is truncated" in out
    assert f"from step_{previous} at step {previous}" in out
    assert [r["step"] for r in rows(run_dir)] == list(range(1, total + 1))
    assert summary(run_dir)["status"] in ("completed", "collapsed") and summary(run_dir)["steps"] == total
    assert not (tmp_path / "outputs").exists()  # the resumed run wrote into its own directory


@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],  # Ctrl-C reaches Ray's processes too
    ids=["ctrl_c", "sigterm"],
)
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_exits_128_plus_n(tmp_path, signum, to_group, code):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: len(rows(run_dir)) >= 2, "two steps")
    (os.killpg if to_group else os.kill)(run.proc.pid, signum)
    assert run.finish() == code, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == signum.name
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"]
    assert f"resume={run_dir}" in run.err.read_text()
    assert "Traceback" not in run.text()


def test_a_sigterm_to_the_whole_group_still_lets_a_long_step_finish_and_be_saved(tmp_path):
    """``timeout``, ``kill -- -PGID`` and schedulers signal every process of the group, Ray's own
    processes (its raylet, which would end every actor) included. These hold the signal blocked, so
    a step that takes long (the trainer is held inside one) still finishes and is saved."""
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    raylet = next(pid for pid in session_pids(run.proc.pid) if title(pid).endswith("/raylet"))
    os.killpg(run.proc.pid, signal.SIGTERM)
    # Either the raylet acted on the signal (it is gone, and the actors with it) or it holds it pending.
    run.wait_for(lambda: not title(raylet) or pending(raylet, signal.SIGTERM), "the raylet to get the SIGTERM")
    assert title(raylet), "the raylet ended on the group's SIGTERM"
    os.kill(held, signal.SIGCONT)
    assert run.finish() == 143, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGTERM"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    assert "died" not in run.text() and "Traceback" not in run.text()


def test_a_sigterm_to_every_process_of_the_run_still_lets_the_step_finish_and_be_saved(tmp_path):
    """systemd's default stop and Slurm's ``scancel`` signal every process of the job one by one,
    the actors too. The actors leave it to the driver: the step in flight (the trainer is held inside
    one) finishes and is saved, and the driver ends them."""
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    for pid in session_pids(run.proc.pid):
        os.kill(pid, signal.SIGTERM)
    time.sleep(1)  # an actor that would end on it has by now
    os.kill(held, signal.SIGCONT)
    assert run.finish() == 143, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGTERM"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    assert result["fault"] == {"sampler_restarts": 0, "requests_reissued": 0, "trainer_restarts": 0}, result["fault"]
    assert "died" not in run.text() and "Traceback" not in run.text()
    assert "SIGTERM to actor process" in (run_dir / "workers.log").read_text()


def test_a_terminal_that_closes_lets_the_step_finish_and_be_saved(tmp_path):
    """A closed terminal window or ssh connection: the shell gets SIGHUP and sends it on to its
    jobs, here the run's whole process group, Ray's processes included; every write to the terminal
    fails from then on. The run stops as on SIGTERM: the step in flight (the trainer is held inside
    one) finishes and is saved, and the closing line goes to train.log (its exit status, 129, has
    no one left to read it)."""
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=500", f"hydra.run.dir={run_dir}")
    held = run.hold_inside(run_dir, "TrainerWorker.train_step", 2, "the trainer stopped inside step 3 or later")
    raylet = next(pid for pid in session_pids(run.proc.pid) if title(pid).endswith("/raylet"))
    run.hang_up()
    run.wait_for(lambda: not title(raylet) or pending(raylet, signal.SIGHUP), "the raylet to get the SIGHUP")
    assert title(raylet), "the raylet ended on the terminal's SIGHUP"
    os.kill(held, signal.SIGCONT)
    run.finish()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["signal"] == "SIGHUP"
    assert complete(run_dir)[-1] == result["steps"] == rows(run_dir)[-1]["step"] >= 3
    log = (run_dir / "train.log").read_text()
    assert f"interrupted at step {result['steps']} (SIGHUP), checkpoint step_{result['steps']}" in log, log
    assert "died" not in run.text() and "Traceback" not in run.text()


def test_a_terminal_that_closes_while_the_run_starts_leaves_its_line_in_train_log(tmp_path):
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=5", f"hydra.run.dir={run_dir}")
    # Held inside its __init__, the trainer keeps the run in its start-up.
    run.hold_inside(run_dir, "TrainerWorker.__init__", 0, "the trainer stopped while it starts")
    run.hang_up()
    run.finish()
    log = (run_dir / "train.log").read_text()
    assert "interrupted while the run was starting (SIGHUP: stopped at once), nothing trained" in log, log
    assert "Traceback" not in run.text() and not (run_dir / "summary.json").exists()


def test_a_run_started_with_nohup_outlives_its_terminal(tmp_path):
    run_dir = tmp_path / "run"
    run = TerminalRun(tmp_path, *SMOKE, "loop.steps=12", f"hydra.run.dir={run_dir}", nohup=True)
    run.wait_for(lambda: len(rows(run_dir)) >= 2, "two steps")
    run.hang_up()
    run.finish()
    result = summary(run_dir)
    assert result["status"] in ("completed", "collapsed") and result["steps"] == 12, result["status"]
    assert "SIGHUP" not in run.text()


class TerminalRun(Run):
    """``rlmix train`` (under ``nohup``: ``nohup=True``) typed into an interactive shell on a terminal
    of its own (a pseudo-terminal); ``hang_up`` closes the terminal as a closed window or ssh
    connection does. ``proc`` is the
    shell, whose session holds the run's processes; ``finish`` waits for the run to end."""

    def __init__(self, tmp_path: Path, *args: str, nohup: bool = False):
        self.log, self.output, self.driver = tmp_path / "run" / "train.log", bytearray(), 0
        self.master, terminal = os.openpty()
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], cwd=tmp_path, stdin=terminal,
                                     stdout=terminal, stderr=terminal, env=os.environ | {"PS1": "$ "},
                                     start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(terminal)
        os.write(self.master, shlex.join(["nohup"] * nohup + [RLMIX, "train", *args]).encode() + b"\n")
        self.reading = True
        self.reader = threading.Thread(target=self._read, daemon=True)  # a full terminal would block the run
        self.reader.start()

    def _read(self) -> None:
        while self.reading:
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    return

    def alive(self) -> bool:
        if not self.driver:  # the shell's child: the job it started
            self.driver = next((pid for pid in session_pids(self.proc.pid) if parent(pid) == self.proc.pid), 0)
        return bool(title(self.driver)) if self.driver else self.proc.poll() is None

    def hang_up(self) -> None:
        assert self.alive()
        self.reading = False
        self.reader.join()
        os.close(self.master)

    def finish(self) -> None:
        try:
            self.wait_for(lambda: not self.alive(), "the run to end", running=False)
        finally:
            self.kill_session()

    def text(self) -> str:
        log = self.log.read_text()[-3000:] if self.log.exists() else ""
        return self.output.decode(errors="replace")[-3000:] + log


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def pending(pid: int, signum: int) -> bool:
    """Whether signal ``signum`` waits, blocked, on process ``pid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone
        return False
    shared = int(status.split("ShdPnd:")[1].split()[0], 16)
    return bool(shared & (1 << (signum - 1)))


def test_a_second_ctrl_c_stops_at_once_quietly_and_names_the_newest_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # W&B on (offline), as a user runs it: its service process gets the Ctrl-C too.
    run = Run(tmp_path, "+experiment=smoke", "loop.steps=500", "loop.checkpoint_every=2", f"hydra.run.dir={run_dir}")
    # The step in flight cannot finish while the trainer is held, so the second Ctrl-C lands inside it.
    run.hold_inside(run_dir, "TrainerWorker.train_step", 3, "the trainer stopped inside step 4 or later")
    saved = complete(run_dir)[-1]
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait_for(lambda: "send it again to stop at once" in run.text(), "the first Ctrl-C's line")
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 130, run.text()
    result = summary(run_dir)
    assert result["status"] == "interrupted" and result["stopped_at_once"] and result["signal"] == "SIGINT"
    assert result["steps"] == rows(run_dir)[-1]["step"] and result["checkpoint"] == str(run_dir / "checkpoints" / f"step_{saved}")
    err = run.err.read_text()
    assert "stopped at once" in err and f"resume={run_dir}" in err, err
    assert "Traceback" not in run.text() and "Connection lost" not in run.text()


@pytest.mark.parametrize(
    ("signum", "to_group", "code"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)], ids=["ctrl_c", "sigterm"],
)
def test_a_signal_while_the_run_starts_stops_it_at_once_with_one_line(tmp_path, signum, to_group, code):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=5", f"hydra.run.dir={run_dir}")
    # Held inside its __init__, the trainer keeps the run in its start-up: waiting for it would never end.
    run.hold_inside(run_dir, "TrainerWorker.__init__", 0, "the trainer stopped while it starts")
    (os.killpg if to_group else os.kill)(run.proc.pid, signum)
    assert run.finish() == code, run.text()
    err = run.err.read_text()
    assert f"interrupted while the run was starting ({signum.name}: stopped at once), nothing trained" in err, err
    assert "start again with: rlmix train" in err and "step in flight" not in err, err
    assert "Traceback" not in run.text() and not (run_dir / "summary.json").exists()


def test_a_run_whose_steps_are_all_non_finite_fails(tmp_path, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    poisoned = tmp_path / "nan_model"
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))  # every logit NaN, in the samplers and the trainer
    model.save_pretrained(poisoned)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_llama_dir / name).exists():
            (poisoned / name).write_bytes((tiny_llama_dir / name).read_bytes())
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=10", f"model.path={poisoned}", f"hydra.run.dir={run_dir}")
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and result["steps"] == 3  # monitor.nonfinite.count
    assert "non-finite" in result["error"]
    errors = [line for line in run.err.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite" in errors[0]


def test_a_killed_trainer_is_restarted_from_the_newest_checkpoint_and_the_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    steps = 40  # room to catch the trainer inside a 0.2 s step under load
    run = Run(tmp_path, *SMOKE, f"loop.steps={steps}", "loop.checkpoint_every=3", f"hydra.run.dir={run_dir}")
    # Killed inside a step after step 5: the driver seals a step's checkpoint before it starts the
    # next step, so while the trainer is held inside one (SIGSTOP) the newest checkpoint is fixed.
    # Read before a bare kill, it could be overtaken by the next one (steps take ~0.2 s).
    stopped = run.hold_inside(run_dir, "TrainerWorker.train_step", 5, "the trainer stopped inside step 6 or later")
    saved = complete(run_dir)[-1]
    os.kill(stopped, signal.SIGKILL)
    assert run.finish() == 0, run.text()
    result = summary(run_dir)
    assert result["status"] in ("completed", "collapsed") and result["steps"] == steps  # the smoke toy may collapse
    assert result["fault"]["trainer_restarts"] == 1
    assert [r["step"] for r in rows(run_dir)] == list(range(1, steps + 1))  # the steps after the checkpoint, once
    assert f"restarted it (1 of 3) from checkpoint step_{saved}" in run.out.read_text()
    assert "Traceback" not in run.text()


def test_a_trainer_dead_past_max_restarts_fails_and_offers_only_commands_that_work(tmp_path):
    """No restart allowed and no checkpoint written: the run fails in one line that says how to
    start again, and the closing block lists neither ``rlmix eval`` nor ``resume=``."""
    run_dir = tmp_path / "run"
    off = ["trainer.max_restarts=0", "loop.checkpoint_every=0", "loop.checkpoint_every_min=0"]
    run = Run(tmp_path, *SMOKE, "loop.steps=500", *off, f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: rows(run_dir) and actor_pids(run.proc.pid, "TrainerWorker"), "the first step")
    os.kill(actor_pids(run.proc.pid, "TrainerWorker")[0], signal.SIGKILL)
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and "trainer died" in result["error"] and not result["resumable"]
    errors = [line for line in run.err.read_text().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "trainer.max_restarts" in errors[0], errors
    assert errors[0].endswith("start again with: rlmix train " + " ".join([*SMOKE, "loop.steps=500", *off]))
    lines = run.out.read_text().splitlines()
    assert lines[lines.index("next:") + 1:] == [
        "  rlmix report run", "  rlmix train " + " ".join([*SMOKE, "loop.steps=500", *off])]
    assert "Traceback" not in run.text()


def test_a_stopped_trainer_trips_the_watchdog_which_names_it(tmp_path):
    run_dir = tmp_path / "run"
    run = Run(tmp_path, *SMOKE, "loop.steps=500", "loop.step_timeout_s=15", f"hydra.run.dir={run_dir}")
    run.wait_for(lambda: rows(run_dir) and actor_pids(run.proc.pid, "TrainerWorker"), "the first step")
    os.kill(actor_pids(run.proc.pid, "TrainerWorker")[0], signal.SIGSTOP)  # hangs, does not die
    assert run.finish() == 1, run.text()
    result = summary(run_dir)
    assert result["status"] == "failed" and "waiting on the trainer" in result["error"]
