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
    trainer backend, DeepSpeed's ranks and ZeRO stage (its state is sharded by them), and the model's shapes."""
    trainer = {"backend": cfg.trainer.backend.value}
    if trainer["backend"] == "deepspeed":
        trainer |= {"ranks": cfg.trainer.deepspeed.ranks, "zero_stage": cfg.trainer.deepspeed.zero_stage}
    model = cfg.model
    source = f"model.path={model.path}" if model.path else f"model.embedded_version={model.embedded_version.value}"
    return {"trainer": trainer, "model": model_shapes(model_dir), "model_source": source}


def model_shapes(model_dir: Path) -> dict:
    """What in a model's config.json fixes its parameters' names and shapes: the architecture and the sizes."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return {k: v for k, v in config.items() if k in ("architectures", "model_type", "tie_word_embeddings")
            or (type(v) is int and not k.endswith("_token_id"))}


def _trainer_from_files(checkpoint: Path) -> dict:
    """A checkpoint written before ``written_by`` was recorded: its backend, and DeepSpeed's ranks, from its files."""
    from rlmix.trainers.deepspeed_rank import DS_DIR, DS_TAG

    if not (checkpoint / DS_DIR).is_dir():
        return {"backend": "torch"}
    ranks = len(list((checkpoint / DS_DIR / DS_TAG).glob("*zero_pp_rank_*_optim_states.pt")))
    return {"backend": "deepspeed"} | ({"ranks": ranks} if ranks else {})


def _trainer_args(trainer: dict) -> str:
    names = {"ranks": "trainer.deepspeed.ranks", "zero_stage": "trainer.deepspeed.zero_stage"}
    return " ".join([f"trainer={trainer['backend']}", *(f"{names[k]}={v}" for k, v in trainer.items() if k in names)])


def _trainer_text(trainer: dict) -> str:
    shards = [f"{label} {trainer[k]}" for k, label in (("ranks", "ranks"), ("zero_stage", "ZeRO")) if k in trainer]
    return f"trainer={trainer['backend']}" + (f" ({', '.join(shards)})" if shards else "")


def check_fits(resume: str, cfg, model_dir: Path) -> None:
    """ConfigError where the newest complete checkpoint under ``resume`` cannot load into the trainer or the
    model this run asks for: said before Ray starts, not as a traceback once every process is up."""
    from rlmix.errors import ConfigError

    checkpoint, _ = newest_complete(Path(resume))
    if checkpoint is None:
        return
    state = read_run_state(checkpoint)
    record = (state.written_by if state else None) or {}
    wanted = written_by(cfg, model_dir)
    trainer = record.get("trainer") or _trainer_from_files(checkpoint)
    if any(wanted["trainer"].get(k) != v for k, v in trainer.items()):
        raise ConfigError(f"resume={resume}: its checkpoint {checkpoint.name} was written by {_trainer_text(trainer)}; "
                          f"this run asks for {_trainer_text(wanted['trainer'])}: add {_trainer_args(trainer)}")
    shapes = record.get("model") or model_shapes(checkpoint)
    differ = [f"{k} {shapes[k]} (this run's {wanted['model'][k]})"
              for k in sorted(shapes.keys() & wanted["model"].keys()) if shapes[k] != wanted["model"][k]]
    if differ:
        source = record.get("model_source", "the model.path or model.embedded_version it was trained from")
        raise ConfigError(f"resume={resume}: its checkpoint {checkpoint.name} holds another model than this run's "
                          f"{model_dir} ({'; '.join(differ[:3])}{'; …' * (len(differ) > 3)}): add {source}")


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
