"""What ``rlmix eval checkpoint=<run dir>`` (or one of its ``checkpoints/step_N``) takes from the run:
its task, model and generation length.

A run directory holds the config Hydra composed for it (``.hydra/config.yaml``) and the group
options it picked (``.hydra/hydra.yaml``, ``hydra.runtime.choices``). Evaluating that run means
evaluating the task it trained on, so the eval command starts from those settings; every key the
command line sets wins over the run's value, and a group option on the command line (``task=...``,
``model=...``) replaces the run's whole group. An option of the run's own config folders
(``--config-dir``, ``hydra.searchpath``: ``hydra.runtime.config_sources``) is found in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmix.errors import ConfigError

# The groups a run hands to its evaluation; ``task.split`` is the evaluation's own choice.
GROUPS = ("task", "model")
NOT_INHERITED = {"task.split"}
# Keys whose values are paths: relative ones are taken from the directory the run was started in.
PATH_VALUES = {"task.train_files", "task.eval_files", "task.tasks_dir", "task.subset_file", "model.path"}


@dataclass(frozen=True)
class RunSettings:
    choices: dict[str, str]  # group -> option the run picked (task=dataset)
    values: dict[str, Any]  # dotted key -> the run's value, for the keys an eval takes over
    searchpath: tuple[str, ...] = ()  # the config folders the run added to rlmix's (file:///abs/dir)


def run_settings(run_dir: Path) -> RunSettings | None:
    """The settings ``run_dir`` was trained with, or None when it is not a run directory; ConfigError
    where its ``.hydra`` files cannot be read."""
    from omegaconf import OmegaConf

    from rlmix.eval.evaluate import load_run_yaml

    config, hydra = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "hydra.yaml"
    if not (config.is_file() and hydra.is_file()):
        return None
    composed = load_run_yaml(config)
    runtime = OmegaConf.select(load_run_yaml(hydra), "hydra.runtime")
    if runtime is None or "cwd" not in runtime:
        raise ConfigError(f"{hydra} is not a run's Hydra record (it has no hydra.runtime.cwd)")
    started_in = Path(runtime.cwd)
    values: dict[str, Any] = {}
    for group in GROUPS:
        if group in composed:
            for key, value in _leaves(group, OmegaConf.to_container(composed[group], resolve=True)):
                if key not in NOT_INHERITED:
                    values[key] = _absolute(value, started_in) if key in PATH_VALUES else value
    max_new_tokens = OmegaConf.select(composed, "loop.max_new_tokens")
    if max_new_tokens is None:
        raise ConfigError(f"{config} is not a run's config (it has no loop.max_new_tokens)")
    values["eval.max_new_tokens"] = max_new_tokens
    choices = {g: runtime.choices[g] for g in GROUPS if runtime.choices.get(g) is not None}
    return RunSettings(choices=choices, values=values, searchpath=_added_sources(runtime, started_in))


# The config sources every run has: Hydra's own, rlmix.conf and the structured configs.
_OWN_SOURCES = {"hydra", "main", "schema"}


def _added_sources(runtime, started_in: Path) -> tuple[str, ...]:
    """The config folders a run added (``--config-dir``, ``hydra.searchpath``), as search path
    entries; a relative folder is taken from the directory the run was started in."""
    added = []
    for source in runtime.get("config_sources") or []:
        if source.provider in _OWN_SOURCES:
            continue
        path = _absolute(source.path, started_in) if source.schema == "file" else source.path
        added.append(f"{source.schema}://{path}")
    return tuple(added)


def _leaves(prefix: str, node: Any):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(f"{prefix}.{key}", value)
    else:
        yield prefix, node


def _absolute(value: Any, base: Path) -> Any:
    if isinstance(value, list):
        return [_absolute(v, base) for v in value]
    if isinstance(value, str) and not Path(value).expanduser().is_absolute():
        return str(base / value)
    return value


def overridden_keys(overrides: list[str]) -> set[str]:
    """The dotted keys (and groups) an override list sets."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)}


def checkpoint_dir(overrides: list[str]) -> Path | None:
    """The ``checkpoint=`` of an override list when it names a directory."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = [o.value() for o in OverridesParser.create().parse_overrides(overrides) if o.key_or_group == "checkpoint"]
    return Path(found[-1]) if found and isinstance(found[-1], str) and Path(found[-1]).is_dir() else None


def group_overrides(settings: RunSettings, overrides: list[str]) -> list[str]:
    """The run's group options (``task=dataset``) ahead of ``overrides``, unless they pick their own,
    and the run's config folders (``hydra.searchpath``) unless they give theirs."""
    given = overridden_keys(overrides)
    picked = [f"{g}={option}" for g, option in settings.choices.items() if g not in given]
    if settings.searchpath and "hydra.searchpath" not in given:
        quoted = ("'" + p.replace("\\", "\\\\").replace("'", "\\'") + "'" for p in settings.searchpath)
        picked.insert(0, f"hydra.searchpath=[{','.join(quoted)}]")
    return picked + overrides


def apply_run_settings(cfg, settings: RunSettings, overrides: list[str]) -> None:
    """Set each of the run's values on the composed ``cfg`` that ``overrides`` leave alone."""
    from omegaconf import OmegaConf

    given = overridden_keys(overrides)
    for key, value in settings.values.items():
        # a key this version's schema lacks is not the eval's to invent
        if _touched(key, given) or not _has(cfg, key):
            continue
        OmegaConf.update(cfg, key, value, merge=False)


def _has(cfg, key: str) -> bool:
    from omegaconf import DictConfig, OmegaConf

    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and last in node.keys()


def _touched(key: str, given: set[str]) -> bool:
    """``key`` or a node above or below it is set on the command line."""
    return any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in given)
