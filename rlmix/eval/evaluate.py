"""Evaluation of a checkpoint: pass@k on a task split, on one fixed reference backend and precision.

Every checkpoint is sampled by the same reference view (``eval.accelerator``/``eval.precision``,
recorded in ``eval.json``) so that sampler differences never leak into the score (docs/math.md §7).
``rlmix eval`` (``rlmix.commands.eval``) composes and plans the config and calls ``evaluate``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from rlmix.assembly.plan import RunPlan
from rlmix.config.schema import EvalConfig, RunConfig
from rlmix.errors import ConfigError
from rlmix.metrics.passk import PassAtK, mean_pass_at_k
from rlmix.rollout import SamplingParams

EVAL_FILE = "eval.json"


def resolve_checkpoint(plan: RunPlan, progress=print) -> Path:
    """The model ``checkpoint=`` names, as an absolute path: a run directory's newest complete checkpoint
    (saying which newer ones it skips, and why, as a resume does), a checkpoint or an HF model dir
    itself, or the base model the run starts from. A checkpoint given itself must be complete: an
    earlier one would be a different model, scored under this one's name."""
    from rlmix.assembly.checkpoints import CHECKPOINTS, is_checkpoint, newest_complete, problem
    from rlmix.assembly.parts import resolve_model_dir

    cfg = plan.cfg
    if cfg.checkpoint is None:
        return Path(resolve_model_dir(plan)).resolve()
    path = Path(cfg.checkpoint)
    if not path.is_dir():
        what = "a file, not a directory" if path.exists() else "no such directory"
        raise ConfigError(f"checkpoint={cfg.checkpoint}: {what} (give a run directory or an HF model dir)")
    if is_checkpoint(path):
        why = problem(path)
        if why:
            raise ConfigError(f"checkpoint={cfg.checkpoint}: an incomplete checkpoint ({why}); give a complete "
                              "checkpoints/step_* or the run directory (its newest complete one)")
        return path.resolve()
    if (path / "config.json").is_file():
        return path.resolve()
    newest, skipped = newest_complete(path)
    if newest is None:
        why = f" ({skipped[0][0].name}: {skipped[0][1]})" if skipped else ""
        raise ConfigError(f"checkpoint={cfg.checkpoint}: neither an HF model dir nor a run dir with a complete "
                          f"{CHECKPOINTS}/step_*{why}")
    for step, why in skipped:
        progress(f"skipping {step.name}: {why}")
    return newest.resolve()


@contextmanager
def loading(cfg: RunConfig, model_dir: Path, what: str):
    """Reading ``model_dir``'s ``what`` (its tokenizer, its weights): a failure in one line naming the key
    the user gave (the model readers name ``model.path``, which ``checkpoint=`` is not)."""
    from safetensors import SafetensorError

    if cfg.checkpoint is not None:
        given = Path(cfg.checkpoint).resolve()
        key = f"checkpoint={cfg.checkpoint}" + ("" if given == model_dir else f" ({model_dir})")
    else:
        key = f"model.path={cfg.model.path}" if cfg.model.path is not None else f"the base model {model_dir}"
    try:
        yield
    except ConfigError as err:
        text = str(err).replace(f"model.path={str(model_dir)!r}", key).replace(f"model dir {model_dir}", key)
        raise ConfigError(text) from None
    except (SafetensorError, OSError, RuntimeError, KeyError) as err:  # a checkpoint's manifest checks sizes only
        first_line = (str(err).splitlines() or [""])[0]
        raise ConfigError(f"{key}: {what} do not load ({type(err).__name__}: {first_line})") from None


def reference_sampler(cfg: EvalConfig, model_dir: Path, seed: int):
    from rlmix.assembly.fleet import view_sampler
    from rlmix.samplers.accelerators import resolve_view

    try:
        view = resolve_view(cfg.accelerator, cfg.precision)
    except ConfigError as err:
        raise ConfigError(f"eval: {err}") from None
    return view_sampler(model_dir, view, pool="eval_reference", seed=seed), view.label


def reference_tokenizer(cfg: RunConfig, model_dir: Path) -> tuple[object, tuple[int, ...]]:
    """(the model's tokenizer, the ids a completion stops at), read before any weights load."""
    from rlmix.models.tokenizer_file import load_fast_tokenizer, stop_token_ids

    with loading(cfg, model_dir, "tokenizer files"):
        tokenizer = load_fast_tokenizer(model_dir)
    return tokenizer, stop_token_ids(model_dir, tokenizer.eos_token_id)


def task_counts(plan: RunPlan, model_dir: Path, progress) -> tuple[list[dict], str, str | None]:
    """Sample ``eval.samples`` completions per problem of ``task.split``; (per-task rows, reference label,
    the first reward error's message or None)."""
    from rlmix.assembly.parts import decode_completions
    from rlmix.seeds import derive_seed

    cfg = plan.cfg
    tokenizer, stops = reference_tokenizer(cfg, model_dir)
    task = plan.task.build(cfg.seed, tokenizer, cfg.eval.max_new_tokens, key="eval.max_new_tokens")
    problems = task.split(cfg.task.split)
    prompts = plan.task.check_prompts(problems, tokenizer, model_dir, cfg.eval.max_new_tokens, "eval.max_new_tokens",
                                      f"task.split={cfg.task.split}")
    with loading(cfg, model_dir, "weights"):
        sampler, label = reference_sampler(cfg.eval, model_dir, cfg.seed)
    n = cfg.eval.samples
    rows, first_error = [], None
    for i, (problem, ids) in enumerate(zip(problems, prompts)):
        params = SamplingParams(
            temperature=cfg.eval.temperature,
            max_new_tokens=cfg.eval.max_new_tokens,
            stop_token_ids=stops,
            seed=derive_seed(cfg.seed, "eval", problem.task_id),
        )
        out = sampler.generate([ids] * n, params)
        scores = [task.score(problem, text) for text in decode_completions(tokenizer, out)]
        first_error = first_error or next((s.error for s in scores if s.error is not None), None)
        rows.append({
            "task_id": problem.task_id,
            "difficulty": problem.difficulty,
            "n": n,
            "c": sum(s.reward >= 1.0 for s in scores),
            "format_errors": sum(not s.format_ok for s in scores),
            "reward_errors": sum(s.error is not None for s in scores),
            "exploit_suspected": sum(s.exploit_suspected for s in scores),
        })
        progress(f"[{i + 1}/{len(problems)}] {problem.task_id}: {rows[-1]['c']}/{n} correct")
    return rows, label, first_error


def pass_table(results: dict[int, PassAtK]) -> str:
    lines = ["   k   pass@k   stderr   tasks"]
    lines += [f"{k:>4}   {r.mean:.4f}   {r.stderr:.4f}   {r.num_tasks:>5}" for k, r in sorted(results.items())]
    return "\n".join(lines)


def sets_table(sets: dict[str, dict], ks: list[int]) -> str:
    """An episode evaluation's pass@k per set of tasks (``all``, then the task's groups), as eval.json has it."""
    width = max(len("set"), *map(len, sets))
    lines = [f"{'set':<{width}}      k   pass@k   stderr   tasks"]
    for name, block in sets.items():
        for k in ks:
            p = block[f"pass@{k}"]
            value = "    n/a     n/a" if p["mean"] is None else f"{p['mean']:.4f}   {p['stderr']:.4f}"
            lines.append(f"{name:<{width}}   {k:>4}   {value}   {p['num_tasks']:>5}")
    return "\n".join(lines)


def default_out_dir(cfg: RunConfig, split: str, differs: dict | None = None) -> Path:
    """A run directory's own task: ``<run>/eval_<split>``; another task: ``<run>/eval_<task>_<split>``,
    so it never overwrites the run's own score (what ``scripts/reproduce.py`` and a reader take as
    the run's). One of a run's ``checkpoints/step_N``: ``<run>/eval_step_N_<split>`` (or
    ``eval_<task>_step_N_<split>``), beside the run's score and not over it (an older step is another
    model), nor inside the checkpoint, which pruning deletes. Task settings other than the run's own
    (``differs``: other eval files, another reward) add ``-<keys>-<hash of the values>``
    (``eval_test-eval_files-1a2b3c``): the same settings again name the same directory, other ones
    another. A model directory, or none: ``outputs/eval/<time>_<split>``."""
    given = None if cfg.checkpoint is None else Path(cfg.checkpoint)
    run = None if given is None else saved_by(given)
    step = "" if run is None else f"{given.resolve().name}_"
    if run is None and given is not None and not (given / "config.json").is_file():
        run = given
    if run is None:
        return Path("outputs") / "eval" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{split}"
    try:
        task_name = run_task_name(run)
    except ConfigError as err:
        raise ConfigError(f"checkpoint={cfg.checkpoint}: {err}") from None
    other = "" if task_name in (None, cfg.task.name) else f"{cfg.task.name}_"
    return run / f"eval_{other}{step}{split}{differs_suffix(differs)}"


def differs_suffix(differs: dict | None) -> str:
    """``-<keys>-<hash>`` for task settings other than the run's own ('' for none): the keys say what
    differs, the hash of their values tells two such evaluations apart."""
    if not differs:
        return ""
    keys = "-".join(key.removeprefix("task.").replace(".", "_") for key in sorted(differs))
    digest = hashlib.sha256(json.dumps(differs, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return f"-{keys[:60]}-{digest}"


def result_dir(cfg: RunConfig, split: str, differs: dict | None = None) -> Path:
    """Where eval.json goes (``eval.out_dir``, else ``default_out_dir``), checked writable before the
    first sample rather than after the last."""
    from rlmix.assembly.rules import check_output_dir

    out_dir = Path(cfg.eval.out_dir) if cfg.eval.out_dir else default_out_dir(cfg, split, differs)
    check_output_dir("eval.out_dir", str(out_dir))
    return out_dir


def saved_by(checkpoint: Path) -> Path | None:
    """The run directory ``checkpoint`` is one of the ``checkpoints/step_N`` of (None: it is not): a run's
    checkpoint is evaluated on the run's settings, as the run directory is, and scored beside it."""
    from rlmix.assembly.checkpoints import CHECKPOINTS

    parent = Path(checkpoint).resolve().parent
    return parent.parent if parent.name == CHECKPOINTS and (parent.parent / ".hydra").is_dir() else None


def run_task_name(run_dir: Path) -> str | None:
    """The task group option a run directory trained on (its composed ``.hydra/config.yaml``), if any."""
    from omegaconf import OmegaConf

    config = run_dir / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    return OmegaConf.select(load_run_yaml(config), "task.name")


def load_run_yaml(path: Path):
    """One of a run directory's ``.hydra`` files as a ``DictConfig``; ConfigError, in one line, where it is
    not valid YAML or not a mapping."""
    from omegaconf import DictConfig, OmegaConf
    from yaml import YAMLError

    try:
        loaded = OmegaConf.load(path)
    except (YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid YAML ({type(exc).__name__})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path} is not a run's settings (a YAML mapping of keys)")
    return loaded


# eval.json's keys of how the samples were drawn: an evaluation that replaces another names those that differ
DRAWN_AT = ("samples", "samples_per_task", "temperature", "max_new_tokens", "max_turn_tokens")


def earlier_record(out_dir: Path) -> dict | None:
    """The eval.json already in ``out_dir``, which this evaluation replaces ({} where it cannot be read);
    None where there is none."""
    path = out_dir / EVAL_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


@dataclass(frozen=True)
class Scoring:
    """What an evaluation records beside its scores. ``differs``: the task settings that are not
    those of the run it evaluates (dotted key -> value; empty for the run's own, or where there is
    no run), which give it a directory of its own (``default_out_dir``); ``overrides``: the command
    line it was given."""

    differs: dict = field(default_factory=dict)
    overrides: tuple[str, ...] = ()


def evaluate(plan: RunPlan, progress=print, scoring: Scoring | None = None) -> dict:
    """Run the evaluation ``plan`` describes, in its task kind's form (``TaskKind.evaluate``);
    writes eval.json and returns its content."""
    ks = sorted(set(plan.cfg.eval.k))  # in 1..eval.samples: checked with the config (rlmix.assembly.rules)
    return plan.task.evaluate(Evaluation(plan, ks, progress, scoring or Scoring()))


def _absolute(value):
    """A path setting's value (a path, a glob, a list of them) with relative paths made absolute, so
    that eval.json says which files were scored from any directory."""
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    if isinstance(value, str) and "://" not in value:
        return os.path.normpath(os.path.abspath(os.path.expanduser(value)))
    return value


def scored_settings(cfg: RunConfig, scoring: Scoring) -> dict:
    """eval.json's record of what was scored beyond task and split: a dataset task's files (``eval_files``;
    ``train_files`` too at ``task.split=train``) and reward (None for a task without them), the task
    settings not the run's own (``differs_from_run``) and the command line (``overrides``)."""
    task = cfg.task
    record = {"eval_files": _absolute(getattr(task, "eval_files", None)), "reward": getattr(task, "reward", None)}
    if getattr(task, "split", None) == "train" and hasattr(task, "train_files"):
        record["train_files"] = _absolute(task.train_files)
    return {**record, "differs_from_run": dict(scoring.differs), "overrides": list(scoring.overrides)}


@dataclass(frozen=True)
class Evaluation:
    """One checkpoint's evaluation, in either form a task's kind asks for: pass@k of single
    completions (``completions``) or of episodes (``episodes``)."""

    plan: RunPlan
    ks: list[int]
    progress: Callable[[str], None]
    scoring: Scoring = field(default_factory=Scoring)

    @cached_property
    def model_dir(self) -> Path:
        """The model ``checkpoint=`` names (``resolve_checkpoint``), resolved when first asked for: an
        episode task's own input is checked before, so that a typo in it costs no model build."""
        return resolve_checkpoint(self.plan, self.progress)

    def out_dir(self, split: str) -> Path:
        """``result_dir``, said first where the task settings are not the run's own."""
        out_dir = result_dir(self.plan.cfg, split, self.scoring.differs)
        if self.scoring.differs:
            given = ", ".join(f"{key}={value}" for key, value in sorted(self.scoring.differs.items()))
            self.progress(f"not the run's own task settings ({given}): scored in {out_dir}, apart from the run's own")
        return out_dir

    def wrote(self, out_dir: Path, earlier: dict | None, summary: dict) -> str:
        """The closing line: where eval.json went, and that it replaced an earlier one there (the same
        evaluation run again: the run's own, or the same other settings; ``earlier``, read before), naming
        the sampling settings the two were drawn at where they differ: the score it replaced was another."""
        line = f"wrote {out_dir / EVAL_FILE}"
        if earlier is None:
            return line
        changed = [f"{key} {earlier[key]} -> {summary[key]}" for key in DRAWN_AT
                   if key in earlier and key in summary and earlier[key] != summary[key]]
        return line + " (replacing the earlier one there" + (f", drawn at {', '.join(changed)})" if changed else ")")

    def completions(self, split: str) -> dict:
        """``eval.samples`` completions of each problem of ``split``, scored by the task."""
        model_dir = self.model_dir
        cfg, ks, samples = self.plan.cfg, self.ks, self.plan.cfg.eval.samples
        cfg.task.split = split
        out_dir = self.out_dir(split)
        rows, label, first_error = task_counts(self.plan, model_dir, self.progress)
        reward_errors = sum(r["reward_errors"] for r in rows)
        results = {k: mean_pass_at_k([(r["n"], r["c"]) for r in rows], k) for k in ks}
        summary = {
            "checkpoint": str(model_dir),  # absolute (resolve_checkpoint): read from any directory
            "task": cfg.task.name,
            "split": split,
            "samples": samples,
            "temperature": cfg.eval.temperature,  # what the samples were drawn at: another one scores otherwise
            "max_new_tokens": cfg.eval.max_new_tokens,
            "reference": label,
            "pass_at_k": {str(k): {"mean": r.mean, "stderr": r.stderr, "tasks": r.num_tasks}
                          for k, r in results.items()},
            "format_error_rate": sum(r["format_errors"] for r in rows) / max(len(rows) * samples, 1),
            "reward_errors": reward_errors,  # samples whose reward raised or was not a number: scored 0
            "first_reward_error": first_error,
            **scored_settings(cfg, self.scoring),
            "tasks": rows,
        }
        earlier = earlier_record(out_dir)
        write_eval(out_dir, summary, cfg)
        self.progress(pass_table(results))
        if reward_errors:  # a failing reward reads as a model that is never right: say so
            self.progress(f"reward errors: {reward_errors} of {len(rows) * samples} samples scored 0 "
                          f"(first: {first_error.splitlines()[0]}; per task in {out_dir / EVAL_FILE})")
        self.progress(self.wrote(out_dir, earlier, summary))
        return summary

    def episodes(self, task_cfg, split: str, groups: dict[str, list[str]] | None = None) -> dict:
        """Multi-turn episodes of ``task_cfg`` in sandboxes, graded in fresh ones (rlmix.agentic), with
        the episode code training uses; a policy turn may generate task.max_turn_tokens. pass@k is
        reported per named group of task ids too (``groups``).

        ``task.concurrent_episodes`` episodes run at once, as in training: their turns are generated
        together by one ``TurnBatcher`` over the reference sampler (continuously batched unless
        ``task.continuous_batching=false``). Each turn draws from its own seed, so an episode is the
        one it would be alone, up to the reference kernel's rounding in another batch (docs/agentic.md).

        Refused in one line before any model is built or loaded, and before W&B or a directory starts:
        the runtime and the tasks (``playable``, once: the episodes play what it checked); once the
        tokenizer is read, a model without room for one turn, as ``rlmix train`` refuses it
        (``check_turn_room``)."""
        from rlmix.agentic.batching import TurnBatcher
        from rlmix.agentic.policy import ModelPolicy
        from rlmix.agentic.run import playable, run_swebench_eval
        from rlmix.agentic.train import HarborTaskSet, check_turn_room
        from rlmix.assembly.parts import model_max_positions

        cfg = self.plan.cfg
        play = playable(task_cfg)
        out_dir = self.out_dir(split)
        earlier = earlier_record(out_dir)
        tokenizer, stops = reference_tokenizer(cfg, self.model_dir)
        check_turn_room(task_cfg, HarborTaskSet(task_cfg, cfg.seed, play.tasks), tokenizer,
                        model_max_positions(self.model_dir))
        with loading(cfg, self.model_dir, "weights"):
            sampler, label = reference_sampler(cfg.eval, self.model_dir, cfg.seed)
        params = SamplingParams(
            temperature=cfg.eval.temperature,
            max_new_tokens=cfg.task.max_turn_tokens,
            stop_token_ids=stops,
            seed=cfg.seed,
        )
        concurrent = task_cfg.concurrent_episodes
        batcher = (TurnBatcher(sampler, seed=cfg.seed, continuous=task_cfg.continuous_batching)
                   if concurrent != 1 else None)
        policy = ModelPolicy(tokenizer, batcher or sampler, params)
        # what was scored, as a single-turn evaluation records it (the episodes' own keys come first)
        record = {"checkpoint": str(self.model_dir), "task": cfg.task.name, "split": split, "reference": label,
                  "temperature": params.temperature, "max_turn_tokens": params.max_new_tokens,
                  **scored_settings(cfg, self.scoring)}
        with made_for(out_dir) as made:
            run = made.wandb_run = _wandb_run(cfg, out_dir)
            try:
                summary = run_swebench_eval(task_cfg, policy, self.ks, cfg.eval.samples, out_dir,
                                            progress=self.progress, wandb_run=run, groups=groups, concurrent=concurrent,
                                            play=play, record=record)
            finally:
                if batcher is not None:
                    batcher.close()
        if run is not None:
            run.finish()
        self.progress(sets_table(summary["sets"], self.ks))
        self.progress(f"reference {label}; {self.wrote(out_dir, earlier, summary)}")
        return summary


@dataclass
class _Made:
    """What ``made_for`` made: the directories (innermost first) and the W&B run started in them."""

    dirs: list[Path]
    wandb_run: object = None


@contextmanager
def made_for(out_dir: Path):
    """``out_dir`` as the body makes it (and its missing parents), taken away again where a
    ``ConfigError`` ends the body before anything but W&B's run files went there: a refusal leaves
    nothing half-written. A directory that was there before, or holds anything else, stays."""
    out_dir = Path(out_dir).absolute()
    made = _Made([p for p in (out_dir, *out_dir.parents) if not p.exists()])
    try:
        yield made
    except ConfigError:
        if made.wandb_run is not None:
            made.wandb_run.finish()
        if made.dirs and out_dir.is_dir() and {p.name for p in out_dir.iterdir()} <= {"wandb"}:
            shutil.rmtree(out_dir, ignore_errors=True)
            for parent in made.dirs[1:]:
                if parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
        raise


def write_eval(out_dir: Path, summary: dict, cfg: RunConfig) -> None:
    from rlmix.metrics.written import write_result

    write_result(out_dir / EVAL_FILE, json.dumps(summary, indent=2))
    run = _wandb_run(cfg, out_dir)
    if run is not None:
        run.log({f"eval/pass@{k}": v["mean"] for k, v in summary["pass_at_k"].items()})
        import wandb

        table = wandb.Table(columns=["task_id", "difficulty", "n", "c"])
        for r in summary["tasks"]:
            table.add_data(r["task_id"], r["difficulty"], r["n"], r["c"])
        run.log({"eval/tasks": table})
        run.finish()


def _wandb_run(cfg: RunConfig, out_dir: Path):
    from rlmix.metrics.logger import start_wandb

    out_dir.mkdir(parents=True, exist_ok=True)
    return start_wandb(cfg.logger.wandb, out_dir, f"eval-{cfg.name}", {"eval": str(cfg.eval)}, None)
