"""The ``rlmix`` command. Imports stay light here: ``rlmix --help`` answers in well under a second."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Optional

import typer

# Plain help, not Typer's rich layout: that one prints a type after every option, flags included
# (``--help <bool>``), inviting a value a flag refuses.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Asynchronous RL with a heterogeneous sampler fleet and explicit off-policy correction.",
)

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


class _Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a command, which is stopped as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stoppable():
    """SIGTERM and SIGHUP stop the command as Ctrl-C does, so it ends with its one line instead of
    silently; one it was started ignoring stays ignored (`nohup`). SIGINT stops it too, also where the
    shell started it ignoring SIGINT (a script's ``rlmix eval &``, then ``kill -INT``), as it stops
    ``rlmix train``. The result files it writes are recorded afresh (``rlmix.metrics.written``)."""
    import signal

    from rlmix.metrics.written import WRITTEN
    from rlmix.orchestration.outcome import stop_handlers

    WRITTEN.clear()  # a process may run several commands (tests do)

    def stop(signum: int, frame) -> None:
        raise _Stopped(signum)

    stays = (signal.SIGTERM, signal.SIGHUP)  # where started ignored
    with stop_handlers(stop, (signal.SIGINT, *stays), ignored_stay=stays):
        yield


def _interrupted(command: str, result: str, stopped: KeyboardInterrupt) -> None:
    """A signal during ``command``, whose ``result`` file is written only at its end (or after it
    was, during what follows: W&B's upload, the closing lines): one line, exit 128 + N."""
    import signal

    from rlmix.metrics.written import WRITTEN

    signum = getattr(stopped, "signum", signal.SIGINT)
    done = f"after it wrote {WRITTEN[-1]}" if WRITTEN else f"no {result} was written"
    typer.echo(f"interrupted ({signal.Signals(signum).name}): rlmix {command} stopped, {done}", err=True)
    raise typer.Exit(code=128 + signum)


@app.command(context_settings=_PASSTHROUGH, add_help_option=False,
             short_help="Train with Hydra overrides: `rlmix train +experiment=sc_mis seed=1`.")
def train(ctx: typer.Context) -> None:
    """Train with Hydra overrides, e.g. `rlmix train +experiment=sc_mis seed=1`.

    Everything after `train` goes to Hydra: `-m` sweeps, `--cfg job`, `--help` (lists the
    config groups), launcher and sweeper plugins.
    """
    from rlmix.commands.compose import quote_paths
    from rlmix.commands.train import run_train
    from rlmix.errors import ConfigError
    from rlmix.metrics.console import console_outlives_reader

    try:
        with console_outlives_reader():  # `| head`: the run goes on, as after its terminal closed
            run_train(quote_paths(ctx.args))
    except ConfigError as err:
        _fail(str(err))


_EVAL_HELP = (
    "Evaluate a checkpoint with pass@k: `rlmix eval checkpoint=<run dir> task.split=hard51 eval.k=[1,4]`.\n\n"
    "Takes Hydra overrides, as `rlmix train` does (`rlmix train --cfg job` prints every key): checkpoint= "
    "(a run directory, one of its checkpoints, or any HF model directory; a run's task, model and generation "
    "length come with it), task=, task.split= (test, hard51), eval.k=, eval.samples=, eval.temperature=, "
    "eval.max_new_tokens=, eval.out_dir=, seed=. Writes eval.json."
)
_PROBE_HELP = (
    "Measure each pool's mismatch against the trainer, without training: `rlmix probe fleet=emulated_hetero6`.\n\n"
    "Takes Hydra overrides, as `rlmix train` does (`rlmix train --cfg job` prints every key): fleet=, model=, "
    "model.path=, task=, probe.prompts= (from the task's test split), probe.samples_per_prompt=, "
    "probe.num_candidates=, probe.out_dir=, loop.max_new_tokens=, seed=. Writes probe.json (docs/probe.md)."
)


@app.command(context_settings=_PASSTHROUGH, options_metavar="[KEY=VALUE]...", help=_EVAL_HELP,
             short_help="Evaluate a checkpoint with pass@k: `rlmix eval checkpoint=<run dir>`.")
def eval(ctx: typer.Context) -> None:  # noqa: A001 - the command is called eval
    from rlmix.commands.compose import quote_paths
    from rlmix.commands.eval import run_eval
    from rlmix.errors import ConfigError
    from rlmix.metrics.console import console_outlives_reader

    try:
        with _stoppable(), console_outlives_reader():
            run_eval(quote_paths(ctx.args))
    except ConfigError as err:
        _fail(str(err))
    except KeyboardInterrupt as stopped:
        _interrupted("eval", "eval.json", stopped)


@app.command(context_settings=_PASSTHROUGH, options_metavar="[KEY=VALUE]...", help=_PROBE_HELP,
             short_help="Each pool's mismatch against the trainer, without training.")
def probe(ctx: typer.Context) -> None:
    from rlmix.commands.compose import quote_paths
    from rlmix.commands.probe import run_probe
    from rlmix.errors import ConfigError
    from rlmix.metrics.console import console_outlives_reader

    try:
        with _stoppable(), console_outlives_reader():
            run_probe(quote_paths(ctx.args))
    except ConfigError as err:
        _fail(str(err))
    except KeyboardInterrupt as stopped:
        _interrupted("probe", "probe.json", stopped)


@app.command()
def report(
    path: str = typer.Argument(..., metavar="PATH", help="A run directory, a multirun directory, or a folder of them."),
    out: Optional[str] = typer.Option(None, help="Where to write report.md and the plots (default: PATH/report/)."),
    where: bool = typer.Option(False, "--where", help="Also one figure per run: where each step's gradient came "
                                                      "from, by p/q and by the trainer's probability (where/)."),
) -> None:
    """Table and plots across the runs of a sweep."""
    from rlmix.errors import ConfigError
    from rlmix.commands.report import run_report

    try:
        run_report(path, out, where)
    except ConfigError as err:
        _fail(str(err))


def main() -> None:
    app(prog_name="rlmix")


if __name__ == "__main__":
    main()
    sys.exit(0)
