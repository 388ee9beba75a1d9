"""Checkpoints a resume can trust: written aside, sealed, renamed into place, chosen by completeness.

A checkpoint ``<run dir>/checkpoints/step_<N>/`` is written first as ``.step_<N>.tmp``; the trainer
fills it (an HF model dir plus trainer state), the driver adds ``run_state.json`` (what the loop and
the logger need to continue) and, last, ``complete.json``: the size of every file in it. Only then
is the directory renamed to ``step_<N>`` (a rename within one filesystem is atomic). A checkpoint
counts as complete when ``complete.json`` exists and every file it lists has that size, so a
directory truncated after the fact (a full disk, a copy cut short) is skipped, not loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from rlmix.config.schema import lr_horizon

CHECKPOINTS = "checkpoints"
MANIFEST = "complete.json"
RUN_STATE = "run_state.json"
_PREFIX = "step_"


@dataclass(frozen=True)
class RunState:
    """What, beside the trainer's own state, a resumed run needs to continue where it stopped."""

    step: int
    next_request: int  # the data position: the first request id not yet handed out
    wall_time_s: float  # accumulated over every part of the run
    wandb_id: str | None = None
    written_by: dict | None = None  # ``written_by``: what a run must ask for to load it (None before it was recorded)
    # The loop's fault counters at this step, cumulative over every part of the run as the wall time is
    # (summary.json's ``fault``, the ``fault/*`` metrics); a checkpoint written before they were recorded: 0.
    sampler_restarts: int = 0
    requests_reissued: int = 0
    trainer_restarts: int = 0


def step_of(path: Path) -> int:
    return int(path.name[len(_PREFIX):])


def _step_dirs(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    dirs = [p for p in root.glob(_PREFIX + "*") if p.is_dir() and p.name[len(_PREFIX):].isdigit()]
    return sorted(dirs, key=step_of, reverse=True)


def problem(path: Path) -> str:
    """'' when ``path`` is a complete checkpoint, else what is wrong with it."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} (written last, so the save did not finish)"
    try:
        sizes = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as err:
        return f"unreadable {MANIFEST} ({err})"
    for name, size in sizes.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} is truncated ({file.stat().st_size} of {size} bytes)"
    return ""


def is_checkpoint(path: Path) -> bool:
    """``path`` is a checkpoint a run wrote, sealed or not (``problem`` tells which), rather than a plain
    model directory: it holds the run's own files, or sits in a run's ``checkpoints/``."""
    path = Path(path)
    return (path / MANIFEST).exists() or (path / RUN_STATE).exists() or path.resolve().parent.name == CHECKPOINTS


def newest_complete(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(newest complete checkpoint or None, [(newer incomplete checkpoint, why)])."""
    skipped = []
    for path in _step_dirs(run_dir):
        why = problem(path)
        if not why:
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def latest_checkpoint(run_dir: Path) -> Path | None:
    return newest_complete(run_dir)[0]


def check_resume(resume: str | None) -> None:
    """ConfigError unless ``resume`` is None or a run dir with a complete checkpoint."""
    if resume is None or not Path(resume).is_dir():
        return  # a missing directory is the config's own check
    newest, skipped = newest_complete(Path(resume))
    if newest is None:
        from rlmix.errors import ConfigError

        why = f" ({skipped[0][0].name}: {skipped[0][1]})" if skipped else ""
        raise ConfigError(f"resume={resume}: no complete checkpoint under {CHECKPOINTS}/{why}; nothing to resume")


def written_by(cfg, model_dir: Path) -> dict:
    """What loading a checkpoint needs of the run that resumes it, recorded with it (``check_fits``): the
    trainer backend, DeepSpeed's ranks and ZeRO stage (its state is sharded by them), and the model's shapes;
    and the learning rate's decay horizon (``schedule_change``)."""
    trainer = {"backend": cfg.trainer.backend.value}
    if trainer["backend"] == "deepspeed":
        trainer |= {"ranks": cfg.trainer.deepspeed.ranks, "zero_stage": cfg.trainer.deepspeed.zero_stage}
    model = cfg.model
    source = f"model.path={model.path}" if model.path else f"model.embedded_version={model.embedded_version.value}"
    schedule = {"lr_schedule": cfg.trainer.lr_schedule.value, "lr_decay_steps": lr_horizon(cfg)}
    return {"trainer": trainer, "model": model_shapes(model_dir), "model_source": source, "schedule": schedule}


def schedule_change(state: RunState, cfg) -> str | None:
    """A line where a resumed run's learning rate decays over another horizon than its checkpoint's, or None.
    With ``trainer.lr_decay_steps`` null the horizon is ``loop.steps``, so a finished run's printed "train N
    steps more" stretches a linear or cosine decay and the rate goes up again at the resumed step. A
    checkpoint from before the horizon was recorded: None (not known)."""
    old = ((state.written_by or {}).get("schedule") or {}).get("lr_decay_steps")
    new, kind = lr_horizon(cfg), cfg.trainer.lr_schedule.value
    if kind == "constant" or not isinstance(old, int) or old == new:
        return None
    return (f"trainer.lr_schedule={kind} decays over {new} trainer steps now, over {old} before: from step "
            f"{state.step} the learning rate follows the new schedule (trainer.lr_decay_steps={old} keeps the old)")


def model_shapes(model_dir: Path) -> dict:
    """What in a model's config.json fixes its parameters' names and shapes: the architecture and the sizes."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return {k: v for k, v in config.items() if k in ("architectures", "model_type", "tie_word_embeddings")
            or (type(v) is int and not k.endswith("_token_id"))}


def _trainer_from_files(checkpoint: Path) -> dict:
    """A checkpoint written before ``written_by`` was recorded: its backend, and DeepSpeed's ranks and ZeRO
    stage, from its files (``zero_stage``: a tuple of the stages they leave open where they cannot tell)."""
    from rlmix.trainers.deepspeed_rank import DS_DIR, DS_TAG

    if not (checkpoint / DS_DIR).is_dir():
        return {"backend": "torch"}
    tag_dir = checkpoint / DS_DIR / DS_TAG
    ranks = len(list(tag_dir.glob("*zero_pp_rank_*_optim_states.pt")))
    return {"backend": "deepspeed"} | ({"ranks": ranks} if ranks else {}) | {"zero_stage": zero_stage_of(tag_dir)}


ZERO_STAGES = (0, 1, 2, 3)


def zero_stage_of(tag_dir: Path) -> int | tuple[int, ...]:
    """The ZeRO stage a DeepSpeed checkpoint was saved with, or the stages its files leave open.

    The model states (``mp_rank_00_model_states.pt``; ZeRO 3: one ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``
    per rank) hold the config the engine ran with, ``ds_config``, read here without the weights (mmap,
    weights only). Without it the names tell what they can: only stage 3 saves model states per rank,
    only stage 0 saves no optimizer partitions (``*zero_pp_rank_<r>_mp_rank_00_optim_states.pt``), and
    stages 1 and 2 name their files alike."""
    import torch

    per_rank = sorted(tag_dir.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
    for path in [tag_dir / "mp_rank_00_model_states.pt", *per_rank[:1]]:
        try:
            stage = torch.load(path, map_location="cpu", mmap=True, weights_only=True)["ds_config"][
                "zero_optimization"]["stage"]
        except Exception:  # absent, another layout, or not a torch file: the names below decide
            continue
        if stage in ZERO_STAGES and type(stage) is int:
            return stage
    if per_rank:
        return 3
    if not any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt")):
        return 0 if (tag_dir / "mp_rank_00_model_states.pt").is_file() else ZERO_STAGES
    return (1, 2)


def _fits(wanted: dict, found: dict) -> bool:
    """``wanted`` (this run's ``written_by`` trainer) can load what ``found`` describes."""
    return all(wanted.get(k) in v if isinstance(v, tuple) else wanted.get(k) == v for k, v in found.items())


def _open_stages(trainer: dict, sep: str = " or ") -> str:
    """The ZeRO stages a checkpoint's files leave open, joined by ``sep`` ('' where they tell the stage)."""
    stages = trainer.get("zero_stage")
    return sep.join(map(str, stages)) if isinstance(stages, tuple) else ""


def _trainer_args(trainer: dict) -> str:
    names = {"ranks": "trainer.deepspeed.ranks", "zero_stage": "trainer.deepspeed.zero_stage"}
    args = [f"trainer={trainer['backend']}", *(f"{names[k]}={v}" for k, v in trainer.items()
                                               if k in names and not isinstance(v, tuple))]
    if _open_stages(trainer):
        args.append(f"trainer.deepspeed.zero_stage={_open_stages(trainer, '|')} (whichever it was trained with)")
    return " ".join(args)


def _trainer_text(trainer: dict) -> str:
    shards = [f"{label} {trainer[k]}" for k, label in (("ranks", "ranks"), ("zero_stage", "ZeRO"))
              if k in trainer and not isinstance(trainer[k], tuple)]
    if _open_stages(trainer):
        shards.append(f"ZeRO {_open_stages(trainer)}: not recorded, and its files do not tell which")
    return f"trainer={trainer['backend']}" + (f" ({', '.join(shards)})" if shards else "")


def check_fits(resume: str, cfg, model_dir: Path) -> str | None:
    """ConfigError where the newest complete checkpoint under ``resume`` cannot load into the trainer or the
    model this run asks for: said before Ray starts, not as a traceback once every process is up. Returns
    what could not be checked (a checkpoint from before the record whose files leave its ZeRO stage open,
    loaded with the stage this run asks for), for the run to log; None when everything was."""
    from rlmix.errors import ConfigError

    checkpoint, _ = newest_complete(Path(resume))
    if checkpoint is None:
        return None
    state = read_run_state(checkpoint)
    record = (state.written_by if state else None) or {}
    wanted = written_by(cfg, model_dir)
    trainer = record.get("trainer") or _trainer_from_files(checkpoint)
    if not _fits(wanted["trainer"], trainer):
        raise ConfigError(f"resume={resume}: its checkpoint {checkpoint.name} was written by {_trainer_text(trainer)}; "
                          f"this run asks for {_trainer_text(wanted['trainer'])}: add {_trainer_args(trainer)}")
    shapes = record.get("model") or model_shapes(checkpoint)
    differ = [f"{k} {shapes[k]} (this run's {wanted['model'][k]})"
              for k in sorted(shapes.keys() & wanted["model"].keys()) if shapes[k] != wanted["model"][k]]
    if differ:
        source = record.get("model_source", "the model.path or model.embedded_version it was trained from")
        raise ConfigError(f"resume={resume}: its checkpoint {checkpoint.name} holds another model than this run's "
                          f"{model_dir} ({'; '.join(differ[:3])}{'; …' * (len(differ) > 3)}): add {source}")
    if _open_stages(trainer):
        return (f"resume={resume}: its checkpoint {checkpoint.name} does not record its ZeRO stage, and its files "
                f"tell only {_open_stages(trainer)}; loading it with trainer.deepspeed.zero_stage="
                f"{wanted['trainer']['zero_stage']} as this run asks (give the stage it was trained with if not)")
    return None


def read_run_state(checkpoint: Path) -> RunState | None:
    path = checkpoint / RUN_STATE
    return RunState(**json.loads(path.read_text())) if path.is_file() else None


def staging_dir(run_dir: Path, step: int) -> Path:
    """An empty directory for the trainer to write step ``step`` into."""
    tmp = Path(run_dir) / CHECKPOINTS / f".{_PREFIX}{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a save that died half-way
    tmp.parent.mkdir(parents=True, exist_ok=True)
    return tmp


def seal(tmp: Path, state: RunState, keep: int) -> Path:
    """Add the run state and the manifest to ``tmp``, rename it into place, prune to ``keep``."""
    (tmp / RUN_STATE).write_text(json.dumps(asdict(state)))
    files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    _write_synced(tmp / MANIFEST, json.dumps({"step": state.step, "files": files}, indent=1))
    final = tmp.parent / f"{_PREFIX}{state.step}"
    if final.exists():  # the same step saved again (e.g. by an earlier part of a resumed run)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    prune(tmp.parent.parent, keep)
    return final


def prune(run_dir: Path, keep: int) -> None:
    """Keep the ``keep`` newest complete checkpoints; drop older ones and incomplete leftovers older than
    them, and the staging directories of saves that never finished (one save runs at a time, and this
    runs once it is sealed)."""
    for staged in (Path(run_dir) / CHECKPOINTS).glob(f".{_PREFIX}*.tmp"):
        shutil.rmtree(staged, ignore_errors=True)
    complete = [p for p in _step_dirs(run_dir) if not problem(p)]
    if len(complete) <= keep:
        return
    oldest_kept = step_of(complete[keep - 1])
    for path in _step_dirs(run_dir):
        if step_of(path) < oldest_kept:
            shutil.rmtree(path, ignore_errors=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
