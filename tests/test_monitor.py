"""Collapse monitor on synthetic metric streams (docs/math.md §6).

Expected alarm steps come from the closed form of an EMA's response, written here independently of
the monitor: after a jump from ``a`` to ``b`` the EMA's distance from ``a`` is
``|a − b| (1 − (1 − alpha)^k)`` after ``k`` steps (the jump step counts as 1), and after a ramp
``x_j = a + s (j + 1)`` it is ``s ((j + 1) − ((1 − alpha)/alpha)(1 − (1 − alpha)^(j+1)))``. Noiseless
streams must alarm at exactly that step. Noisy streams get a tolerance derived from the EMA's noise:
with per-step noise σ the EMA's std is ``σ_e = σ sqrt(alpha / (2 − alpha))``; the running peak can sit
up to ~4 σ_e above the level and the current EMA ~4 σ_e below, so the threshold effectively moves by at
most ``δ = 8 σ_e`` and the alarm lies between the closed-form steps for thresholds ``θ ∓ δ``.
"""

from __future__ import annotations

import math
import random

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlmix.errors import ConfigError
from rlmix.metrics.monitor import CollapseMonitor
from rlmix.metrics.verdict import CollapseRule, Episode, MonitorVerdict, MonitorWarning
from rlmix.config.monitor import MonitorAction, MonitorConfig

CFG = MonitorConfig()
ALPHA = 2.0 / (CFG.ema_span + 1)
N_STEPS = 120


def run(stream: list[dict[str, float]], cfg: MonitorConfig = CFG, first_step: int = 0) -> MonitorVerdict:
    """The first flag: the first episode's start, rule and reason as a verdict (no collapse: none).

    When a rule fires is what these streams test; whether the run then counts as collapsed is the
    lasting rule's business (the tests after ``test_a_recovered_dip_is_an_episode_not_a_collapse``).
    """
    monitor = CollapseMonitor(cfg)
    for i, metrics in enumerate(stream):
        monitor.update(first_step + i, metrics)
    episodes = monitor.finish().episodes
    if not episodes:
        return MonitorVerdict(collapse=False, step=None, reason="", rule=None)
    return MonitorVerdict(collapse=True, step=episodes[0].start, reason=episodes[0].reason, rule=episodes[0].rule)


SPIKES_FLAG = MonitorConfig()
SPIKES_FLAG.grad.require_decline = False  # gradient spikes alone open an episode (the rule's own timing)


def stable_stream(seed: int, n: int = N_STEPS) -> list[dict[str, float]]:
    """A healthy run: slowly rising, noisy reward; noisy but level KL, format errors and grad norms."""
    rng = random.Random(seed)
    rows = []
    for t in range(n):
        rows.append({
            "reward/mean": min(1.0, max(0.0, 0.4 + 0.002 * t + rng.gauss(0, 0.05))),
            "mismatch/kl_k3": 1e-3 * math.exp(rng.gauss(0, 0.5)),
            "format/error_rate": min(1.0, max(0.0, 0.2 - 0.0005 * t + rng.gauss(0, 0.04))),
            "train/grad_norm": math.exp(rng.gauss(0, 0.4)),
        })
    return rows


def level_stream(n: int = N_STEPS, **overrides: float) -> list[dict[str, float]]:
    base = {"reward/mean": 0.5, "mismatch/kl_k3": 1e-3, "format/error_rate": 0.2, "train/grad_norm": 1.0}
    return [dict(base, **overrides) for _ in range(n)]


def jump_alarm_step(a: float, b: float, theta: float, start: int, alpha: float = ALPHA) -> int:
    """First step at which an EMA sitting at ``a`` has moved ``theta`` toward ``b`` after a jump at ``start``."""
    assert 0 < theta < abs(a - b)
    k = math.ceil(math.log(1 - theta / abs(a - b)) / math.log(1 - alpha))
    return start + k - 1


def ramp_alarm_step(slope: float, length: int, theta: float, start: int) -> int:
    """First step at which the EMA of a ramp ``a + slope (j + 1)``, j = 0..length-1, has risen ``theta``."""
    for j in range(length):
        rise = slope * ((j + 1) - (1 - ALPHA) / ALPHA * (1 - (1 - ALPHA) ** (j + 1)))
        if rise >= theta:
            return start + j
    raise AssertionError("threshold not crossed within the ramp; the closed form does not apply")


def ema_noise(sigma: float) -> float:
    return sigma * math.sqrt(ALPHA / (2 - ALPHA))


@pytest.mark.parametrize("seed", range(6))
def test_stable_noisy_stream_never_alarms(seed: int) -> None:
    verdict = run(stable_stream(seed, n=300))
    assert verdict == MonitorVerdict(collapse=False, step=None, reason="", rule=None)


@pytest.mark.parametrize(("span", "drop", "expected"), [(10, 0.3, 42), (30, 0.3, 47), (10, 0.6, 46)])
def test_reward_jump_alarms_at_closed_form_step(span: int, drop: float, expected: int) -> None:
    start, a, b = 40, 0.5, 0.1
    stream = level_stream()
    for row in stream[start:]:
        row["reward/mean"] = b
    cfg = MonitorConfig(ema_span=span)
    cfg.reward.drop = drop
    verdict = run(stream, cfg)
    theta = max(drop * a, cfg.reward.min_drop)
    assert verdict.collapse and verdict.rule is CollapseRule.reward_drop
    assert verdict.step == jump_alarm_step(a, b, theta, start, alpha=2 / (span + 1)) == expected
    assert verdict.reason.startswith("reward_drop: ")


def test_reward_drop_near_zero_needs_the_absolute_floor() -> None:
    # From a peak of 0.1 a fall to 0.06 is 40% (> drop) but only 0.04 (< min_drop 0.05): no alarm.
    small, large = level_stream(**{"reward/mean": 0.1}), level_stream(**{"reward/mean": 0.1})
    for row in small[40:]:
        row["reward/mean"] = 0.06
    for row in large[40:]:
        row["reward/mean"] = 0.0
    assert not run(small).collapse
    assert run(large).step == jump_alarm_step(0.1, 0.0, CFG.reward.min_drop, 40)


@pytest.mark.parametrize("seed", range(3))
def test_noisy_reward_jump_alarms_within_derived_tolerance(seed: int) -> None:
    start, a, b, sigma = 60, 0.5, 0.1, 0.03
    rng = random.Random(seed)
    stream = level_stream()
    for t, row in enumerate(stream):
        row["reward/mean"] = (a if t < start else b) + rng.gauss(0, sigma)
    verdict = run(stream)
    theta, delta = max(CFG.reward.drop * a, CFG.reward.min_drop), 8 * ema_noise(sigma)
    assert verdict.rule is CollapseRule.reward_drop
    assert jump_alarm_step(a, b, theta - delta, start) <= verdict.step <= jump_alarm_step(a, b, theta + delta, start)


def kl_with_decline_stream(kl_start: int, reward_start: int) -> list[dict[str, float]]:
    """Reward falls 0.5 → 0.4 (past the joint rule's 10% decline, short of reward_drop's 30%); KL ×10."""
    stream = level_stream()
    for t, row in enumerate(stream):
        row["reward/mean"] = 0.5 if t < reward_start else 0.4
        row["mismatch/kl_k3"] = 1e-3 if t < kl_start else 1e-2
    return stream


def test_kl_growth_with_falling_reward_alarms_when_kl_crosses() -> None:
    # The reward decline starts 10 steps earlier, so the KL crossing is the binding condition.
    verdict = run(kl_with_decline_stream(kl_start=50, reward_start=40))
    theta = (CFG.kl.factor - 1) * 1e-3
    assert verdict.rule is CollapseRule.kl_growth
    assert verdict.step == jump_alarm_step(1e-3, 1e-2, theta, 50) == 51
    assert "reward EMA" in verdict.reason


def test_kl_growth_waits_for_the_reward_decline() -> None:
    # KL jumps first; the joint rule fires only when the reward EMA has fallen 10% (0.05 of a 0.1 drop).
    verdict = run(kl_with_decline_stream(kl_start=40, reward_start=50))
    assert verdict.rule is CollapseRule.kl_growth
    assert verdict.step == jump_alarm_step(0.5, 0.4, CFG.kl.reward_decline * 0.5, 50) == 53


def test_kl_growth_alone_needs_require_decline_off() -> None:
    stream = level_stream()
    for row in stream[50:]:
        row["mismatch/kl_k3"] = 1e-2
    assert not run(stream).collapse
    cfg = MonitorConfig()
    cfg.kl.require_decline = False
    verdict = run(stream, cfg)
    assert verdict.rule is CollapseRule.kl_growth and verdict.step == 51


def test_kl_below_factor_never_alarms_even_with_falling_reward() -> None:
    stream = kl_with_decline_stream(kl_start=50, reward_start=40)
    for row in stream[50:]:
        row["mismatch/kl_k3"] = 2.9e-3  # < 3x the 1e-3 baseline
    assert not run(stream).collapse


@pytest.mark.parametrize(("rise", "expected"), [(0.2, 57), (0.22, 57), (0.23, 58), (0.3, 59)])
def test_format_error_ramp_alarms_at_closed_form_step(rise: float, expected: int) -> None:
    # docs/math.md §5: format errors 21% -> 72% within ~10 steps. At j = 7 the EMA has risen 0.2244.
    start, length = 50, 10
    slope = (0.72 - 0.21) / length
    stream = level_stream(**{"format/error_rate": 0.21})
    for j in range(N_STEPS - start):
        stream[start + j]["format/error_rate"] = 0.21 + slope * min(j + 1, length)
    cfg = MonitorConfig()
    cfg.format.rise = rise
    verdict = run(stream, cfg)
    assert verdict.rule is CollapseRule.format_errors
    assert verdict.step == ramp_alarm_step(slope, length, rise, start) == expected


@pytest.mark.parametrize("seed", range(3))
def test_noisy_format_jump_alarms_within_derived_tolerance(seed: int) -> None:
    # The baseline is a 10-step mean (std σ/sqrt(10) ≈ σ_e at span 10): up to ~4 σ_e off, plus ~4 σ_e
    # on the current EMA, so again δ = 8 σ_e.
    start, a, b, sigma = 60, 0.21, 0.72, 0.04
    rng = random.Random(100 + seed)
    stream = level_stream()
    for t, row in enumerate(stream):
        row["format/error_rate"] = (a if t < start else b) + rng.gauss(0, sigma)
    verdict = run(stream)
    theta, delta = CFG.format.rise, 8 * ema_noise(sigma)
    assert verdict.rule is CollapseRule.format_errors
    assert jump_alarm_step(a, b, theta - delta, start) <= verdict.step <= jump_alarm_step(a, b, theta + delta, start)


def test_grad_spikes_alarm_on_the_count_th_spike_within_the_window() -> None:
    stream = level_stream()
    for t in (50, 55, 62):
        stream[t]["train/grad_norm"] = 10.0
    verdict = run(stream, SPIKES_FLAG)
    assert verdict.rule is CollapseRule.grad_spikes and verdict.step == 62
    assert verdict.reason.startswith("grad_spikes: 3 grad-norm spikes")


def test_grad_spikes_spread_wider_than_the_window_do_not_alarm() -> None:
    stream = level_stream()
    for t in (30, 30 + CFG.grad.window, 30 + 2 * CFG.grad.window):  # never 3 inside one window
        stream[t]["train/grad_norm"] = 10.0
    stream[90]["train/grad_norm"] = 4.9  # below factor 5: not a spike
    assert not run(stream, SPIKES_FLAG).collapse


def test_updates_without_a_gradient_do_not_make_every_update_a_spike() -> None:
    # A stretch where every group scores alike has grad norm 0 at most steps; the ordinary updates
    # between them are not spikes (the reference stays the median of the updates that had a gradient).
    stream = level_stream()
    for t in range(40, N_STEPS):
        stream[t]["train/grad_norm"] = 1.0 if t % 4 == 0 else 0.0
    assert not run(stream, SPIKES_FLAG).collapse
    for t in (80, 84, 88):
        stream[t]["train/grad_norm"] = 10.0  # real spikes against the median of the nonzero norms
    assert run(stream, SPIKES_FLAG).step == 88


def test_non_finite_grad_norm_counts_as_a_spike() -> None:
    stream = level_stream()
    for t in (50, 51, 52):
        stream[t]["train/grad_norm"] = math.inf
    assert run(stream, SPIKES_FLAG).step == 52


def test_disabled_rule_does_not_fire_and_others_still_do() -> None:
    stream = level_stream()
    for row in stream[40:]:
        row["reward/mean"] = 0.1
    for t in (70, 71, 72):
        stream[t]["train/grad_norm"] = 50.0
    cfg = MonitorConfig()
    cfg.reward.enabled = False
    verdict = run(stream, cfg)  # the spikes come with the fall (past kl.reward_decline), so they flag
    assert verdict.rule is CollapseRule.grad_spikes and verdict.step == 72
    assert "with reward EMA" in verdict.reason


def test_nothing_fires_before_warmup_plus_baseline_and_step_is_the_callers() -> None:
    cfg = MonitorConfig(warmup_steps=2, baseline_steps=3)
    cfg.grad.require_decline = False
    stream = level_stream(n=20)
    for t in range(5):
        stream[t]["train/grad_norm"] = 100.0 if t >= 2 else 1.0  # 3 spikes during the baseline window
    monitor = CollapseMonitor(cfg)
    verdicts = [monitor.update(1000 + t, row) for t, row in enumerate(stream)]
    assert not any(v.episodes for v in verdicts[:5])
    assert verdicts[5].episodes[0].start == 1005  # armed at update 5; the spikes are in the window


def test_missing_and_non_finite_metrics_are_skipped() -> None:
    stream = [{"reward/mean": 0.5 if t % 7 else math.nan} for t in range(N_STEPS)]
    assert not run(stream).collapse
    assert not run([{} for _ in range(N_STEPS)]).collapse


def test_verdict_serialisations_match_the_run_dir_contract() -> None:
    episode = Episode(start=42, end=50, steps=9, reward_fall=0.25, rule=CollapseRule.reward_drop,
                      reason="reward_drop: x", recovered=False)
    warning = MonitorWarning(step=30, reason="grad_spikes: y")
    verdict = MonitorVerdict(collapse=True, step=42, reason="reward_drop: x", rule=CollapseRule.reward_drop,
                             episodes=(episode,), warnings=(warning,), updates=60, judged_from=16)
    assert verdict.as_metrics() == {"monitor/collapse": 1.0, "monitor/episode": 1.0, "monitor/reason": "reward_drop: x",
                                    "monitor/warnings": 1.0}
    assert verdict.as_summary() == {
        "verdict": True, "judged": True, "updates": 60, "judged_from": 16, "step": 42, "reason": "reward_drop: x",
        "episodes": [{"start": 42, "end": 50, "steps": 9, "reward_fall": 0.25, "recovered": False,
                      "reason": "reward_drop: x"}],
        "warnings": [{"step": 30, "reason": "grad_spikes: y"}],
    }


def test_config_is_a_valid_omegaconf_schema() -> None:
    schema = OmegaConf.structured(MonitorConfig)
    merged = OmegaConf.merge(schema, OmegaConf.create({"action": "stop", "kl": {"factor": 4.0}, "grad": {"enabled": False}}))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, MonitorConfig)
    assert cfg.action is MonitorAction.stop and cfg.kl.factor == 4.0 and not cfg.grad.enabled
    with pytest.raises(OmegaConfBaseException, match="halt"):
        OmegaConf.merge(schema, OmegaConf.create({"action": "halt"}))
    with pytest.raises(OmegaConfBaseException, match="factr"):
        OmegaConf.merge(schema, OmegaConf.create({"kl": {"factr": 4.0}}))


def test_impossible_windows_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="monitor.ema_span"):
        CollapseMonitor(MonitorConfig(ema_span=0))
    # A noise window too short for the noise ever to be read from it would be silently ignored.
    with pytest.raises(ConfigError, match=r"monitor.noise_window=5: must be 0 \(off\) or >= 10"):
        CollapseMonitor(MonitorConfig(noise_window=5))
    CollapseMonitor(MonitorConfig(noise_window=0))
    CollapseMonitor(MonitorConfig(noise_window=10))


def test_warmup_values_do_not_set_the_reward_peak() -> None:
    # A lucky first batch (0.9, then 0.5 throughout): the EMA has decayed to 0.646 when warm-up ends,
    # and 0.646 − 0.5 < 0.3 · 0.646, so no alarm; a peak taken from step 0 (0.9) would alarm.
    stream = level_stream()
    stream[0]["reward/mean"] = 0.9
    assert not run(stream).collapse


def _flat_noisy_rewards(seed: int, steps: int = 200) -> list[dict[str, float]]:
    """A run that neither learns nor collapses, at a low reward with large per-step noise (the
    embedded task's batches: the mix of problem levels moves the batch mean by ±0.05)."""
    import random

    rng = random.Random(seed)
    return [
        {"reward/mean": min(max(rng.gauss(0.12, 0.045), 0.0), 1.0), "mismatch/kl_k3": 3e-4 * rng.uniform(0.5, 1.5),
         "format/error_rate": 0.015 * rng.uniform(0.0, 2.0), "train/grad_norm": rng.uniform(0.8, 1.2)}
        for _ in range(steps)
    ]


def _first_alarm(cfg: MonitorConfig, stream) -> int | None:
    monitor = CollapseMonitor(cfg)
    for step, metrics in enumerate(stream, start=1):
        monitor.update(step, metrics)
    return monitor.verdict.step


def test_noise_floor_keeps_a_flat_noisy_low_reward_run_quiet():
    streams = [_flat_noisy_rewards(seed) for seed in range(8)]
    assert all(_first_alarm(MonitorConfig(), s) is None for s in streams)
    # Without the noise floor the same streams alarm: the floor is what keeps them quiet.
    assert any(_first_alarm(MonitorConfig(noise_sigmas=0.0), s) is not None for s in streams)


def _climbing_rewards(seed: int, steps: int = 300, fall_at: int | None = None) -> list[dict[str, float]]:
    """A run that learns: reward 0.07 -> 0.15, its per-step noise growing with it (a binomial-like batch
    mean, 0.03 at the start, 0.07 at the end). ``fall_at``: from there the reward drops to 0.01."""
    rng = random.Random(seed)
    stream = []
    for i in range(steps):
        level = 0.07 + 0.08 * i / steps
        noise = 0.03 + 0.04 * i / steps
        reward = 0.01 if fall_at is not None and i >= fall_at else min(max(rng.gauss(level, noise), 0.0), 1.0)
        stream.append({"reward/mean": reward})
    return stream


def _first_flag(cfg: MonitorConfig, stream) -> int | None:
    monitor = CollapseMonitor(cfg)
    for step, metrics in enumerate(stream, start=1):
        monitor.update(step, metrics)
    episodes = monitor.finish().episodes
    return episodes[0].start if episodes else None


def test_the_noise_floor_follows_a_reward_that_gets_noisier_as_it_climbs():
    """The baseline window sees the quiet start; a floor from it alone flags most learning runs on the
    noise of their later, higher rewards. The recent values' successive differences see the noise at
    its current level, and a real fall (the differences stay small at the new level) still flags."""
    before = MonitorConfig(noise_window=0, noise_sigmas=7.0)  # the baseline's spread alone
    flags = {name: [_first_flag(cfg, _climbing_rewards(seed)) for seed in range(40)]
             for name, cfg in (("before", before), ("now", MonitorConfig()))}
    assert sum(f is not None for f in flags["before"]) >= 25
    assert sum(f is not None for f in flags["now"]) <= 15
    quiet_until_200 = [seed for seed, f in enumerate(flags["now"]) if f is None or f > 200][:8]
    assert len(quiet_until_200) == 8
    for seed in quiet_until_200:
        step = _first_flag(MonitorConfig(), _climbing_rewards(seed, fall_at=200))
        assert step is not None and 200 < step <= 210, (seed, step)


def test_successive_differences_ignore_a_trend():
    from rlmix.metrics.monitor import _successive_std

    assert _successive_std([0.0, 1.0] * 20) == pytest.approx(math.sqrt(0.5))
    assert _successive_std([0.01 * i for i in range(30)]) == pytest.approx(0.01 / math.sqrt(2))


def test_consecutive_skipped_steps_latch_a_nonfinite_verdict_from_the_first_step():
    from rlmix.metrics.verdict import CollapseRule

    monitor = CollapseMonitor(MonitorConfig())  # warm-up and baseline do not delay this rule
    skipped = [0, 1, 1, 2, 3]  # cumulative train/skipped_steps: step 2 skipped, 3 not, then 4 and 5
    verdicts = [monitor.update(i + 1, {"train/skipped_steps": float(s)}) for i, s in enumerate(skipped)]
    assert not any(v.collapse for v in verdicts)  # never 3 in a row
    verdict = monitor.update(6, {"train/skipped_steps": 4.0})
    assert verdict.collapse and verdict.rule is CollapseRule.nonfinite and verdict.step == 6
    assert "3 consecutive" in verdict.reason


def test_a_run_that_skips_its_very_first_steps_is_caught():
    from rlmix.metrics.verdict import CollapseRule

    monitor = CollapseMonitor(MonitorConfig())
    for step in (1, 2, 3):
        verdict = monitor.update(step, {"train/skipped_steps": float(step)})
    assert verdict.rule is CollapseRule.nonfinite and verdict.step == 3


# --- Episodes, warnings and the lasting verdict (docs/monitor_and_report.md, "Verdict") ---------


def low_format_level() -> list[dict[str, float]]:
    """level_stream with a healthy run's format-error rate (2%, under the lasting rule's 10%)."""
    return level_stream(**{"format/error_rate": 0.02})


def feed(stream: list[dict[str, float]], cfg: MonitorConfig = CFG) -> tuple[CollapseMonitor, list[MonitorVerdict]]:
    monitor = CollapseMonitor(cfg)
    return monitor, [monitor.update(t, row) for t, row in enumerate(stream)]


def test_a_recovered_dip_is_an_episode_not_a_collapse() -> None:
    # Reward 0.5, down to 0.1 for steps 40-49, back to 0.5: reward_drop fires at 42 (the closed form)
    # and stays on while the EMA is more than 0.15 below the peak: k steps after 49 the EMA is
    # 0.5 - 0.4 (9/11)^10 (9/11)^k, back above 0.35 at k = 5 (step 54), so it last fires at 53. Quiet
    # for recover_steps (5) updates, the episode closes as recovered at update 58.
    stream = low_format_level()
    for row in stream[40:50]:
        row["reward/mean"] = 0.1
    monitor, verdicts = feed(stream)
    end = monitor.finish()
    assert not end.collapse and end.step is None and end.reason == ""
    (episode,) = end.episodes
    assert (episode.start, episode.end, episode.steps, episode.recovered) == (42, 53, 12, True)
    assert episode.rule is CollapseRule.reward_drop and episode.reason.startswith("reward_drop: ")
    assert episode.reward_fall == pytest.approx(0.4 * (1 - (1 - ALPHA) ** 10))  # the EMA's lowest point, step 49
    assert [v.as_metrics()["monitor/episode"] for v in verdicts[41:59]] == [0.0] + [1.0] * 16 + [0.0]
    assert not any(v.collapse for v in verdicts)  # never judged collapsed along the way


def test_a_lasting_fall_is_collapsed_at_its_first_flag() -> None:
    stream = low_format_level()
    for row in stream[40:]:
        row["reward/mean"] = 0.1  # never comes back: the last 10 steps sit below the first 10
    monitor, verdicts = feed(stream)
    end = monitor.finish()
    assert end.collapse and end.step == 42 and end.rule is CollapseRule.reward_drop
    assert end.reason == end.episodes[0].reason and not end.episodes[0].recovered
    # Judged along the way once the episode has been open stop_after (20) updates: step 42 + 19.
    first = next(v for v in verdicts if v.collapse)
    assert verdicts.index(first) == 42 + CFG.stop_after - 1 and first.step == 42


def test_a_flagged_run_that_ends_above_its_start_is_not_collapsed() -> None:
    # Reward 0.1 during warm-up, then 0.5 (first 10 steps' mean: 0.3); falls to 0.32 at step 60,
    # flagged (0.18 >= 0.3 x 0.5) and open to the end, but above the start.
    stream = low_format_level()
    for t, row in enumerate(stream):
        row["reward/mean"] = 0.1 if t < 5 else 0.5 if t < 60 else 0.32
    end = feed(stream)[0].finish()
    assert end.episodes and not end.episodes[-1].recovered and not end.collapse


def test_format_errors_above_the_lasting_threshold_keep_a_flagged_run_collapsed() -> None:
    stream = low_format_level()
    for row in stream[60:]:
        row["format/error_rate"] = 0.5  # the reward holds, the format breaks
    end = feed(stream)[0].finish()
    assert end.collapse and end.rule is CollapseRule.format_errors


def test_grad_spikes_alone_warn_once_and_never_flag() -> None:
    stream = low_format_level()
    for t in (50, 55, 62, 64):
        stream[t]["train/grad_norm"] = 10.0
    monitor, verdicts = feed(stream)
    end = monitor.finish()
    assert not end.collapse and end.episodes == ()
    assert [(w.step, w.reason.split(":")[0]) for w in end.warnings] == [(62, "grad_spikes")]  # one per stretch
    assert verdicts[62].as_metrics()["monitor/warnings"] == 1.0 and verdicts[61].as_metrics()["monitor/warnings"] == 0.0


def test_grad_spikes_with_a_reward_fall_still_collapse() -> None:
    # Reward 0.5 -> 0.42 from step 40: past kl.reward_decline (10%) but short of reward_drop (30%), so
    # only the spikes can flag, and they do, jointly with the fall; the run ends below its start.
    stream = low_format_level()
    for row in stream[40:]:
        row["reward/mean"] = 0.42
    for t in (60, 61, 62):
        stream[t]["train/grad_norm"] = 10.0
    end = feed(stream)[0].finish()
    assert end.collapse and end.rule is CollapseRule.grad_spikes and end.step == 62
    assert "with reward EMA" in end.reason and end.warnings == ()


def test_action_stop_waits_until_the_episode_is_judged_lasting() -> None:
    # A 12-step dip to 0: reward_drop fires from 41 to 56 (16 updates), never stop_after (20) in a
    # row, so it would not stop the run, although its last 10 steps still sit below the start.
    dip = low_format_level()
    for row in dip[40:52]:
        row["reward/mean"] = 0.0
    monitor, verdicts = feed(dip)
    assert not any(v.collapse for v in verdicts)
    assert monitor.finish().episodes[0].recovered and monitor.finish().episodes[0].steps == 16


def test_lasting_rule_is_the_one_function(tmp_path) -> None:
    from rlmix.metrics.lasting import lasting, lasting_series

    assert lasting(True, 0.07, 0.06, 0.02) and lasting(True, 0.07, 0.12, 0.11)
    assert not lasting(True, 0.07, 0.12, 0.02) and not lasting(False, 0.07, 0.0, 1.0)
    rewards = [0.07] * 10 + [0.2] * 40 + [0.05] * 10
    assert lasting_series(True, rewards, [0.01] * 60) and not lasting_series(True, rewards[:-10], [0.01] * 50)
    assert not lasting_series(True, rewards[:-10], [])  # no format errors logged: reward alone decides


def test_new_knobs_are_validated_with_one_line() -> None:
    for bad, key in ((MonitorConfig(stop_after=0), "monitor.stop_after"),
                     (MonitorConfig(recover_steps=0), "monitor.recover_steps")):
        with pytest.raises(ConfigError, match=key):
            CollapseMonitor(bad)
    cfg = MonitorConfig()
    cfg.lasting.format_errors = math.nan
    with pytest.raises(ConfigError, match="monitor.lasting.format_errors"):
        CollapseMonitor(cfg)


def test_action_stop_needs_the_run_down_past_the_noise_of_its_windows() -> None:
    """A healthy v2 run (docs/monitor_and_report.md, "Calibration") had ten steps of 10.4% format
    errors while an episode was open: above lasting.format_errors, within its noise. Stopping is
    irreversible, so it waits for the fall to clear stop_margin_sigmas standard errors; the end-of-run
    verdict keeps the lasting rule as it is."""
    def kl_episode(formats: list[float], reward=lambda t: 0.5) -> list[dict[str, float]]:
        """KL 5x its baseline from step 40 with format errors past kl.format_increase: flagged from then on."""
        stream = low_format_level()
        for t, row in enumerate(stream):
            row["reward/mean"] = reward(t)
            if t >= 40:
                row["mismatch/kl_k3"] = 5e-3
                row["format/error_rate"] = formats[t % len(formats)]
        return stream

    def stopped(stream, cfg: MonitorConfig = CFG) -> bool:
        monitor, verdicts = feed(stream, cfg)
        assert monitor.finish().episodes  # every stream here is flagged
        return any(v.collapse for v in verdicts)

    noisy = [0.125, 0.117, 0.094, 0.109, 0.031, 0.094, 0.125, 0.125, 0.055, 0.164]  # that run's steps 40-49
    assert sum(noisy) / len(noisy) > CFG.lasting.format_errors
    assert not stopped(kl_episode(noisy))  # down by 0.4 points, with a standard error of 1.1
    assert stopped(kl_episode(noisy), MonitorConfig(stop_margin_sigmas=0.0))  # the rule without a margin
    assert stopped(kl_episode([0.4, 0.5]))  # a format collapse
    rng = random.Random(0)  # a reward fall well past both windows' noise, format errors healthy
    assert stopped(kl_episode([0.02], reward=lambda t: (0.5 if t < 40 else 0.1) + rng.gauss(0, 0.03)))


def test_a_resumed_run_replays_its_non_finite_values_as_the_monitor_saw_them(tmp_path):
    """metrics.jsonl writes a NaN as null; a resumed run's monitor, fed those rows again
    (runner.feed_monitor), must count a NaN gradient norm as the spike the live monitor counted."""
    import json

    from rlmix.metrics.logger import _jsonable
    from rlmix.orchestration.runner import feed_monitor

    rows = [{"reward/mean": 0.5 if step < 25 else 0.42, "mismatch/kl_k3": 1e-3, "format/error_rate": 0.02,
             "train/grad_norm": math.nan if step in (30, 33, 36) else 1.0} for step in range(1, 61)]
    live = CollapseMonitor(MonitorConfig())
    for step, row in enumerate(rows, 1):
        live.update(step, row)
    logged = [json.loads(json.dumps({"step": step, **{k: _jsonable(v) for k, v in row.items()}}))
              for step, row in enumerate(rows, 1)]
    replayed = CollapseMonitor(MonitorConfig())
    feed_monitor(replayed, logged)
    assert live.finish().collapse and replayed.finish() == live.finish()
