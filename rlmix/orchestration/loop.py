"""The fully asynchronous loop (docs/architecture.md, "Process model").

Samplers generate continuously, one request in flight each; finished groups wait in a buffer
tagged with the weight version that produced them; the trainer takes a batch whenever it is
idle and enough groups are ready; after every ``weight_sync_every`` steps it publishes a new
version through the object store (one put per version) and each sampler picks it up with its
next request.

Staleness of a sequence = (trainer version when it is trained) − (version that generated it).
``max_staleness`` bounds it two ways: no request is started whose output could only be trained
too late, and groups that became too stale anyway are dropped (and counted), never trained on.
``max_staleness=0`` therefore reproduces synchronous on-policy training.

``loop.lag`` replaces this timing-dependent schedule by one fixed in the config (rlmix.orchestration.lag):
each request's weights version and sampler follow from its id, so one seed gives one run.

A trainer that dies is replaced (``restart``, rlmix.orchestration.runner.TrainerRestarts) by a new
process at the run's newest checkpoint; the loop goes back to that checkpoint's version and data
position and drops what was generated since, as a resumed run would.

A lost Ray node (``node_lost``: the raylet of the local instance exited) is none of these: every
actor ends with it, and Ray ends the driver (exit 1, nothing told) the moment it next touches the
object store, which lives in the raylet. So the loop waits on results without fetching them, asks
before it takes anything for an actor's death, once every pass and before each of its own reads and
writes of the store, and ends the run at once with ``RunFailed`` naming the node.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import ray

from rlmix.assembly.checkpoints import RunState
from rlmix.assembly.producers import Request
from rlmix.config.schema import LoopConfig, Overlong
from rlmix.errors import RunFailed, TrainerDied
from rlmix.metrics.names import (
    BUFFERED_GROUPS, DROPPED_GROUPS, OVERLONG_FRAC, REQUESTS_REISSUED, SAMPLER_BUSY_FRAC, SAMPLER_RESTARTS,
    SAMPLER_TOKENS_PER_S, STEP_S, TOKENS, TRAINER_IDLE_FRAC, TRAINER_RESTARTS, TRAINER_TOKENS_PER_S,
    UNIFORM_DROPPED_FRAC, WEIGHT_SYNC_S,
)
from rlmix.orchestration.filters import count_groups, filter_part, take_groups
from rlmix.orchestration.lag import LagSchedule, request_of
from rlmix.orchestration.workers import NotHeld, make_request
from rlmix.rollout import Rollouts, concat_rollouts
from rlmix.tasks.base import Task

log = logging.getLogger(__name__)

THROUGHPUT_STEPS = 8  # trailing steps over which sampler throughput is measured
POLL_S = 0.5  # longest wait between checks of a stop request, the watchdog and restarting samplers
PROBE_EVERY_S = 1.0  # how often a restarting sampler is asked whether it is back
NODE_GRACE_S = 0.2  # after an actor's failure, how long its Ray node's end is waited for (AsyncLoop._check_node)


def loop_capacity(loop: LoopConfig) -> int:
    """Groups held ahead of the trainer (finished + in flight)."""
    if loop.max_staleness == 0:
        return loop.groups_per_step  # synchronous: exactly one batch, all from the current version
    return loop.buffer_groups or 2 * loop.groups_per_step


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours a task's name in its error messages


def first_line(err: BaseException) -> str:
    """``Type: first non-empty line of the message`` — a worker's error in one line (a Ray error's
    own cause, the exception the worker raised, where it carries one), without terminal colours."""
    err = getattr(err, "cause", None) or err
    head = next((ln.strip() for ln in ANSI_ESCAPE.sub("", str(err)).splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {head}" if head else type(err).__name__


class NodeLost(RunFailed):
    """The Ray node of the run's processes is gone (``AsyncLoop.node_lost``): the run ends, failed, at once."""


class SlotState(enum.Enum):
    ready = "ready"  # takes requests
    restarting = "restarting"  # died; Ray is starting it again, its request waits in the queue
    resetting = "resetting"  # back with an earlier job's arguments: re-initialised with this job's
    dropped = "dropped"  # died too often or for good; the fleet goes on without it


@dataclass
class SamplerSlot:
    """The driver's view of one sampler actor."""

    name: str
    pool: str
    actor: ray.actor.ActorHandle
    version: int = 0  # the weight version it holds (-1 after a restart: resend)
    inflight: Request | None = None
    state: SlotState = SlotState.ready
    deaths: int = 0
    probe_at: float = 0.0  # restarting: when to next ask whether it is back
    on_cpu: bool = True  # computes on the cores the loop shares out (rlmix.orchestration.cores)
    started: float = 0.0  # when its in-flight request was submitted
    job: int = 0  # the token of the job it serves, sent with every request (workers.NotHeld)
    init: tuple = ()  # this job's (env_vars, *constructor args): what ``reset`` re-initialises it with
    served: bool = False  # a request of this job came back from its process (workers.NotHeld)


@dataclass
class StepReport:
    """What the loop hands to the logger after each trainer step."""

    step: int
    metrics: dict[str, float]
    version: int


@dataclass
class _Window:
    """Timing and throughput accumulated between two trainer steps."""

    start: float = field(default_factory=time.perf_counter)
    idle_s: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)
    dropped_groups: int = 0
    sampler_busy_s: float = 0.0  # summed over samplers: time with a request in flight
    groups: int = 0  # groups collected
    uniform_dropped: int = 0  # of them, dropped for equal rewards (loop.dynamic_sampling)
    completions: int = 0  # completions collected
    overlong: int = 0  # of them, cut at max_new_tokens


class AsyncLoop:
    def __init__(
        self,
        cfg: LoopConfig,
        trainer: ray.actor.ActorHandle,
        samplers: list[SamplerSlot],
        task: Task,
        seed: int,
        pad_id: int,
        start_version: int = 0,
        start_request: int = 0,
        generating: int | None = None,
        idle_lanes: int = 0,
        restart: Callable[[TrainerDied], tuple[ray.actor.ActorHandle, RunState]] | None = None,
        start_faults: RunState | None = None,
        node_lost: Callable[[float], str | None] = lambda grace_s=0.0: None,
    ):
        """``restart``: a new trainer and the run state of the checkpoint it loaded, or RunFailed
        when no restart is left; None: a dead trainer fails the run. ``start_faults``: the run state a
        resumed run starts from, whose fault counters these continue (None: from 0). ``node_lost``:
        why the Ray node the run's processes live on is gone, or None (rlmix.orchestration.session)."""
        self.cfg, self.trainer, self.samplers, self.task = cfg, trainer, samplers, task
        self.restart, self.node_lost = restart, node_lost
        self.seed, self.pad_id = seed, pad_id
        self.version = start_version  # the trainer's current weight version
        self.published = start_version  # the newest version samplers can load
        self.weights_ref: ray.ObjectRef | None = None
        self.next_request = start_request
        self.orphans: deque[Request] = deque()  # requests of samplers that died, served first
        self.refused: set[int] = set()  # of them, ids a restarted sampler refused before generating
        self.buffer: list[Rollouts] = []
        self.capacity = loop_capacity(cfg)
        self.window = _Window()
        self.recent: deque[tuple[float, dict[str, int]]] = deque(maxlen=THROUGHPUT_STEPS)
        self.idle_since: float | None = time.perf_counter()  # None while the trainer trains
        # Cumulative over the run, resumed parts included: fault/* metrics and summary.json's ``fault``.
        self.sampler_restarts = start_faults.sampler_restarts if start_faults else 0
        self.requests_reissued = start_faults.requests_reissued if start_faults else 0
        self.trainer_restarts = start_faults.trainer_restarts if start_faults else 0
        self.discard: set[ray.ObjectRef] = set()  # requests in flight when the trainer was replaced
        self.last_step_at = time.monotonic()
        # CPU-sampler requests generating at once (None: no limit); samplers are offered requests
        # in turn from ``turn`` so a limit below the fleet size still draws from every pool.
        # While the trainer waits for a batch its cores are idle: ``idle_lanes`` more requests may
        # generate then (a request already running when the trainer starts finishes on its own).
        self.generating, self.idle_lanes = generating, idle_lanes
        self.turn = 0
        # loop.lag: each request's version and sampler fixed by its id, and the weights of every
        # version some request still needs (a restarted sampler holds none of them).
        self.schedule: LagSchedule | None = None
        self.versions: dict[int, ray.ObjectRef] = {}
        if cfg.lag is not None:
            self.schedule = LagSchedule(cfg.lag, cfg.groups_per_step // cfg.groups_per_request,
                                        cfg.weight_sync_every, floor=start_version)
            self.next_request = self.schedule.first_request(start_version)  # a checkpoint's, whatever it recorded
            self.weights_ref = trainer.published_weights.remote()
            self.versions[start_version] = self.weights_ref
        elif start_version > 0:  # resume: samplers start from the model dir, so send the checkpoint
            self.weights_ref = trainer.published_weights.remote()

    # -- request bookkeeping -------------------------------------------------------------
    def _groups_ahead(self) -> int:
        buffered = count_groups(self.buffer, self.cfg.group_size)
        requests = sum(1 for s in self.samplers if s.inflight) + len(self.orphans)
        return buffered + requests * self.cfg.groups_per_request

    def _may_start_request(self, training: bool) -> bool:
        if self._groups_ahead() + self.cfg.groups_per_request > self.capacity:
            return False
        if self.cfg.max_staleness is None:
            return True
        # Output of a request started now is trained at the earliest at the version the trainer
        # has once its in-flight step (if any) finishes.
        earliest_train_version = self.version + (1 if training else 0)
        return earliest_train_version - self.published <= self.cfg.max_staleness

    # -- cores: which samplers may start now, and how busy they were ----------------------
    def _in_turn(self) -> list[SamplerSlot]:
        return self.samplers[self.turn:] + self.samplers[:self.turn]

    def _lane_free(self, slot: SamplerSlot, training: bool) -> bool:
        if self.generating is None or not slot.on_cpu:
            return True
        lanes = self.generating + (0 if training else self.idle_lanes)
        return sum(1 for s in self.samplers if s.on_cpu and s.inflight) < lanes

    def _sampler_lanes(self) -> int:
        """Lanes of the samplers still in the fleet (a dropped one serves nothing)."""
        fleet = [s for s in self.samplers if s.state is not SlotState.dropped]
        cpu = sum(1 for s in fleet if s.on_cpu)
        limited = cpu if self.generating is None else min(self.generating, cpu)
        return max(limited + len(fleet) - cpu, 1)

    def _count_busy(self, slot: SamplerSlot, now: float) -> None:
        self.window.sampler_busy_s += now - max(slot.started, self.window.start)

    def _submit(self, slot: SamplerSlot, request: Request, version: int | None = None) -> ray.ObjectRef:
        """Send ``request`` to ``slot`` at weights ``version`` (default: the newest published),
        with those weights when the sampler holds another version."""
        version = self.published if version is None else version
        ref = self.versions.get(version) if self.schedule is not None else self.weights_ref
        weights = ref if slot.version != version else None
        slot.started = time.perf_counter()
        self.turn = (self.samplers.index(slot) + 1) % len(self.samplers)
        held = slot.version if weights is not None and slot.version >= 0 else None
        slot.inflight = request
        if weights is not None:
            slot.version = version
        return slot.actor.generate.remote(request, self.cfg.group_size, weights, version, slot.job, held,
                                          slot.served)

    def _next_request(self, training: bool) -> Request | None:
        if self.orphans:  # already counted in _groups_ahead: re-issue without asking again
            return self._reissue()
        if not self._may_start_request(training):
            return None
        request = make_request(self.task, self.next_request, self.cfg.groups_per_request, self.seed)
        self.next_request += 1
        return request

    def _reissue(self) -> Request:
        """The next request a dead sampler left behind, counted unless it was refused before generating."""
        request = self.orphans.popleft()
        if request.request_id in self.refused:  # nothing of it was generated: not a re-issue
            self.refused.discard(request.request_id)
        else:
            self.requests_reissued += 1
        return request

    def data_position(self, step: int) -> int:
        """The request a checkpoint at trainer version ``step`` records as the next one to issue.

        Free-running: the next one not issued yet (what was out when the run stopped is not
        trained). Under ``loop.lag``: the first one planned for ``step``, since the schedule reads a
        request's step from its id; the next unissued one would shift every later request's planned
        step by the lag, and the run would go on at lag 0.
        """
        return self.next_request if self.schedule is None else self.schedule.first_request(step)

    # -- batches -------------------------------------------------------------------------
    def _drop_stale(self) -> None:
        if self.cfg.max_staleness is None:
            return
        keep = []
        for part in self.buffer:
            if self.version - int(part.policy_version.min()) > self.cfg.max_staleness:
                self.window.dropped_groups += count_groups([part], self.cfg.group_size)
            else:
                keep.append(part)
        self.buffer = keep

    def _take_batch(self) -> Rollouts | None:
        self._drop_stale()
        if count_groups(self.buffer, self.cfg.group_size) < self.cfg.groups_per_step:
            return None
        # Oldest requests first; sorting by request id makes a batch independent of arrival order.
        self.buffer.sort(key=self._request_of)
        if self.schedule is not None and not self._prefix_back():
            return None
        return concat_rollouts(take_groups(self.buffer, self.cfg.groups_per_step, self.cfg.group_size), self.pad_id)

    def _request_of(self, part: Rollouts) -> int:
        return request_of(part, self.cfg.group_size, self.cfg.groups_per_request)

    def _prefix_back(self) -> bool:
        """loop.lag: every request before the batch's last group is back (none still out could
        belong in front of it), so the batch is the same whichever request finished first."""
        count, last = 0, -1
        for part in self.buffer:
            count += count_groups([part], self.cfg.group_size)
            if count >= self.cfg.groups_per_step:
                last = self._request_of(part)
                break
        return all(r > last for r in self._outstanding())

    def _outstanding(self) -> list[int]:
        """Ids of the requests given out and not yet back: in flight, or queued after a sampler died."""
        return [s.inflight.request_id for s in self.samplers if s.inflight is not None] + \
            [r.request_id for r in self.orphans]

    # -- the loop ------------------------------------------------------------------------
    def run(self, steps: int, on_step: Callable[[StepReport], bool], stop: Callable[[], bool] = lambda: False) -> None:
        """Run until ``steps`` trainer steps are done, ``on_step`` returns False, or ``stop()`` is true.

        A stop request lets the step in flight finish (so its metrics and a checkpoint can be
        written) and starts nothing new. Raises ``RunFailed`` when the trainer dies, no sampler is
        left, or no step finishes within ``loop.step_timeout_s``.
        """
        inflight: dict[ray.ObjectRef, SamplerSlot] = {}
        try:
            self._run(steps, on_step, stop, inflight)
        except NodeLost:
            raise
        except Exception as err:  # whatever Ray raised once its node was gone (a reset socket, dead actors)
            self._check_node(err)
            raise
        for ref in inflight:  # leave nothing running into the next job of a sweep
            ray.cancel(ref, force=False)

    def _check_node(self, err: BaseException | None = None) -> None:
        """RunFailed, naming the node, where the Ray node is gone: no actor's fault is to be handled then.
        After an error (``err``) its end is waited for a moment: actors see it before it has exited.

        Asked before the driver reads a rollout or sends a batch, since both go through the object
        store when over Ray's inline size (100 KiB): a store found gone there ends the process in Ray's
        C++ core, before Python hears of it. A node lost during the read itself still ends it so."""
        if (why := self.node_lost(NODE_GRACE_S) if err is not None else self.node_lost()) is not None:
            raise NodeLost(why) from err

    def _run(self, steps: int, on_step: Callable[[StepReport], bool], stop: Callable[[], bool], inflight: dict) -> None:
        probes: dict[ray.ObjectRef, SamplerSlot] = {}
        train_ref: ray.ObjectRef | None = None
        self.last_step_at = time.monotonic()
        while self.version < steps:
            self._check_node()
            stopping = stop()
            if stopping and train_ref is None:
                break
            if not stopping:
                self._fill(inflight, training=train_ref is not None)
                self._probe_restarting(probes)
                if train_ref is None:
                    train_ref = self._start_step()
            waiting = list(inflight) + list(probes) + ([train_ref] if train_ref is not None else [])
            # Every pass, not only an empty poll: requests coming back one after another while no
            # step finishes (every group dropped, say) must not keep the watchdog away.
            self._watchdog(train_ref, inflight)
            ready = ray.wait(waiting, num_returns=1, timeout=POLL_S, fetch_local=False)[0] if waiting else []
            if not ready:
                if not waiting:  # every sampler restarting, nothing to train yet
                    time.sleep(POLL_S)
                continue
            ref = ready[0]
            try:
                if ref is train_ref:
                    train_ref = None
                    self.last_step_at = time.monotonic()
                    report = self._finish_step(ref)
                    self.idle_since = self.window.start  # the trainer waits from here: publishing is the step's
                    if not on_step(report):
                        break
                elif ref in probes:
                    self._probed(ref, probes.pop(ref), probes)
                else:
                    self._collect(ref, inflight.pop(ref))
            except TrainerDied as died:  # in a step, its checkpoint, or the weights samplers were sent
                train_ref = None  # a step in flight on the dead trainer is not waited for
                self._check_node(died)
                self._replace_trainer(died, inflight)

    def _fill(self, inflight: dict, training: bool) -> None:
        """Give idle samplers requests, in turn, as far as the cores, the buffer and staleness allow."""
        if self.schedule is not None:
            self._fill_scheduled(inflight, training)
            return
        for slot in self._in_turn():
            if self._free(slot, training):
                request = self._next_request(training)
                if request is None:
                    return
                inflight[self._submit(slot, request)] = slot

    def _free(self, slot: SamplerSlot, training: bool) -> bool:
        return slot.state is SlotState.ready and slot.inflight is None and self._lane_free(slot, training)

    def _fill_scheduled(self, inflight: dict, training: bool) -> None:
        """loop.lag: request i to sampler i mod n at its scheduled version, once that version is
        published; requests go out in order. A re-issued request (its sampler died) goes to its own
        sampler if that is free, else to any free one: a run with faults is not reproducible."""
        alive = [s for s in self.samplers if s.state is not SlotState.dropped]
        while self.orphans:
            request = self.orphans[0]
            own = alive[self.schedule.sampler(request.request_id, len(alive))]
            slot = next((s for s in [own, *self._in_turn()] if self._free(s, training)), None)
            if slot is None:
                break
            self._reissue()
            inflight[self._submit(slot, request, self.schedule.version(request.request_id))] = slot
        while True:
            i = self.next_request
            version = self.schedule.version(i)
            slot = alive[self.schedule.sampler(i, len(alive))]
            if version > self.published or not self._free(slot, training):
                return
            request = make_request(self.task, i, self.cfg.groups_per_request, self.seed)
            self.next_request += 1
            inflight[self._submit(slot, request, version)] = slot

    def _keep_versions(self) -> None:
        """loop.lag: forget the weights no request still out or to come is scheduled at."""
        oldest = min(self.schedule.version(i) for i in [self.next_request, *self._outstanding()])
        self.versions = {v: ref for v, ref in self.versions.items() if v >= oldest or v == self.published}

    def _start_step(self) -> ray.ObjectRef | None:
        batch = self._take_batch()
        if batch is None:
            return None
        self.window.idle_s += time.perf_counter() - self.idle_since
        self.idle_since = None
        self._check_node()  # a batch of this size goes through the object store (see _check_node)
        return self.trainer.train_step.remote(batch)

    def _watchdog(self, train_ref: ray.ObjectRef | None, inflight: dict) -> None:
        waited = time.monotonic() - self.last_step_at
        if waited <= self.cfg.step_timeout_s:
            return
        if train_ref is not None:
            on = f"the trainer (step {self.version + 1} in flight)"
        else:
            busy = sorted(s.name for s in inflight.values())
            back = (SlotState.restarting, SlotState.resetting)
            names = busy + sorted(f"{s.name} ({s.state.value})" for s in self.samplers if s.state in back)
            on = "samplers " + ", ".join(names) if names else "nothing: no request out, no batch ready"
        raise RunFailed(f"no trainer step finished in {waited:.0f} s (loop.step_timeout_s); waiting on {on}")

    # -- sampler faults ------------------------------------------------------------------
    def _collect(self, ref: ray.ObjectRef, slot: SamplerSlot) -> None:
        request, slot.inflight = slot.inflight, None
        dropped = ref in self.discard  # generated for a trainer that has since been replaced
        self.discard.discard(ref)
        # A request that failed goes back to the queue whole (never half of it): its groups are
        # generated again from the same request id and seed, by whichever sampler is free.
        again = (lambda: None) if dropped else (lambda: self.orphans.appendleft(request))
        self._check_node()  # a rollout is read from the object store (see _check_node)
        try:
            part: Rollouts = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            again()
            if err.actor_id in (None, slot.actor._actor_id.hex()):
                self._died(slot, err)
            elif err.actor_id == self.trainer._actor_id.hex():  # the weights it was sent never came
                raise TrainerDied(f"the trainer died publishing step {self.published}'s weights "
                                  f"({type(err).__name__})") from err
            return  # else a replaced trainer's weights, sent with a request dropped at its replacement
        except ray.exceptions.RayError as err:  # the sampler raised: a bug or bad input, not a fault to retry
            cause = getattr(err, "cause", None) or err
            if isinstance(cause, NotHeld):  # Ray re-created it while idle: a death seen late
                if not dropped:
                    self.refused.add(request.request_id)
                again()
                self._died(slot, cause)
                return
            raise RunFailed(f"sampler {slot.name} failed on request {request.request_id}: {first_line(cause)}") from err
        self._count_busy(slot, time.perf_counter())
        slot.served = True
        if dropped:
            return
        self.window.tokens[slot.pool] = self.window.tokens.get(slot.pool, 0) + part.num_tokens
        filtered = filter_part(part, self.cfg)
        self.window.groups += filtered.groups
        self.window.completions += len(part)
        self.window.uniform_dropped += filtered.dropped
        self.window.overlong += filtered.overlong
        if filtered.part is not None:
            self.buffer.append(filtered.part)

    def _died(self, slot: SamplerSlot, err: Exception) -> None:
        """A death, seen as a failed call or as a refusal (``NotHeld``: Ray restarted it while idle).

        Either way the slot is probed before its next request: what the process holds now
        decides whether it is re-initialised (``_probed``), and the weights go with its next request.
        """
        self._check_node(err)  # not this sampler's death, nor one Ray restarts it from
        slot.deaths += 1
        slot.version = -1  # a restarted actor holds the initial weights: resend
        slot.served = False  # and has served nothing
        gone = isinstance(err, ray.exceptions.ActorDiedError) or slot.deaths > self.cfg.sampler_max_restarts
        if gone:
            self._drop(slot, f"died {slot.deaths} times" if slot.deaths > 1 else "died for good")
            return
        how = f"was restarted by Ray while idle ({err})" if isinstance(err, NotHeld) else "died"
        log.warning("sampler %s %s (%d of %d restarts); its request is queued until a sampler is free",
                    slot.name, how, slot.deaths, self.cfg.sampler_max_restarts)
        slot.state, slot.probe_at = SlotState.restarting, time.monotonic()

    def _drop(self, slot: SamplerSlot, why: str) -> None:
        slot.state = SlotState.dropped
        left = [s.name for s in self.samplers if s.state is not SlotState.dropped]
        if not left:
            raise RunFailed(f"sampler {slot.name} {why} and no sampler is left")
        log.warning("sampler %s %s: dropped; the run goes on with %s", slot.name, why, ", ".join(left))

    def _probe_restarting(self, probes: dict) -> None:
        now = time.monotonic()
        for slot in self.samplers:
            if slot.state is SlotState.restarting and slot.probe_at <= now and all(s is not slot for s in probes.values()):
                probes[slot.actor.job.remote()] = slot

    def _probed(self, ref: ray.ObjectRef, slot: SamplerSlot, probes: dict) -> None:
        """A restarting sampler answered its probe (the job token it holds), or its ``reset``."""
        try:
            answer = ray.get(ref)
        except ray.exceptions.ActorUnavailableError:  # Ray is still starting it: not another death
            slot.state, slot.probe_at = SlotState.restarting, time.monotonic() + PROBE_EVERY_S
            return
        except ray.exceptions.RayActorError as err:
            self._died(slot, err)
            return
        except ray.exceptions.RayError as err:  # its __init__ raised under this job's arguments
            cause = getattr(err, "cause", None) or err
            raise RunFailed(f"sampler {slot.name} failed to re-initialise: {first_line(cause)}") from err
        if slot.state is SlotState.restarting and answer != slot.job:
            # Ray re-created it from the arguments it was created with, an earlier job's of this
            # sweep: it becomes this job's sampler before it is sent anything else.
            log.warning("sampler %s is back holding job %s's arguments; re-initialising it for job %s",
                        slot.name, answer, slot.job)
            slot.state = SlotState.resetting
            probes[slot.actor.reset.remote(*slot.init)] = slot
            return
        slot.state = SlotState.ready
        self.sampler_restarts += 1
        log.warning("sampler %s is back", slot.name)

    # -- trainer faults ------------------------------------------------------------------
    def _replace_trainer(self, died: TrainerDied, inflight: dict) -> None:
        """Go on with a new trainer at the newest checkpoint's step and data position.

        Groups generated since came from weights that no longer exist (they would be trained at a
        negative lag): the buffer and the queue are emptied and requests still running are dropped
        when they return. Every sampler is sent the new trainer's weights with its next request.
        """
        if self.restart is None:
            raise died
        self.trainer, state = self.restart(died)
        self.trainer_restarts += 1
        self.version = self.published = state.step
        self.next_request = state.next_request
        self.buffer, self.orphans, self.refused = [], deque(), set()
        self.discard.update(inflight)
        for slot in self.samplers:
            slot.version = -1
        self.weights_ref = self.trainer.published_weights.remote()
        if self.schedule is not None:  # nothing older than the checkpoint exists any more
            self.schedule = dataclasses.replace(self.schedule, floor=state.step)
            self.versions = {state.step: self.weights_ref}
            self.next_request = self.schedule.first_request(state.step)  # as in __init__
        self.window = _Window()
        self.idle_since, self.last_step_at = time.perf_counter(), time.monotonic()

    def _finish_step(self, ref: ray.ObjectRef) -> StepReport:
        try:
            self.version, metrics = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            raise TrainerDied(f"the trainer died during step {self.version + 1} ({type(err).__name__})") from err
        except ray.exceptions.RayError as err:  # it raised (out of memory, say): a run's failure, in one line
            raise RunFailed(f"the trainer failed step {self.version + 1}: {first_line(err)}") from err
        sync_s = 0.0  # this step's publish (none between weight_sync_every steps)
        if self.version % self.cfg.weight_sync_every == 0:
            start = time.perf_counter()
            self.weights_ref = self.trainer.published_weights.remote()
            if not ray.wait([self.weights_ref], timeout=self.cfg.step_timeout_s, fetch_local=False)[0]:
                raise RunFailed(f"the trainer did not publish step {self.version}'s weights within "
                                f"{self.cfg.step_timeout_s:.0f} s (loop.step_timeout_s); waiting on the trainer")
            self.published = self.version
            sync_s = time.perf_counter() - start
            if self.schedule is not None:
                self.versions[self.version] = self.weights_ref
                self._keep_versions()
        now = time.perf_counter()
        elapsed = max(now - self.window.start, 1e-9)
        metrics[STEP_S] = elapsed
        metrics[WEIGHT_SYNC_S] = sync_s
        metrics[TRAINER_IDLE_FRAC] = min(self.window.idle_s / elapsed, 1.0)
        busy = max(elapsed - self.window.idle_s, 1e-9)
        metrics[TRAINER_TOKENS_PER_S] = metrics.get(TOKENS, 0.0) / busy
        # Sampler throughput over the last few steps: a single step's window often closes before
        # any request finishes (the next batch was already buffered), which would read as 0.
        self.recent.append((elapsed, self.window.tokens))
        span = sum(e for e, _ in self.recent)
        for pool in {p for _, tokens in self.recent for p in tokens}:
            tokens = sum(t.get(pool, 0) for _, t in self.recent)
            metrics[f"{SAMPLER_TOKENS_PER_S}/{pool}"] = tokens / span
        metrics[DROPPED_GROUPS] = float(self.window.dropped_groups)
        if self.cfg.dynamic_sampling:
            metrics[UNIFORM_DROPPED_FRAC] = self.window.uniform_dropped / max(self.window.groups, 1)
        if self.cfg.overlong is not Overlong.keep:
            metrics[OVERLONG_FRAC] = self.window.overlong / max(self.window.completions, 1)
        metrics[REQUESTS_REISSUED] = float(self.requests_reissued)
        metrics[SAMPLER_RESTARTS] = float(self.sampler_restarts)
        metrics[TRAINER_RESTARTS] = float(self.trainer_restarts)
        for slot in self.samplers:
            if slot.inflight is not None:
                self._count_busy(slot, now)
        # Sampler-bound: the trainer idles and the samplers are busy; trainer-bound: the samplers
        # wait (buffer full or staleness bound) and finished groups queue up.
        metrics[SAMPLER_BUSY_FRAC] = min(self.window.sampler_busy_s / (elapsed * self._sampler_lanes()), 1.0)
        metrics[BUFFERED_GROUPS] = float(count_groups(self.buffer, self.cfg.group_size))
        self.window = _Window()
        return StepReport(step=self.version, metrics=metrics, version=self.version)
