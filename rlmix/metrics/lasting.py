"""The one rule that turns a flagged run into a collapsed one (docs/monitor_and_report.md, "Verdict").

A run is *collapsed* when the monitor flagged it (at least one episode) and it is still down at the
end: over its last ``window`` steps, the mean reward is below the mean of its first ``window`` steps,
or the mean format-error rate is above ``format_errors``. A flagged run that climbed back had a
recovered episode, not a collapse. The monitor's end-of-run verdict, ``rlmix report`` and
``scripts/reproduce.py`` all call ``lasting``; the thresholds are ``monitor.lasting.*``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from rlmix.config.monitor import LastingRule


def window_mean(values: Sequence[float], part: slice) -> float:
    """Mean of the finite values in ``values[part]``; NaN when there are none."""
    finite = [v for v in list(values)[part] if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def still_down(reward_first: float, reward_last: float, format_last: float,
               rule: LastingRule = LastingRule()) -> bool:
    """Reward over the last window below the first window's, or format errors above the threshold.

    A NaN mean (a metric the run never logged) counts as not down on that metric.
    """
    return reward_last < reward_first or format_last > rule.format_errors


def lasting(flagged: bool, reward_first: float, reward_last: float, format_last: float,
            rule: LastingRule = LastingRule()) -> bool:
    """Flagged and still down at the end: a collapse that lasts."""
    return flagged and still_down(reward_first, reward_last, format_last, rule)


def lasting_series(flagged: bool, rewards: Sequence[float], formats: Sequence[float],
                   rule: LastingRule = LastingRule()) -> bool:
    """``lasting`` over whole per-step series (first and last ``rule.window`` steps)."""
    w = rule.window
    return lasting(flagged, window_mean(rewards, slice(0, w)), window_mean(rewards, slice(-w, None)),
                   window_mean(formats, slice(-w, None)), rule)
