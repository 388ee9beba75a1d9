"""Collapse monitor: turns the per-step metric stream into episodes, warnings and a verdict (docs/math.md §6).

Rules, each with its own knobs and switch, evaluated once per trainer step:

- ``reward_drop``   — the reward EMA falls below its running peak by ``max(drop·|peak|, min_drop)``.
- ``kl_growth``     — the EMA of ``mismatch/kl_k3`` reaches ``factor ×`` its early baseline, jointly with
  a falling reward or rising format errors (the implementable rule written in docs/math.md §6).
- ``format_errors`` — the format-error-rate EMA rises ``rise`` (absolute) above its early baseline
  (the study saw 21% → 72% within ~10 steps, docs/math.md §5).
- ``grad_spikes``   — ``count`` gradient norms of at least ``factor ×`` the trailing median within
  ``window`` steps; with a falling reward or rising format errors (as ``kl_growth``) it flags the run,
  alone it is a *warning* (healthy default runs have spikes: docs/monitor_and_report.md, "Calibration").
- ``nonfinite``     — ``count`` consecutive steps skipped by the trainer (non-finite loss or gradient,
  ``train/skipped_steps``). Checked from the first update: no warm-up excuses a run that cannot learn.

A flagging rule opens an *episode*; it closes, recovered, once no rule has fired for ``recover_steps``
updates. The run's verdict is the lasting rule (``rlmix.metrics.lasting``): flagged (an episode) and
still down at the end. ``update`` also judges it along the way, for ``action=stop``: collapsed once an
episode's rules have kept firing ``stop_after`` updates and the run is down over the last window.

Timeline, counted in updates (not in step numbers, which may start anywhere): updates
``[0, warmup_steps)`` only feed the EMAs; updates ``[warmup_steps, warmup_steps + baseline_steps)``
also form the early baselines (plain means of the raw values) and start the reward peak; from then on
the monitor is *armed* and the rules are checked. A run that ends before the monitor armed (and was not
failed by ``nonfinite``) was never judged: ``finish`` says so (``MonitorVerdict.judged``), so that its
``collapse: false`` is not read as "no collapse".

Noise: every level rule compares an EMA, not the raw value. With ``alpha = 2 / (span + 1)`` and i.i.d.
per-step noise of std ``σ``, the EMA's std is ``σ · sqrt(alpha / (2 − alpha))`` (≈ 0.32σ at the default
span 10), so a stable noisy stream stays far from the thresholds. The price is lag: after a jump from
level ``a`` to ``b`` the EMA is ``b + (a − b)(1 − alpha)^k`` after ``k`` steps, so a rule whose threshold
sits a distance ``θ`` from ``a`` fires ``ceil(ln(1 − θ/|a − b|) / ln(1 − alpha))`` steps after the
jump (the first of them counted as 1). docs/monitor_and_report.md works this through.

Pure Python, no logging, no I/O: the caller writes the verdicts to ``metrics.jsonl``, ``summary.json``
and W&B (``MonitorVerdict.as_metrics`` / ``as_summary``) and acts on ``MonitorConfig.action``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rlmix.config.monitor import MIN_NOISE_WINDOW, MonitorConfig, check_monitor
from rlmix.metrics.lasting import lasting, still_down, window_mean
from rlmix.metrics.names import FORMAT_KEY, GRAD_NORM_KEY, KL_KEY, REWARD_KEY, SKIPPED_STEPS
from rlmix.metrics.verdict import NO_COLLAPSE, CollapseRule, Episode, MonitorVerdict, MonitorWarning


@dataclass
class _OpenEpisode:
    start: int
    start_update: int
    last_update: int
    end: int
    peak: float | None  # the reward peak when it opened
    low: float | None  # the lowest reward EMA since
    rule: CollapseRule
    reason: str

    def close(self, recovered: bool) -> Episode:
        fall = max(self.peak - self.low, 0.0) if self.peak is not None and self.low is not None else 0.0
        return Episode(start=self.start, end=self.end, steps=self.last_update - self.start_update + 1,
                       reward_fall=fall, rule=self.rule, reason=self.reason, recovered=recovered)


class _Ema:
    """Exponential moving average ``e ← e + alpha (x − e)``, started at the first value."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value


class _Signal:
    """One metric's EMA plus its early-baseline mean, (for reward) the running peak of the EMA, and
    (with a ``noise_window``) the last raw values, for the noise at the current level."""

    def __init__(self, alpha: float, noise_window: int = 0) -> None:
        self.ema = _Ema(alpha)
        self.baseline_values: list[float] = []
        self.peak: float | None = None
        self.recent: deque[float] | None = deque(maxlen=noise_window) if noise_window else None

    @property
    def baseline(self) -> float | None:
        return statistics.fmean(self.baseline_values) if self.baseline_values else None

    @property
    def ema_std(self) -> float:
        """Standard deviation of the EMA of i.i.d. noise of std σ: σ·sqrt(α/(2−α)). σ is the larger of
        the baseline's spread and the recent values' (``_successive_std``), once ``MIN_NOISE_WINDOW`` are in."""
        if len(self.baseline_values) < 2:
            return 0.0
        sigma = statistics.pstdev(self.baseline_values)
        if self.recent is not None and len(self.recent) >= MIN_NOISE_WINDOW:
            sigma = max(sigma, _successive_std(self.recent))
        alpha = self.ema.alpha
        return sigma * math.sqrt(alpha / (2.0 - alpha))

    def update(self, x: float, in_baseline: bool, track_peak: bool) -> None:
        if self.recent is not None:
            self.recent.append(x)
        ema = self.ema.update(x)
        if in_baseline:
            self.baseline_values.append(x)
        if track_peak:
            self.peak = ema if self.peak is None else max(self.peak, ema)


def _successive_std(values: Sequence[float]) -> float:
    """σ of i.i.d. noise from successive differences, sqrt(mean((x_t − x_{t−1})²) / 2) (von Neumann):
    a slow trend or a level shift adds little to it, where it would inflate a plain standard deviation."""
    xs = list(values)
    return math.sqrt(statistics.fmean((b - a) ** 2 for a, b in zip(xs, xs[1:])) / 2.0)


def _std_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (0 for fewer than two)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def _finite(metrics: Mapping[str, float], key: str) -> float | None:
    """The metric as a float, or None when absent or not finite (such a step leaves the signal alone)."""
    if key not in metrics:
        return None
    value = float(metrics[key])
    return value if math.isfinite(value) else None


class CollapseMonitor:
    """Stateful, deterministic evaluator of the rules in ``MonitorConfig`` over a metric stream."""

    def __init__(self, cfg: MonitorConfig) -> None:
        check_monitor(cfg)
        self.cfg = cfg
        alpha = 2.0 / (cfg.ema_span + 1)
        self._reward = _Signal(alpha, cfg.noise_window)
        self._kl = _Signal(alpha)
        self._format = _Signal(alpha)
        self._grad_history: deque[float] = deque(maxlen=cfg.grad.window)
        self._spikes: deque[int] = deque()  # update indices of recent spikes
        self._updates = 0
        self._skipped: float | None = None  # the last cumulative skipped-step count
        self._skipped_run = 0  # consecutive skipped steps up to now
        # The lasting rule's windows: the first and the latest ``lasting.window`` raw values.
        self._rewards_first: list[float] = []
        self._rewards_last: deque[float] = deque(maxlen=cfg.lasting.window)
        self._formats_last: deque[float] = deque(maxlen=cfg.lasting.window)
        self._episodes: list[Episode] = []  # closed (recovered) episodes
        self._open: _OpenEpisode | None = None
        self._warnings: list[MonitorWarning] = []
        self._spiking = False  # spikes alone fired at the previous update (one warning per stretch)
        self._failed: MonitorVerdict | None = None  # the non-finite verdict, latched
        self._verdict = NO_COLLAPSE

    @property
    def verdict(self) -> MonitorVerdict:
        """The verdict as of the last update (see ``MonitorVerdict``)."""
        return self._verdict

    def update(self, step: int, metrics: Mapping[str, float]) -> MonitorVerdict:
        """Feed one trainer step's metrics; return the verdict as of this step."""
        i = self._updates
        self._updates += 1
        warm = i >= self.cfg.warmup_steps
        in_baseline = warm and i < self.cfg.warmup_steps + self.cfg.baseline_steps
        armed = i >= self.cfg.warmup_steps + self.cfg.baseline_steps
        for signal, key in ((self._reward, REWARD_KEY), (self._kl, KL_KEY), (self._format, FORMAT_KEY)):
            x = _finite(metrics, key)
            if x is not None:
                signal.update(x, in_baseline, track_peak=warm)
        self._remember(metrics)
        spike = self._grad_spike(i, metrics.get(GRAD_NORM_KEY), warm) if GRAD_NORM_KEY in metrics else ""
        nonfinite = self._nonfinite(_finite(metrics, SKIPPED_STEPS))
        if self._failed is None and nonfinite:
            self._failed = MonitorVerdict(collapse=True, step=step, reason=f"nonfinite: {nonfinite}",
                                          rule=CollapseRule.nonfinite)
        if armed and self._failed is None:
            self._track_episode(i, step, self._flagging(step, self._check_rules(spike)))
        self._verdict = self._judge_now(i)
        return self._verdict

    @property
    def judged_from(self) -> int:
        """The update count from which the rules are checked (armed): ``warmup_steps + baseline_steps + 1``."""
        return self.cfg.warmup_steps + self.cfg.baseline_steps + 1

    @property
    def judged(self) -> bool:
        """Whether the run has been judged: the monitor armed, or the ``nonfinite`` rule (no warm-up) failed it."""
        return self._failed is not None or self._updates >= self.judged_from

    def finish(self) -> MonitorVerdict:
        """The end-of-run verdict: collapsed when flagged and still down at the end (``lasting``);
        ``judged`` False when the run ended before the monitor armed."""
        return replace(self._finish(), judged=self.judged, updates=self._updates, judged_from=self.judged_from)

    def _finish(self) -> MonitorVerdict:
        if self._failed is not None:
            return self._verdict
        episodes = self._all_episodes()
        w = self.cfg.lasting.window
        collapse = lasting(bool(episodes), window_mean(self._rewards_first, slice(0, w)),
                           window_mean(self._rewards_last, slice(None)), window_mean(self._formats_last, slice(None)),
                           self.cfg.lasting)
        if not collapse:
            return MonitorVerdict(False, None, "", None, episodes, tuple(self._warnings))
        last = episodes[-1]
        return MonitorVerdict(True, last.start, last.reason, last.rule, episodes, tuple(self._warnings))

    def _remember(self, metrics: Mapping[str, float]) -> None:
        reward, fmt = _finite(metrics, REWARD_KEY), _finite(metrics, FORMAT_KEY)
        if reward is not None:
            if len(self._rewards_first) < self.cfg.lasting.window:
                self._rewards_first.append(reward)
            self._rewards_last.append(reward)
        if fmt is not None:
            self._formats_last.append(fmt)

    def _flagging(self, step: int, fired: list[tuple[CollapseRule, str]]) -> list[tuple[CollapseRule, str]]:
        """The fired rules that flag the run. Gradient spikes need a declining run (``grad.require_decline``);
        without one they are a warning, recorded once per stretch of updates they keep firing."""
        spikes = [why for rule, why in fired if rule is CollapseRule.grad_spikes]
        flagging = [(rule, why) for rule, why in fired if rule is not CollapseRule.grad_spikes]
        alone = False
        if spikes:
            decline = self._declining()
            if decline or not self.cfg.grad.require_decline:
                flagging.append((CollapseRule.grad_spikes, f"{spikes[0]} with {decline}" if decline else spikes[0]))
            else:
                alone = True
                if not self._spiking:
                    self._warnings.append(MonitorWarning(step, f"grad_spikes: {spikes[0]}"))
        self._spiking = alone
        return flagging

    def _track_episode(self, i: int, step: int, flagging: list[tuple[CollapseRule, str]]) -> None:
        """Open an episode on the first flagging rule; close it, recovered, after ``recover_steps`` quiet updates."""
        ema = self._reward.ema.value
        if flagging and self._open is None:
            reason = "; ".join(f"{rule.value}: {why}" for rule, why in flagging)
            self._open = _OpenEpisode(start=step, start_update=i, last_update=i, end=step, peak=self._reward.peak,
                                      low=ema, rule=flagging[0][0], reason=reason)
        if self._open is None:
            return
        if flagging:
            self._open.last_update, self._open.end = i, step
        if ema is not None:
            self._open.low = ema if self._open.low is None else min(self._open.low, ema)
        if i - self._open.last_update >= self.cfg.recover_steps:
            self._episodes.append(self._open.close(recovered=True))
            self._open = None

    def _all_episodes(self) -> tuple[Episode, ...]:
        return (*self._episodes, *([self._open.close(recovered=False)] if self._open else []))

    def _judge_now(self, i: int) -> MonitorVerdict:
        """Collapsed as of now: an episode whose rules still fire ``stop_after`` updates after it opened,
        and the run down past the noise over the last ``lasting.window`` steps (``_down_past_noise``)."""
        episodes, warnings = self._all_episodes(), tuple(self._warnings)
        if self._failed is not None:
            return replace(self._failed, episodes=episodes, warnings=warnings)
        open_ = self._open
        # The rules still fire now, and have since the episode opened stop_after updates ago.
        lasted = open_ is not None and open_.last_update == i and i - open_.start_update + 1 >= self.cfg.stop_after
        if lasted and self._down_past_noise():
            return MonitorVerdict(True, open_.start, open_.reason, open_.rule, episodes, warnings)
        return MonitorVerdict(False, None, "", None, episodes, warnings)

    def _down_past_noise(self) -> bool:
        """``still_down`` past the noise, for the judgement ``action=stop`` acts on: the latest window's
        mean format-error rate above ``lasting.format_errors``, or its mean reward below the first
        window's, by more than ``stop_margin_sigmas`` standard errors (each window's own spread over
        its steps; for the reward, Welch's error of the difference). Stricter than ``still_down``,
        so a run stopped here ends collapsed."""
        z, rule = self.cfg.stop_margin_sigmas, self.cfg.lasting
        formats = list(self._formats_last)
        if formats and statistics.fmean(formats) - z * _std_error(formats) > rule.format_errors:
            return True
        first, last = self._rewards_first, list(self._rewards_last)
        if not first or not last:
            return False
        margin = z * math.hypot(_std_error(first), _std_error(last))
        return statistics.fmean(last) < statistics.fmean(first) - margin

    def _check_rules(self, spike: str) -> list[tuple[CollapseRule, str]]:
        checks = (
            (CollapseRule.reward_drop, self.cfg.reward.enabled, self._reward_drop),
            (CollapseRule.kl_growth, self.cfg.kl.enabled, self._kl_growth),
            (CollapseRule.format_errors, self.cfg.format.enabled, self._format_rise),
            (CollapseRule.grad_spikes, self.cfg.grad.enabled, lambda: spike),
        )
        return [(rule, why) for rule, enabled, check in checks if enabled and (why := check())]

    def _declining(self) -> str:
        """docs/math.md §6's "declining run": the reward EMA ``reward_decline`` below its peak (and past
        the noise floor) or the format-error EMA ``format_increase`` above its baseline; '' if neither."""
        rule = self.cfg.kl
        return self._reward_falling(rule.reward_decline, 0.0) or self._format_rising(rule.format_increase)

    def _reward_falling(self, drop: float, min_drop: float) -> str:
        """'' unless peak − EMA ≥ max(drop·|peak|, min_drop, noise_sigmas·σ_EMA); else the numbers that show it."""
        ema, peak = self._reward.ema.value, self._reward.peak
        if ema is None or peak is None:
            return ""
        noise_floor = self.cfg.noise_sigmas * self._reward.ema_std
        if peak - ema >= max(drop * abs(peak), min_drop, noise_floor):
            return f"reward EMA {ema:.4g} vs peak {peak:.4g}"
        return ""

    def _format_rising(self, rise: float) -> str:
        ema, base = self._format.ema.value, self._format.baseline
        if ema is None or base is None or ema - base < rise:
            return ""
        return f"format-error EMA {ema:.4g} vs baseline {base:.4g}"

    def _reward_drop(self) -> str:
        return self._reward_falling(self.cfg.reward.drop, self.cfg.reward.min_drop)

    def _format_rise(self) -> str:
        return self._format_rising(self.cfg.format.rise)

    def _kl_growth(self) -> str:
        rule = self.cfg.kl
        ema, base = self._kl.ema.value, self._kl.baseline
        if ema is None or base is None:
            return ""
        base = max(base, rule.kl_floor)
        if ema < rule.factor * base:
            return ""
        why = f"k3 EMA {ema:.4g} = {ema / base:.3g}x baseline {base:.4g}"
        if not rule.require_decline:
            return why
        # docs/math.md §6: KL growth alone is not enough; it must come with a declining run.
        decline = self._declining()
        return f"{why} with {decline}" if decline else ""

    def _nonfinite(self, skipped: float | None) -> str:
        """Count consecutive steps whose cumulative skipped count went up; '' until ``count`` in a row."""
        if skipped is None:
            return ""
        went_up = skipped > self._skipped if self._skipped is not None else skipped > 0
        self._skipped_run = self._skipped_run + 1 if went_up else 0
        self._skipped = skipped
        rule = self.cfg.nonfinite
        if rule.enabled and self._skipped_run >= rule.count:
            return f"{self._skipped_run} consecutive steps skipped as non-finite"
        return ""

    def _grad_spike(self, i: int, raw: float | None, warm: bool) -> str:
        """Record update ``i``'s grad norm; return the spike summary once ``count`` spikes fall in ``window``.

        A non-finite norm counts as a spike. Spikes stay out of the median's history, so a burst of
        spikes does not raise the reference it is compared against. So do norms of exactly 0: an
        update without a learning signal (every group's rewards equal) has no gradient, and a run
        whose groups mostly score alike would otherwise reach a median of 0, against which every
        ordinary update is a spike.
        """
        rule = self.cfg.grad
        value = float(raw) if raw is not None else math.nan
        reference = statistics.median(self._grad_history) if self._grad_history else None
        is_spike = warm and reference is not None and (not math.isfinite(value) or value >= rule.factor * reference)
        if is_spike:
            self._spikes.append(i)
        elif math.isfinite(value) and value > 0:
            self._grad_history.append(value)
        while self._spikes and self._spikes[0] <= i - rule.window:
            self._spikes.popleft()
        if len(self._spikes) >= rule.count and reference is not None:
            return f"{len(self._spikes)} grad-norm spikes >= {rule.factor:g}x median {reference:.4g} within {rule.window} steps"
        return ""
