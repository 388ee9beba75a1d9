"""Per-sample outcomes -> pass@k summary (docs/math.md §7), run-directory files and a W&B table.

Run directory layout written by ``write_results``::

    eval.json                       summary (see ``summarize``)
    tasks/<task_id>.json            per-task outcome: n, c, per-sample rewards, end reasons, infra failures
    episodes/<task_id>/<sample>.jsonl   written as each episode finishes (``write_episode``)

Infra failures are left out of n (never counted as wrong). A task with fewer than k scored samples
has no pass@k estimate and is listed under ``excluded`` for that k.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rlmix.agentic.episode import END_FORMAT, Episode, turn_dicts
from rlmix.metrics.written import write_result
from rlmix.metrics.passk import mean_pass_at_k


@dataclass(frozen=True)
class SampleOutcome:
    task_id: str
    sample: int
    reward: float  # 1.0 iff every required test passed
    infra_error: str | None  # set: not scored
    end_reason: str  # episode end reason, or "infra_error" when the agent sandbox never started
    actions: int
    format_errors: int
    patch_bytes: int
    grade_attempts: int
    wall_s: float
    patch_error: str | None  # the agent left a repository whose changes could not be captured (scored 0)
    grade_note: str | None = None  # why grading scored 0 where the verifier's output would not say (signal, timeout)


def task_counts(outcomes: Sequence[SampleOutcome]) -> dict[str, tuple[int, int]]:
    """(n scored, c correct) per task, in first-seen order; infra failures are not scored."""
    counts: dict[str, tuple[int, int]] = {}
    for o in outcomes:
        n, c = counts.get(o.task_id, (0, 0))
        if o.infra_error is None:
            n, c = n + 1, c + int(o.reward >= 1.0)
        counts[o.task_id] = (n, c)
    return counts


def pass_at_k_block(counts: dict[str, tuple[int, int]], ks: Sequence[int]) -> dict:
    """{"num_tasks", "pass@k": {"mean", "stderr", "num_tasks", "excluded"}} for one set of tasks."""
    block: dict = {"num_tasks": len(counts)}
    for k in ks:
        usable = {t: nc for t, nc in counts.items() if nc[0] >= k}
        excluded = sorted(set(counts) - set(usable))
        if usable:
            p = mean_pass_at_k(list(usable.values()), k)
            block[f"pass@{k}"] = {"mean": p.mean, "stderr": p.stderr, "num_tasks": p.num_tasks, "excluded": excluded}
        else:
            block[f"pass@{k}"] = {"mean": None, "stderr": None, "num_tasks": 0, "excluded": excluded}
    return block


def summarize(outcomes: Sequence[SampleOutcome], ks: Sequence[int], samples: int, subset_name: str,
              subset_ids: Sequence[str] | None, groups: Mapping[str, Sequence[str]] | None = None) -> dict:
    """The content of eval.json: pass@k over all tasks, over the subset, and over each named group of
    task ids (``groups``, e.g. minicode_agent's ``level1``..``level3``) in ``sets``.

    ``format/error_rate`` = malformed actions / all actions; ``format/episode_end_frac`` = share of
    (started) episodes ended by ``max_format_errors``.
    """
    counts = task_counts(outcomes)
    named = ({subset_name: subset_ids} if subset_ids is not None else {}) | dict(groups or {})
    sets = {"all": pass_at_k_block(counts, ks)}
    sets |= {name: pass_at_k_block({t: counts[t] for t in ids if t in counts}, ks) for name, ids in named.items()}
    started = [o for o in outcomes if o.end_reason != "infra_error"]
    actions = sum(o.actions for o in started)
    infra = [o for o in outcomes if o.infra_error is not None]
    return {
        "samples_per_task": samples,
        "ks": list(ks),
        "sets": sets,
        "format/error_rate": sum(o.format_errors for o in started) / actions if actions else 0.0,
        "format/episode_end_frac": (sum(o.end_reason == END_FORMAT for o in started) / len(started)
                                    if started else 0.0),
        "end_reasons": dict(Counter(o.end_reason for o in outcomes)),
        "infra_failures": {"count": len(infra),
                           "samples": [{"task_id": o.task_id, "sample": o.sample, "error": o.infra_error}
                                       for o in infra]},
        "reward/mean": (sum(o.reward for o in outcomes if o.infra_error is None)
                        / max(1, len(outcomes) - len(infra))),
    }


def flat_metrics(summary: dict) -> dict[str, float]:
    """Scalar keys for W&B / logs: ``eval/<set>/pass@k`` and ``..._stderr``, plus the format rates."""
    out = {k: summary[k] for k in ("format/error_rate", "format/episode_end_frac", "reward/mean")}
    out["eval/infra_failures"] = summary["infra_failures"]["count"]
    for name, block in summary["sets"].items():
        for k in summary["ks"]:
            p = block[f"pass@{k}"]
            if p["mean"] is not None:
                out[f"eval/{name}/pass@{k}"] = p["mean"]
                out[f"eval/{name}/pass@{k}_stderr"] = p["stderr"]
    return out


def write_episode(out_dir: Path, episode: Episode, outcome: SampleOutcome) -> Path:
    """``episodes/<id>/<sample>.jsonl``: one JSON line per turn, then ``{"outcome": ...}``, then (model
    policies only) ``{"tokens": {ids, mask, sampler_logprobs, prompt_len, policy_version}}``, so the
    episode can be trained on later."""
    path = out_dir / "episodes" / episode.task_id / f"{episode.sample}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(t) for t in turn_dicts(episode)] + [json.dumps({"outcome": asdict(outcome)})]
    if episode.tokens.ids:
        lines.append(json.dumps({"tokens": episode.tokens.json_fields()}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_results(out_dir: Path, outcomes: Sequence[SampleOutcome], summary: dict) -> None:
    by_task: dict[str, list[SampleOutcome]] = {}
    for o in outcomes:
        by_task.setdefault(o.task_id, []).append(o)
    counts = task_counts(outcomes)
    (out_dir / "tasks").mkdir(parents=True, exist_ok=True)
    for tid, items in by_task.items():
        n, c = counts[tid]
        doc = {"task_id": tid, "n": n, "c": c, "samples": [asdict(o) for o in items]}
        (out_dir / "tasks" / f"{tid}.json").write_text(json.dumps(doc, indent=1) + "\n")
    # eval.json last and atomically: its presence means the run finished.
    write_result(out_dir / "eval.json", json.dumps(summary, indent=1) + "\n")


def log_wandb(wandb_run, outcomes: Sequence[SampleOutcome], summary: dict, subset_ids: Sequence[str] | None) -> None:
    """A per-task ``wandb.Table`` plus the flat metrics; ``wandb_run=None`` logs nothing."""
    if wandb_run is None:
        return
    import wandb

    subset = set(subset_ids or ())
    table = wandb.Table(columns=["task_id", "in_subset", "n", "c", "pass_rate", "infra_failures"])
    infra = Counter(o.task_id for o in outcomes if o.infra_error is not None)
    for tid, (n, c) in task_counts(outcomes).items():
        table.add_data(tid, tid in subset, n, c, c / n if n else None, infra[tid])
    wandb_run.log({"eval/tasks": table, **flat_metrics(summary)})
