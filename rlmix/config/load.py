"""Config becomes a typed object once, here: ``to_run_config`` turns Hydra's composed
``DictConfig`` into a ``RunConfig`` (the dataclasses of ``rlmix.config``), and ``one_line`` turns any
composition error into the single line the CLI prints.

Whether a config can run is asked above, by ``rlmix.assembly.plan.plan_run``: its own cross-field
rules (``rlmix.assembly.rules``), then what only a backend or a task can answer.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from rlmix.config.schema import FleetConfig, PoolConfig, RunConfig
from rlmix.errors import ConfigError

log = logging.getLogger(__name__)


# A pool's settings that belong to its own weight format: a fleet-wide precision resets them.
FORMAT_KNOBS = ("kv_precision", "fp8_scales", "linear_inputs", "fp8_attention")


def to_run_config(cfg: DictConfig) -> RunConfig:
    refuse_added_keys(cfg)
    try:
        run = OmegaConf.to_object(cfg)
    except Exception as err:  # MISSING values and the like surface here
        raise ConfigError(one_line(err)) from None
    if isinstance(run, RunConfig):
        run.fleet.pools = {name: to_pool(name, pool) for name, pool in run.fleet.pools.items()}
        if run.fleet.precision is not None:
            fleet_precision(run.fleet)
    return run


def refuse_added_keys(node, section: str = "") -> None:
    """``+loop.stpes=3`` adds a key Hydra composes without a word and no schema has: ``to_object`` would
    drop it, and the run train with ``loop.steps`` as it was. One line naming it (``unknown_key_line``).
    A key under an untyped mapping (a pool added to ``fleet.pools``) is ``to_pool``'s to check."""
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return
    schema = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        key = str(key)
        if not section and key == "hydra":
            continue
        full = f"{section}.{key}" if section else key
        if fields is not None and key not in fields:
            raise ConfigError(unknown_key_line(full, key, section, fields))
        if fields is not None:  # untyped mappings below a schema (fleet.pools) are left as they are
            refuse_added_keys(node._get_node(key), full)


def to_pool(name: str, pool) -> PoolConfig:
    """One pool merged onto ``PoolConfig``'s defaults. ``fleet.pools`` is an untyped mapping, so that a
    pool can be added on the command line (OmegaConf assigns no plain dict into a typed one); the
    schema's key and type checks happen here, naming the pool's full key."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    key = f"fleet.pools.{name}"
    if not isinstance(pool, Mapping):
        raise ConfigError(f"{key}={pool}: a pool is a mapping, e.g. {key}={{accelerator:L4,precision:int8,count:2}}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PoolConfig), pool))
    except OmegaConfBaseException as err:
        full = f"{key}.{err.full_key}" if getattr(err, "full_key", None) else key
        if isinstance(err, ConfigKeyError):
            known = ", ".join(f.name for f in dataclasses.fields(PoolConfig))
            raise ConfigError(f"{full}: no such key; a pool has {known}") from None
        raise ConfigError(f"{full}: {str(err).splitlines()[0].strip()}") from None


def fleet_precision(fleet: FleetConfig) -> None:
    """``fleet.precision`` replaces each pool's weight format and resets its format knobs, in place (the
    FP16 arm serves every pool in fp16 whatever dose it is swept with). A pool's format setting that
    differs from its fleet's own (the fleet's YAML, or the schema's default for a fleet not shipped
    here) was set beside ``fleet.precision``: replaced too, and said in one line, not dropped unseen."""
    composed = shipped_pools(fleet.name)
    default = PoolConfig()
    for name, pool in fleet.pools.items():
        own = (composed or {}).get(name) or {}
        for knob in ("precision", *FORMAT_KNOBS):
            value, wanted = getattr(pool, knob), fleet.precision if knob == "precision" else getattr(default, knob)
            if composed is None:  # a fleet not shipped here: only the schema's defaults are known
                set_here = knob != "precision" and value != getattr(default, knob)
            else:
                set_here = value != own.get(knob, getattr(default, knob))
            if value != wanted and set_here:
                log.warning("fleet.precision=%s replaces fleet.pools.%s.%s=%s: the fleet-wide format sets every "
                            "pool's precision and resets its %s", fleet.precision, name, knob, _yaml(value),
                            ", ".join(FORMAT_KNOBS))
            setattr(pool, knob, wanted)


def shipped_pools(fleet: str) -> dict | None:
    """The pools of fleet option ``fleet`` as its file in ``rlmix/conf/fleet`` gives them (a fleet's
    ``name`` is its file's); None for a fleet not shipped there."""
    from importlib.resources import files

    path = files("rlmix.conf") / "fleet" / f"{fleet}.yaml"
    if not path.is_file():
        return None
    pools = OmegaConf.to_container(OmegaConf.create(path.read_text()).get("pools") or {})
    return {name: pool for name, pool in pools.items() if isinstance(pool, dict)}


def _yaml(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def one_line(err: BaseException) -> str:
    """A composition/validation error as one line: the key at fault and what is allowed."""
    from hydra.errors import OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

    causes = [err]
    while causes[-1].__cause__ is not None:
        causes.append(causes[-1].__cause__)
    for cause in reversed(causes):
        if isinstance(cause, OverrideParseException):
            return unreadable_override(cause.override, cause.message)
        if isinstance(cause, MissingMandatoryValue) and getattr(cause, "full_key", None):
            return f"{cause.full_key}: not set, and it has no default; give {cause.full_key}=..."
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None) \
                and cause.key is not None:
            return unknown_key(cause)
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            msg = str(cause).splitlines()[0].strip()
            return f"{cause.full_key}: {msg}"
    text = str(err)
    if "Available options in" in text:
        return unknown_option(text)
    ambiguous = re.match(r"Ambiguous value for argument '(.*)'$", text.splitlines()[0] if text else "")
    if ambiguous:
        key, _, value = ambiguous.group(1).partition("=")
        return (f"{ambiguous.group(1)} is a sweep: add -m (rlmix train -m ...), "
                f"or write a list as {key}=[{value}]")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(err).__name__


def unknown_option(text: str) -> str:
    """Hydra's "Could not find 'fleet/nope'" as the user typed it, with the group's options.

    Hydra appends its config search path (providers, ``pkg://`` URLs) and lists the schema
    nodes registered for validation; neither is something a user can pick, so both go.
    """
    import difflib

    missing = re.search(r"Could not find '([^']+)'", text)
    group, _, value = (missing.group(1) if missing else "").rpartition("/")
    block = text.split("Available options in", 1)[1].split("Config search path", 1)[0]
    options = [ln.strip() for ln in block.splitlines()[1:] if ln.startswith("\t") and not ln.strip().endswith("_schema")]
    if not missing:
        return f"unknown config option; available: {', '.join(options)}"
    close = difflib.get_close_matches(value, options, n=1)
    hint = f" (did you mean {group}={close[0]}?)" if close else ""
    return f"{group}={value}: no such option{hint}; available: {', '.join(options)}"


_LISTED_KEYS = 30  # a section with more keys than this is not listed in full


def unknown_key(err) -> str:
    """OmegaConf's "Key 'stpes' not in 'LoopConfig'" in the user's terms: the closest key of that section,
    and the keys it takes (when there are few enough to list)."""
    full, key = err.full_key, str(err.key)
    section = full[: -len(key)].rstrip(".") if full.endswith(key) else full.rpartition(".")[0]
    if err.parent_node is not None:
        keys = [str(k) for k in err.parent_node.keys() if section or k != "hydra"]
    elif dataclasses.is_dataclass(err.object_type):
        keys = [f.name for f in dataclasses.fields(err.object_type)]
    else:
        keys = []
    return unknown_key_line(full, key, section, keys)


def unknown_key_line(full: str, key: str, section: str, keys: list[str]) -> str:
    """``full`` (``key`` in ``section``, '' at the top) is none of ``keys``: one line with the closest."""
    import difflib

    prefix = f"{section}." if section else ""
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    where = section or "the config"
    takes = f" ({where} takes: {', '.join(keys)})" if keys and len(keys) <= _LISTED_KEYS else ""
    return f"{full}: no such key in {where}{hint}{takes}"


_LEXER_ERROR = "LexerNoViableAltException: "
# Hydra's error of a sweep or cast function that parsed: "ValueError while evaluating 'choice()': <why>"
_EVALUATING = re.compile(r"^(\w+) while evaluating '(.*?)': (.*)$")


def unreadable_override(override: str, message: str) -> str:
    """Hydra's override grammar error (``LexerNoViableAltException: ...`` and a caret on a line of its own)
    as one line naming the override, what Hydra could not read and how to quote the value; a function
    Hydra read but could not evaluate (``choice()``) as the override and why."""
    import shlex

    lines = [ln for ln in message.splitlines() if ln.strip() and not ln.startswith("See https://")]
    # Read, but a function of it refused its arguments (choice(), range(1,2,0)): quoting would not help.
    evaluating = next((m for m in map(_EVALUATING.match, lines) if m), None)
    if evaluating:
        return f"{override}: {evaluating.group(3)} ({evaluating.group(1)} in {evaluating.group(2)})"
    if lines and lines[0].startswith(_LEXER_ERROR):
        at = lines[1].index("^") - len(_LEXER_ERROR) if len(lines) > 1 and "^" in lines[1] else -1
        text = lines[0][len(_LEXER_ERROR):]
        what = f"{text[at]!r} unquoted" if 0 <= at < len(text) else "it unquoted"
    else:
        reason = next((ln.strip() for ln in lines if not ln.startswith("Error parsing override")), "")
        what = f"it ({re.sub(r' expecting {.*}$', '', reason)})" if reason else "it"  # not ANTLR's token set
    key, eq, value = override.partition("=")
    if not eq:
        return f"{override}: Hydra's override grammar cannot read {what}; an override is key=value"
    # in a quoted value, a quote and the backslashes before it (or before the closing quote) are escaped
    escaped = re.sub(r'(\\*)("|$)', lambda m: m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else ""), value)
    quoted = shlex.quote(f'{key}="{escaped}"')
    return (f"{override}: Hydra's override grammar cannot read {what}; quote the value inside the shell's quotes, "
            f"as docs/tasks.md shows: {quoted}")
