"""Schema of ``monitor.*``: the collapse monitor's rules and knobs (docs/math.md §6).

The monitor itself (``rlmix.metrics.monitor``) reads these; defaults live here and nowhere else.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from rlmix.errors import ConfigError


class MonitorAction(enum.Enum):
    """What the training loop does on a collapse verdict. Member names are the YAML spelling."""

    warn = "warn"  # log episodes and warnings, keep training; the verdict is judged at the end
    stop = "stop"  # stop cleanly once an episode is judged lasting (MonitorConfig.stop_after)


@dataclass
class RewardDropRule:
    enabled: bool = True
    drop: float = 0.3  # relative fall of the reward EMA below its running peak
    min_drop: float = 0.05  # absolute floor on the fall, so a peak near 0 does not alarm on noise


@dataclass
class KLGrowthRule:
    enabled: bool = True
    factor: float = 3.0  # EMA of k3 ≥ factor × early baseline (docs/math.md §6: "at least threefold")
    require_decline: bool = True  # joint rule: also needs a falling reward or rising format errors
    reward_decline: float = 0.1  # "falling reward" here: reward EMA ≤ (1 − reward_decline) × peak
    format_increase: float = 0.05  # "rising format errors" here: EMA ≥ baseline + format_increase
    kl_floor: float = 1e-8  # floor on the baseline, so an exactly on-policy start does not divide by 0


@dataclass
class FormatErrorRule:
    enabled: bool = True
    rise: float = 0.2  # absolute rise of the format-error EMA above its early baseline


@dataclass
class GradSpikeRule:
    enabled: bool = True
    factor: float = 5.0  # a spike: grad norm ≥ factor × median of the trailing non-spike norms
    count: int = 3  # spikes needed ...
    window: int = 20  # ... within this many steps; also the length of the median's history
    # Spikes alone are a warning (healthy default runs have them: docs/monitor_and_report.md,
    # "Calibration"); with a falling reward or rising format errors (kl.reward_decline,
    # kl.format_increase) they open an episode like the other rules. false: spikes alone do.
    require_decline: bool = True


@dataclass
class NonFiniteRule:
    enabled: bool = True
    count: int = 3  # consecutive skipped (non-finite) steps; the run then stops as failed


@dataclass
class LastingRule:
    """When a flagged run counts as collapsed: still down at the end (docs/monitor_and_report.md).

    Over the last ``window`` steps, mean reward below the mean of the first ``window`` steps, or mean
    format-error rate above ``format_errors`` (healthy runs: 1-3%). ``rlmix.metrics.lasting``.
    """

    window: int = 10
    format_errors: float = 0.1


# The recent rewards' spread counts once this many are in (rlmix.metrics.monitor._Signal.ema_std).
MIN_NOISE_WINDOW = 10


@dataclass
class MonitorConfig:
    """Schema for ``monitor.*`` (not frozen: Hydra composes into it)."""

    action: MonitorAction = MonitorAction.warn
    warmup_steps: int = 5  # updates that only feed the EMAs (the first steps are the noisiest)
    baseline_steps: int = 10  # updates after warm-up whose raw means are the early baselines
    ema_span: int = 10  # EMA smoothing: alpha = 2 / (ema_span + 1)
    # A reward fall must also exceed this many standard deviations of the reward EMA's own noise, so a
    # noisy but flat run stays quiet. The per-step noise is the larger of the baseline window's spread
    # and that of the last noise_window raw rewards, read from their successive differences (a trend
    # or a fall barely moves those), since a reward that climbs is noisier than it was at the start.
    # 0: the baseline window's spread alone; otherwise at least MIN_NOISE_WINDOW.
    noise_sigmas: float = 5.0
    noise_window: int = 30
    reward: RewardDropRule = field(default_factory=RewardDropRule)
    kl: KLGrowthRule = field(default_factory=KLGrowthRule)
    format: FormatErrorRule = field(default_factory=FormatErrorRule)
    grad: GradSpikeRule = field(default_factory=GradSpikeRule)
    nonfinite: NonFiniteRule = field(default_factory=NonFiniteRule)
    lasting: LastingRule = field(default_factory=LastingRule)
    # action=stop stops a run only once an episode's rules have kept firing this many updates since it
    # opened and the run is still down by the lasting rule over its last lasting.window steps: a dip it
    # recovers from (the healthy runs' episodes in the calibration: 1-13 updates) does not stop it.
    stop_after: int = 20
    # ... and only once it is down past the noise of ten batches: the latest lasting.window's format
    # errors above lasting.format_errors, or its reward below the first window's, by more than this
    # many standard errors (docs/monitor_and_report.md). The end-of-run verdict has no such margin.
    stop_margin_sigmas: float = 2.0
    recover_steps: int = 5  # an episode ends, recovered, after this many updates with no rule firing


def check_monitor(cfg: MonitorConfig) -> None:
    """ConfigError naming the first ``monitor.*`` key out of range."""
    for key, value, low in (
        ("ema_span", cfg.ema_span, 1), ("warmup_steps", cfg.warmup_steps, 0), ("baseline_steps", cfg.baseline_steps, 1),
        ("grad.window", cfg.grad.window, 1), ("grad.count", cfg.grad.count, 1), ("nonfinite.count", cfg.nonfinite.count, 1),
        ("lasting.window", cfg.lasting.window, 1), ("stop_after", cfg.stop_after, 1), ("noise_window", cfg.noise_window, 0),
        ("recover_steps", cfg.recover_steps, 1),
    ):
        if value < low:
            raise ConfigError(f"monitor.{key}={value}: must be >= {low}")
    if 0 < cfg.noise_window < MIN_NOISE_WINDOW:  # fewer values than the noise is read from: never used
        raise ConfigError(f"monitor.noise_window={cfg.noise_window}: must be 0 (off) or >= {MIN_NOISE_WINDOW}")
    for key, value in (("noise_sigmas", cfg.noise_sigmas), ("stop_margin_sigmas", cfg.stop_margin_sigmas),
                       ("reward.drop", cfg.reward.drop),
                       ("reward.min_drop", cfg.reward.min_drop), ("kl.factor", cfg.kl.factor),
                       ("format.rise", cfg.format.rise), ("grad.factor", cfg.grad.factor),
                       ("lasting.format_errors", cfg.lasting.format_errors)):
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"monitor.{key}={value}: must be a finite number >= 0")
