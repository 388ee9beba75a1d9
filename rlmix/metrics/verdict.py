"""What the collapse monitor says: which rule fired, its episodes and warnings, the verdict.

Frozen records with their ``metrics.jsonl`` / ``summary.json`` forms; ``rlmix.metrics.monitor`` makes them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CollapseRule(enum.Enum):
    """Which rule fired. Values are the spelling used in ``reason`` strings and summaries."""

    reward_drop = "reward_drop"
    kl_growth = "kl_growth"
    format_errors = "format_errors"
    grad_spikes = "grad_spikes"
    nonfinite = "nonfinite"


@dataclass(frozen=True)
class Episode:
    """A stretch of updates during which a rule fired (a run is *flagged* once it has one)."""

    start: int  # the step at which the first rule fired
    end: int  # the last step at which a rule still fired (so far, while open)
    steps: int  # updates from start to end, both counted
    reward_fall: float  # deepest fall of the reward EMA below its peak during the episode (0 if no reward)
    rule: CollapseRule  # the first rule that fired at ``start``
    reason: str
    recovered: bool  # the rules stayed quiet for ``recover_steps`` updates afterwards

    def as_summary(self) -> dict[str, bool | int | float | str]:
        return {"start": self.start, "end": self.end, "steps": self.steps, "reward_fall": round(self.reward_fall, 6),
                "recovered": self.recovered, "reason": self.reason}


@dataclass(frozen=True)
class MonitorWarning:
    """A rule that fired alone where it does not flag a run (gradient spikes without a decline)."""

    step: int
    reason: str

    def as_summary(self) -> dict[str, int | str]:
        return {"step": self.step, "reason": self.reason}


@dataclass(frozen=True)
class MonitorVerdict:
    """Collapsed or not, from which step and why; with the episodes and warnings so far.

    Per update (``CollapseMonitor.update``) ``collapse`` says the run is judged collapsed *now*: an
    episode has stayed open ``stop_after`` updates and the run is still down (the lasting rule over the
    last ``lasting.window`` steps), or steps went non-finite. At the end (``CollapseMonitor.finish``)
    it is the lasting rule over the whole run (``rlmix.metrics.lasting``).
    """

    collapse: bool
    step: int | None  # the start of the episode behind the verdict
    reason: str  # "" when no collapse; "<rule>: <numbers>" (several rules joined by "; ")
    rule: CollapseRule | None  # the first rule (in CollapseRule order) that fired at ``step``
    episodes: tuple[Episode, ...] = ()
    warnings: tuple[MonitorWarning, ...] = ()
    # At the end: False for a run that ended before the monitor armed (fewer than ``judged_from`` updates,
    # ``monitor.warmup_steps + monitor.baseline_steps + 1``) and was not failed by ``nonfinite`` (checked
    # from the first update): no rule looked at it, so its ``collapse`` (False) means "not judged", not
    # "no collapse". ``updates``: the updates the monitor saw (a resumed run's replayed rows included).
    judged: bool = True
    updates: int = 0
    judged_from: int = 0

    @property
    def open_episode(self) -> Episode | None:
        return self.episodes[-1] if self.episodes and not self.episodes[-1].recovered else None

    def as_metrics(self) -> dict[str, float | str]:
        """The ``monitor/*`` keys of one ``metrics.jsonl`` row / W&B step."""
        open_ = self.open_episode
        reason = self.reason or (open_.reason if open_ else "")
        return {"monitor/collapse": float(self.collapse), "monitor/episode": float(open_ is not None),
                "monitor/reason": reason, "monitor/warnings": float(len(self.warnings))}

    def as_summary(self) -> dict:
        """The ``collapse`` object of ``summary.json``."""
        return {"verdict": self.collapse, "judged": self.judged, "updates": self.updates,
                "judged_from": self.judged_from, "step": self.step, "reason": self.reason,
                "episodes": [e.as_summary() for e in self.episodes],
                "warnings": [w.as_summary() for w in self.warnings]}


NO_COLLAPSE = MonitorVerdict(collapse=False, step=None, reason="", rule=None)
