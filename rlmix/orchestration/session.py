"""The Ray instance and the actor processes of a run — kept warm across the jobs of a sweep.

Start-up (docs/performance.md): a local instance lets every actor process start at once (Ray
otherwise starts at most one worker per core at a time, so seven actors on two cores started in
four waves), starts none of the helper processes a run on it never uses (the autoscaler's
monitor, the dashboard's API server, the log monitor), and readiness is awaited once, for all
actors together.

Sweeps: Hydra's basic launcher runs the jobs of ``rlmix train -m`` one after another in one
process. Between jobs the instance stays up, and so do the processes: an actor whose next job
needs it in the same place is re-initialised in place (``reset``: the same ``__init__`` with the
new job's arguments — fresh weights, optimizer, seeds, task), which costs milliseconds instead
of the seconds of a new process importing torch. Nothing of a job's state survives ``reset``.
Any job reuses an actor that sits in the same place (``ActorRequest.place_key``: class and Ray
options), whatever its other arguments — a sweep over seeds, tasks or samplers' settings too.

Ray restarts a dead sampler (``max_restarts``) with the arguments it was *created* with, which
may be an earlier job's. Each job therefore gets a token (``Session.begin_job``) that is one of
its samplers' arguments and travels with every request: a process that holds another job's
token refuses the request (``workers.NotHeld``), and the loop re-initialises it with the current
job's arguments before it serves anything (``loop.AsyncLoop._probed``). The trainer is never
restarted by Ray: a dead one is replaced by a new process of the current job (``Session.replace``),
which then loads the run's newest checkpoint (rlmix.orchestration.runner.TrainerRestarts).

One process may run several commands in turn (a test session does): inside ``Session.hold()``
every job ends as a sweep's does, so the next command reuses Ray and the parked processes in the
same way; the instance ends when the hold does.

A signal to the whole process group (``timeout``, ``kill -- -PGID``, the SIGHUP of a terminal that
closes) reaches Ray's own processes too, which sit in the driver's group: Ray's raylet would end
every actor at once and the driver with them, before the run could save its step. A local instance
is therefore started with SIGTERM and SIGHUP blocked (``GROUP_SIGNALS``), as Ray blocks SIGINT in
them for Ctrl-C; its processes keep the block, the driver alone handles the signal
(rlmix.orchestration.outcome), and each actor, in its own process group, unblocks them and leaves
them to the driver (``workers.become_worker``).

A local instance's raylet is the driver's child, and its end (killed, crashed) ends every actor and,
soon after, the driver too (Ray's core worker exits once it finds the object store gone). The
session keeps its process (``Session.raylet``), so the run can tell a lost node from its actors'
deaths and end at once, failed and resumable (``Session.node_lost``, rlmix.orchestration.loop). A
cluster's raylets (``cluster.address``) are not the driver's: none is watched there.

The processes share one scratch directory (rlmix.isolation.scratch) for their sandboxes and task
directories; it lives as long as Ray does here and is removed, with any process still running
from it, when Ray is shut down (``Session.close``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from rlmix.isolation.process import parent_pid
from rlmix.isolation.scratch import ENV as SCRATCH_ENV, open_scratch, remove_scratch
from rlmix.orchestration.forkserver import SCRIPT as FORK_WORKER, WORKER_ENV, ForkServer, discard_early

log = logging.getLogger(__name__)

TRAINER_RESOURCE = "rlmix_trainer"

# Held blocked in a local Ray instance's own processes (the module docstring).
GROUP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP})
# In the scratch directory while the session ends its processes (``Session.close``): Ray's raylet sends each
# actor SIGTERM once the driver leaves, which is no signal of anyone's to leave to the driver.
ENDING = ".session-ending"


def session_ending() -> bool:
    """Whether the session that started this process is ending its processes (``ENDING``)."""
    scratch = os.environ.get(SCRATCH_ENV)
    return bool(scratch) and os.path.exists(os.path.join(scratch, ENDING))


@dataclass(frozen=True)
class ActorRequest:
    """One actor a job needs: its class, Ray options and constructor arguments."""

    cls: type
    options: dict  # Ray placement options
    args: tuple
    env_vars: dict  # this run's worker environment (where output goes); not part of the placement

    def place_key(self) -> tuple:
        return (self.cls.__qualname__, repr(sorted(self.options.items())))


@dataclass
class _Warm:
    place: tuple
    handle: object


@dataclass
class Session:
    """Ray plus the idle actors a finished job left for the next one (one per driver process)."""

    ray_key: tuple | None = None  # what the running instance was started with
    idle: list[_Warm] = field(default_factory=list)
    running: list[tuple[ActorRequest, object]] = field(default_factory=list)  # the current job's
    job: int = 0  # the current job's token; never reused within the driver process
    scratch: Path | None = None  # the processes' scratch directory, removed with them (rlmix.isolation.scratch)
    held: bool = False  # inside hold(): Ray and the parked processes outlive each command
    raylet: object = None  # the raylet of a local instance this session started (its Popen); None on a cluster
    fork: ForkServer | None = None  # the local instance's fork server (rlmix.orchestration.forkserver), if any

    @contextmanager
    def hold(self):
        """Keep Ray and the idle processes between the commands run inside, as between the jobs of
        a sweep (each job still starts from fresh state); everything ends when the block does."""
        self.held = True
        try:
            yield self
        finally:
            self.held = False
            self.close()

    def end_command(self) -> None:
        """A command has finished: Ray and its processes end with it, unless held. Held, the scratch
        directory stays with them, but no run of this process is open until the next command: what
        this process starts meanwhile (a subprocess, a sandbox) makes its own."""
        discard_early()  # a fork server launched for a command that started no local instance
        if not self.held:
            self.close()
        elif self.scratch is not None and os.environ.get(SCRATCH_ENV) == str(self.scratch):
            del os.environ[SCRATCH_ENV]

    def begin_job(self) -> int:
        """A new job's token, distinct from every earlier job's (see the module docstring)."""
        self.job += 1
        return self.job

    def ensure_ray(self, address: str | None, num_cpus: int | None, resources: set[str], env_vars: dict[str, str],
                   log_to_driver: bool, fork_workers: bool = True) -> None:
        """Start (or join) Ray unless the running instance already offers everything asked for.

        Each actor takes on its own run's ``env_vars`` in its constructor. A local instance gets
        no ``runtime_env``: with one, Ray starts every worker through a second interpreter
        (``setup_worker.py``) and its runtime-env agent, 0.5-1 core-second per actor; its
        processes inherit this one's environment (``RLMIX_SCRATCH``) instead. Joining a cluster,
        ``env_vars`` (the first job's) go as the job's ``runtime_env``, for the nodes' processes.
        ``fork_workers``: a local instance's worker processes are forked from a process that has
        imported torch once (rlmix.orchestration.forkserver) instead of each importing it.
        """
        import ray

        key = (address, num_cpus, tuple(sorted(resources)), log_to_driver, fork_workers and address is None)
        # A kept instance whose node has since ended (its raylet killed between two jobs) is started anew.
        if ray.is_initialized() and self._covers(key) and self.node_lost() is None:
            if self.scratch is not None:  # a held instance: this command's run is open again
                os.environ[SCRATCH_ENV] = str(self.scratch)
            return
        self.close()
        self.scratch = open_scratch()  # before Ray starts: its processes inherit RLMIX_SCRATCH
        if address is not None:
            env = {"env_vars": env_vars | {SCRATCH_ENV: str(self.scratch)}}
            ray.init(address=address, runtime_env=env, log_to_driver=log_to_driver)
        else:
            cpus = num_cpus or os.cpu_count() or 1
            # Emulated accelerator types are declared as Ray's own accelerator_type resources,
            # so the same placement code runs unchanged on a real heterogeneous cluster. Each
            # is declared many times over so later jobs of a sweep with more instances fit too.
            with _group_signals_blocked(), _without_unused_helpers(log_to_driver), \
                    _workers_forked(self.scratch if fork_workers else None) as forked:
                ray.init(
                    # "local": always a new instance of our own, never another process's `ray start`
                    # cluster found on this machine (which would refuse num_cpus and resources).
                    address="local",
                    num_cpus=cpus,
                    resources={name: 64.0 for name in resources},
                    include_dashboard=False,
                    log_to_driver=log_to_driver,
                    configure_logging=False,
                    # Ray caps concurrent worker start-ups at the core count: lift it so every
                    # actor of the run imports torch at the same time.
                    _system_config={"worker_maximum_startup_concurrency": 64},
                )
            self.fork = forked.server
            self.raylet = _own_raylet()
        self.ray_key = key

    def node_lost(self, grace_s: float = 0.0) -> str | None:
        """Why the local Ray node this session started is gone (its raylet exited: killed, crashed), or None.
        ``grace_s``: how long to wait for the raylet's exit, for a caller that has just seen actors fail
        (they may see their raylet's sockets close a moment before it has exited).

        With its raylet every actor ends, and Ray's core worker soon ends the driver too (once it
        finds the object store gone: ``The connection to the plasma store is failed. Terminate the
        process.``), so a run that sees this must end at once, as failed and resumable, instead of
        taking it for its actors' deaths (rlmix.orchestration.loop). Only ever true for a local
        instance of our own, between its start and ``close``: a cluster's raylet (``cluster.address``)
        is not ours to watch, and None is answered where the raylet is not known.
        """
        process = self.raylet
        if process is None:
            return None
        try:  # reaps it: a raylet killed is a zombie of the driver's until then
            code = process.wait(timeout=grace_s) if grace_s > 0 else process.poll()
        except subprocess.TimeoutExpired:
            return None
        except Exception:  # a Ray that keeps another kind of handle: nothing to tell
            return None
        if code is None:
            return None
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        with suppress(ValueError):
            how = signal.Signals(-code).name if code < 0 else how
        return f"the Ray node ended (its raylet exited, {how})"

    def _stop_fork(self) -> None:
        if self.fork is not None:
            self.fork.stop()
            self.fork = None

    def _covers(self, key: tuple) -> bool:
        if self.ray_key is None:
            return False
        address, cpus, names, to_driver, forked = key
        return self.ray_key[:2] == (address, cpus) and set(names) <= set(self.ray_key[2]) \
            and self.ray_key[3:] == (to_driver, forked)

    def actors(self, wanted: list[ActorRequest]) -> tuple[list, list]:
        """(handles, readiness refs): one actor per request, warm where possible.

        Idle actors no request took are ended. A warm actor is always ``reset`` (fresh weights,
        optimizer and seeds); its readiness ref raises if that fails, like a new actor's would.
        """
        import ray

        handles, ready, reused = [], [], 0
        for req in wanted:
            warm = self._take(req)
            if warm is None:
                handle = _start(req)
                ready.append(handle.version.remote())
            else:
                handle, reused = warm.handle, reused + 1
                ready.append(handle.reset.remote(req.env_vars, *req.args))
            handles.append(handle)
        for warm in self.idle:
            ray.kill(warm.handle)
        self.idle = []
        if reused:
            log.info("reusing %d of %d actor processes from the previous job", reused, len(wanted))
        self.running = list(zip(wanted, handles))
        return handles, ready

    def replace(self, handle) -> tuple[object, object]:
        """(new handle, readiness ref): a new process in place of the current job's actor ``handle``,
        created from the same request; the old one is killed first if it still lives (hung)."""
        import ray

        for i, (req, running) in enumerate(self.running):
            if running is handle:
                ray.kill(handle, no_restart=True)
                new = _start(req)
                self.running[i] = (req, new)
                return new, new.version.remote()
        raise ValueError("replace: not an actor of the current job")

    def _take(self, req: ActorRequest) -> _Warm | None:
        for i, warm in enumerate(self.idle):
            if warm.place == req.place_key():
                return self.idle.pop(i)
        return None

    def release(self, keep: bool) -> None:
        """After a job: park its actors for the next job (``keep``) or end them and Ray."""
        pairs, self.running = self.running, []
        if not keep:
            self.close()
            return
        self.idle = [_Warm(req.place_key(), handle) for req, handle in pairs]

    def close(self) -> None:
        import ray

        self.idle, self.running, self.ray_key, self.raylet = [], [], None, None
        if ray.is_initialized():
            if self.scratch is not None:  # what the actors are sent from here on is this teardown's
                with suppress(OSError):
                    (self.scratch / ENDING).touch()
            _stop_without_grace()
            ray.shutdown()
        self._stop_fork()
        if self.scratch is not None:
            remove_scratch(self.scratch)  # and whatever the processes started that still runs from it
            self.scratch = None


@contextmanager
def _group_signals_blocked():
    """The processes started in the block inherit ``GROUP_SIGNALS`` blocked (the module docstring)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextmanager
def _without_unused_helpers(log_to_driver: bool):
    """A local head started in the block leaves out the helper processes a run on it never uses.

    - the autoscaler's monitor: a local instance has a fixed size and never scales;
    - the dashboard's API server: ``include_dashboard=False`` only trims the modules it loads (to
      usage statistics), and ``ray.init`` still waits for it to publish its address;
    - the log monitor, unless the workers' output goes to the driver (``logger.verbose``): every
      actor writes its own to the run's ``workers.log`` (rlmix.metrics.quiet).

    Each is a Python process importing Ray and aiohttp, ~0.7-1 core-second on two cores, and
    ``ray.init`` took 2.2 s less without them (docs/performance.md, Start-up). What a run loses is
    Ray's own views of the instance (``ray status``, the state API, job submission), which rlmix
    does not use. Ray does not offer this through ``ray.init``: the head's methods that start
    them are left out for the block. A Ray without those methods starts them as before.
    """
    try:
        from ray._private.node import Node
    except ImportError:  # a Ray laid out otherwise
        yield
        return
    names = ["start_monitor", "start_api_server"] + ([] if log_to_driver else ["start_log_monitor"])
    own = {name: Node.__dict__[name] for name in names if callable(Node.__dict__.get(name))}
    for name in own:
        setattr(Node, name, _start_nothing)
    try:
        yield
    finally:
        for name, method in own.items():
            setattr(Node, name, method)


class _Forked:
    server: ForkServer | None = None


@contextmanager
def _workers_forked(scratch: Path | None):
    """A local head started in the block has its raylet start each worker as ``fork_worker.py``, to be
    forked by a fork server (rlmix.orchestration.forkserver) making its socket in ``scratch``, instead
    of as Ray's ``default_worker.py``, which the script is told of. Yields where the server will be
    (``.server``). None, or a Ray laid out otherwise, starts its workers as Ray always does."""
    forked = _Forked()
    try:
        from ray._private.node import Node

        own = Node.__dict__.get("start_raylet")
    except ImportError:
        own = None
    # Before Ray, so that its imports take the core Ray's own start leaves idle (if ``prestart`` has not
    # launched it already, at the command's start).
    server = ForkServer.for_run(scratch) if scratch is not None and callable(own) else None
    if server is None:
        yield forked
        return

    def start_raylet(node, *args, **kwargs):
        params = node._ray_params
        if not (params.worker_path and os.path.basename(params.worker_path) == "default_worker.py"):
            return own(node, *args, **kwargs)
        os.environ[WORKER_ENV] = params.worker_path
        params.worker_path = str(FORK_WORKER)
        forked.server = server
        started = own(node, *args, **kwargs)
        # Told now, not once ray.init returns: Ray answers the first driver only once the workers it
        # prestarts for it have registered, and the server holds them until it knows their raylet.
        infos = node.all_processes.get("raylet") or []
        pid = getattr(getattr(infos[0], "process", None), "pid", None) if len(infos) == 1 else None
        if pid is None or not server.serve_children_of(pid):
            server.stop()  # the workers waiting for it start on their own
            forked.server = None
        return started

    Node.start_raylet = start_raylet
    try:
        yield forked
    except BaseException:
        forked.server = None
        raise
    finally:
        Node.start_raylet = own
        if forked.server is None:  # Ray failed to start, or started no raylet of its workers here
            server.stop()


def _start_nothing(self, *args, **kwargs) -> None:
    return None


def _stop_without_grace() -> None:
    """``ray.shutdown`` ends a local instance at once. Its graceful stop sends the raylet and the GCS
    SIGTERM and waits a second for each before it sends SIGKILL; a local instance's processes hold
    SIGTERM blocked (``GROUP_SIGNALS``), so both seconds were always waited in full (2 s at the end
    of every command), and the raylet's agents then ended on their own. Now the raylet's children
    (its agents, the workers) are sent SIGKILL with the raylet and the GCS: without that second,
    the agents outlived them. Best effort: a Ray laid out otherwise stops as it always does."""
    from ray._private import worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    kill_all = getattr(node, "kill_all_processes", None)
    if node is None or not node.is_head() or kill_all is None:
        return

    def kill_at_once(*args, **kwargs):
        children = [child for info in node.all_processes.get("raylet", []) for child in _children(info.process.pid)]
        kill_all(*args, **(kwargs | {"allow_graceful": False}))
        for pid in children:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    node.kill_all_processes = kill_at_once


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (none where /proc cannot tell)."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and parent_pid(int(entry.name)) == pid]


def _own_raylet():
    """The raylet process (a ``subprocess.Popen``) of the local instance ``ray.init`` just started, or
    None where this Ray keeps it elsewhere: then a lost node is not told apart (``Session.node_lost``)."""
    from ray._private import worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    infos = getattr(node, "all_processes", {}).get("raylet") or []
    process = getattr(infos[0], "process", None) if len(infos) == 1 else None
    return process if callable(getattr(process, "poll", None)) else None


def _start(req: ActorRequest):
    import ray

    return ray.remote(req.cls).options(**req.options).remote(*req.args, run_env=req.env_vars)


SESSION = Session()

