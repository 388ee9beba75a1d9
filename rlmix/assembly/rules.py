"""The config's own cross-field rules: ``validate(cfg)`` raises ``ConfigError`` naming the keys to change.

What the config alone can answer (docs/math.md §4, batch shapes, the trainer's settings, paths, the
fleet's truncation), checked before anything starts; ``rlmix.assembly.plan.plan_run`` calls
``validate`` first, then asks each pool's backend and the task. The correction is resolved among the
rules (``resolve_correction``) so that its errors keep their place in the order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

from rlmix.config.dataset import DatasetTaskConfig
from rlmix.config.embedded import EmbeddedVersion, MiniCodeAnswer, check_moe_spec, v2_agent_hf_config
from rlmix.config.schema import (
    CorrectionConfig, LRSchedule, MiniCodeTaskConfig, MiniCodeTraceTaskConfig, RunConfig, SamplerBackend,
    TrainerBackend, TrainerPrecision, lr_horizon,
)
from rlmix.config.swebench import AgentEnvConfig
from rlmix.correction import Correction
from rlmix.errors import ConfigError


def validate(cfg: RunConfig, for_training: bool = True) -> Correction:
    """Every cross-field rule, checked before any process starts; returns the resolved correction
    (checked among them, so its errors keep their place in the order)."""
    resolve_embedded_version(cfg)
    _check_loop(cfg)
    _check_trainer(cfg)
    _check_eval(cfg, for_training)
    # Training reads no checkpoint=: it trained from scratch, with the ignored key echoed in its next commands.
    _require(not for_training or cfg.checkpoint is None,
             f"checkpoint={cfg.checkpoint}: rlmix train does not read checkpoint= (the model rlmix eval scores); "
             "to continue a run use resume=<run dir>, to start from other weights use model.path=<dir>")
    correction = resolve_correction(cfg.correction)  # the correction resolves, or ConfigError naming its keys
    _check_run(cfg)
    _check_paths(cfg)  # first: the fleet's checks read the model's config.json
    _check_fleet(cfg)
    return correction


def resolve_embedded_version(cfg: RunConfig) -> None:
    """``model.embedded_version=auto`` made concrete, in place: v2 for ``task=dataset`` (the user's
    text; v1's vocabulary is minicode's 32 characters), v1 for the embedded tasks, whose results
    were measured on it. An explicit v1 or v2 is kept."""
    if cfg.model.embedded_version is EmbeddedVersion.auto:
        dataset = isinstance(cfg.task, DatasetTaskConfig)
        cfg.model.embedded_version = EmbeddedVersion.v2 if dataset else EmbeddedVersion.v1


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_loop(cfg: RunConfig) -> None:
    loop = cfg.loop
    _require(loop.steps >= 1, f"loop.steps={loop.steps}: must be >= 1")
    _require(loop.group_size >= 2, f"loop.group_size={loop.group_size}: group baselines need >= 2 samples per prompt")
    _require(loop.groups_per_request >= 1, f"loop.groups_per_request={loop.groups_per_request}: must be >= 1")
    _require(loop.groups_per_step >= 1, f"loop.groups_per_step={loop.groups_per_step}: must be >= 1")
    _require(
        loop.groups_per_step % loop.groups_per_request == 0,
        f"loop.groups_per_step={loop.groups_per_step} must be a multiple of "
        f"loop.groups_per_request={loop.groups_per_request} (a batch takes whole requests)",
    )
    _require(
        loop.max_staleness is None or loop.max_staleness >= 0,
        f"loop.max_staleness={loop.max_staleness}: must be null (unbounded) or >= 0",
    )
    _require(loop.lag is None or loop.lag >= 0, f"loop.lag={loop.lag}: must be null (free-running) or >= 0")
    _require(
        loop.lag is None or not loop.dynamic_sampling,
        f"loop.lag={loop.lag} with loop.dynamic_sampling=true: dynamic sampling replaces the groups it drops by "
        "asking for more, which a controlled lag's fixed schedule cannot; set loop.lag=null or "
        "loop.dynamic_sampling=false",
    )
    capacity = loop.buffer_groups
    _require(
        capacity is None or capacity >= loop.groups_per_step,
        f"loop.buffer_groups={capacity} must be >= loop.groups_per_step={loop.groups_per_step}",
    )
    # Below 1e-3 the tempered logits overflow BF16/FP8 samplers (every step comes out non-finite).
    _require(TEMPERATURE[0] <= loop.temperature <= TEMPERATURE[1],
             f"loop.temperature={loop.temperature}: must be in [{TEMPERATURE[0]:g}, {TEMPERATURE[1]:g}]")
    for key in ("max_new_tokens", "weight_sync_every", "keep_checkpoints"):
        _require(getattr(loop, key) >= 1, f"loop.{key}={getattr(loop, key)}: must be >= 1")
    # Weights go out every weight_sync_every steps, so the newest a sampler can hold is up to
    # weight_sync_every - 1 versions behind the trainer, and a controlled lag adds its own.
    sync, lag = loop.weight_sync_every, loop.lag
    oldest = (lag or 0) + sync - 1
    if lag is None:
        why = (f"loop.weight_sync_every={sync}: weights are published every {sync} steps, so between publishes "
               "the loop could start no request and the run would wait for ever")
    else:
        why = (f"loop.lag={lag} and loop.weight_sync_every={sync}: samples are generated up to {oldest} versions "
               "behind the step that trains them, so the loop would drop groups it must train")
    _require(loop.max_staleness is None or loop.max_staleness >= oldest,
             f"loop.max_staleness={loop.max_staleness} with {why}; set loop.max_staleness=null or >= {oldest}")
    for key in ("sampler_threads", "concurrent_requests"):  # null: from the cores Ray reports
        value = getattr(loop, key)
        _require(value is None or value >= 1, f"loop.{key}={value}: must be null (from the cores Ray reports) or >= 1")
    _require(math.isfinite(loop.overlong_penalty) and loop.overlong_penalty >= 0,
             f"loop.overlong_penalty={loop.overlong_penalty}: must be >= 0 (taken off a cut completion's reward)")
    _require(loop.sampler_max_restarts >= 0, f"loop.sampler_max_restarts={loop.sampler_max_restarts}: must be >= 0")
    _require(loop.checkpoint_every >= 0, f"loop.checkpoint_every={loop.checkpoint_every}: must be >= 0 (0 = off)")
    _require(math.isfinite(loop.checkpoint_every_min) and loop.checkpoint_every_min >= 0,
             f"loop.checkpoint_every_min={loop.checkpoint_every_min}: must be >= 0 minutes (0 = off)")
    _require(math.isfinite(loop.step_timeout_s) and loop.step_timeout_s > 0,
             f"loop.step_timeout_s={loop.step_timeout_s}: must be > 0 seconds")


TEMPERATURE = (1e-3, 100.0)
POOL_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _check_eval(cfg: RunConfig, for_training: bool) -> None:
    """``eval.*``: the same values are bad whichever command reads them (the sampler raises on a
    temperature <= 0, a negative length is a negative tensor dimension, 0 tokens scores every sample
    as a format error); where the result goes matters to ``rlmix eval`` only."""
    from rlmix.samplers.accelerators import resolve_view

    e = cfg.eval
    _require(e.samples >= 1, f"eval.samples={e.samples}: must be >= 1 (completions per problem, the n of pass@k)")
    _require(bool(e.k) and all(1 <= k <= e.samples for k in e.k),
             f"eval.k={list(e.k)}: every k must be in 1..eval.samples={e.samples} (and at least one given)")
    _require(TEMPERATURE[0] <= e.temperature <= TEMPERATURE[1],
             f"eval.temperature={e.temperature}: must be in [{TEMPERATURE[0]:g}, {TEMPERATURE[1]:g}]")
    _require(e.max_new_tokens >= 1, f"eval.max_new_tokens={e.max_new_tokens}: must be >= 1")
    try:
        resolve_view(e.accelerator, e.precision)
    except ConfigError as err:  # the reference view has no allow_emulation to offer
        why = str(err).split(" (or set allow_emulation")[0]
        raise ConfigError(f"eval.accelerator={e.accelerator} eval.precision={e.precision}: {why}") from None
    if not for_training and e.out_dir is not None:
        check_output_dir("eval.out_dir", e.out_dir)


def _check_trainer(cfg: RunConfig) -> None:
    from rlmix.config.deepspeed import check_deepspeed

    t = cfg.trainer
    _require(t.micro_batch_size >= 1, f"trainer.micro_batch_size={t.micro_batch_size}: must be >= 1")
    _require(t.max_restarts >= 0, f"trainer.max_restarts={t.max_restarts}: must be >= 0 (0: a dead trainer fails the run)")
    budget = t.max_tokens_per_micro_batch
    _require(budget is None or budget >= 1, f"trainer.max_tokens_per_micro_batch={budget}: must be null or >= 1")
    _require(t.num_threads is None or t.num_threads >= 1,
             f"trainer.num_threads={t.num_threads}: must be null (from the cores Ray reports) or >= 1")
    _require(math.isfinite(t.lr) and 0 < t.lr <= 1, f"trainer.lr={t.lr}: must be in (0, 1]")
    _require(t.lr_warmup_steps >= 0, f"trainer.lr_warmup_steps={t.lr_warmup_steps}: must be >= 0 trainer steps")
    _require(t.lr_decay_steps is None or t.lr_decay_steps >= 1,
             f"trainer.lr_decay_steps={t.lr_decay_steps}: must be null (loop.steps) or >= 1 trainer steps")
    _require(math.isfinite(t.min_lr_ratio) and 0 <= t.min_lr_ratio <= 1,
             f"trainer.min_lr_ratio={t.min_lr_ratio}: must be in [0, 1] (the decay's floor as a share of trainer.lr)")
    if t.lr_schedule is LRSchedule.constant:  # no decay: its settings would do nothing
        _require(t.lr_decay_steps is None and t.min_lr_ratio == 0,
                 f"trainer.lr_decay_steps={t.lr_decay_steps} trainer.min_lr_ratio={t.min_lr_ratio}: the constant "
                 "schedule has no decay; set trainer.lr_schedule=linear or cosine, or leave both unset")
    else:
        decay = lr_horizon(cfg)
        _require(decay > t.lr_warmup_steps,
                 f"trainer.lr_decay_steps={decay} (null: loop.steps) must be > trainer.lr_warmup_steps="
                 f"{t.lr_warmup_steps}: the decay ends after the warm-up")
    # AdamW's decoupled decay multiplies each weight by (1 - lr * weight_decay) per step.
    _require(math.isfinite(t.weight_decay) and 0 <= t.weight_decay <= 1, f"trainer.weight_decay={t.weight_decay}: must be in [0, 1]")
    _require(len(t.betas) == 2 and all(math.isfinite(b) and 0 <= b < 1 for b in t.betas),
             f"trainer.betas={list(t.betas)}: need two values, each in [0, 1)")
    # clip_grad_norm_ with a negative max flips the gradient's sign; 0 zeroes every update.
    _require(math.isfinite(t.grad_clip) and t.grad_clip > 0, f"trainer.grad_clip={t.grad_clip}: must be > 0 (a max gradient norm)")
    mini = t.ppo_mini_batch_size
    _require(mini is None or 1 <= mini <= cfg.loop.groups_per_step,
             f"trainer.ppo_mini_batch_size={mini}: must be null (the whole batch) or a number of groups in "
             f"[1, loop.groups_per_step={cfg.loop.groups_per_step}]")
    _require(t.ppo_epochs >= 1, f"trainer.ppo_epochs={t.ppo_epochs}: must be >= 1")
    if t.backend is TrainerBackend.deepspeed:
        check_deepspeed(t.deepspeed, bf16=t.precision is TrainerPrecision.bf16)
        # FP16 ranks need CUDA: a question about the machine, asked by orchestration/hardware.check_machine.


def _check_run(cfg: RunConfig) -> None:
    from rlmix.config.monitor import check_monitor

    check_monitor(cfg.monitor)
    # torch.manual_seed and numpy take a signed 64-bit seed; a larger one killed the processes at start.
    _require(0 <= cfg.seed < 2**63, f"seed={cfg.seed}: must be in [0, 2**63)")
    _require(cfg.logger.console_every >= 1, f"logger.console_every={cfg.logger.console_every}: must be >= 1")
    _require(cfg.cluster.num_cpus is None or cfg.cluster.num_cpus >= 1,
             f"cluster.num_cpus={cfg.cluster.num_cpus}: must be null (all cores) or >= 1")


def check_output_dir(key: str, path: str) -> None:
    """``path`` can be created and written (checked without creating anything)."""
    from rlmix.metrics.written import unwritable

    if (problem := unwritable(path)) is not None:
        existing, why = problem
        raise ConfigError(f"{key}={path}: {existing} {why}")


def held_run(path: str | Path) -> list[str]:
    """What in directory ``path`` belongs to a run (its metrics.jsonl, its checkpoints); [] for none."""
    from rlmix.assembly.checkpoints import CHECKPOINTS
    from rlmix.metrics.jsonl import METRICS_FILE

    return [name for name in (METRICS_FILE, CHECKPOINTS) if (Path(path) / name).exists()]


def check_new_run_dir(key: str, path: str) -> None:
    """A new run's directory holds no earlier run: that run's checkpoints would be pruned, and resumed
    from, as if they were the new run's, and the new rows appended to its metrics.jsonl."""
    held = held_run(path)
    _require(not held, f"{key}={path} already holds a run ({', '.join(held)}): continue it with resume={path}, "
                       "or give this run a directory of its own")


def resolve_correction(c: CorrectionConfig) -> Correction:
    """``correction.*`` resolved (``Correction.resolve``: the one read of the mode's row); ConfigError if it
    cannot be."""
    try:
        return Correction.resolve(**{f.name: getattr(c, f.name) for f in dataclasses.fields(CorrectionConfig)})
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_paths(cfg: RunConfig) -> None:
    for key, value in (("model.path", cfg.model.path), ("resume", cfg.resume)):
        _require(value is None or Path(value).is_dir(), f"{key}={value}: no such directory")
    if cfg.model.path is None and cfg.model.embedded_version is EmbeddedVersion.v2:
        check_moe_spec(cfg.model.embedded_v2)
    _check_embedded_answer(cfg)
    if cfg.model.path is not None:
        _require(
            (Path(cfg.model.path) / "config.json").is_file(),
            f"model.path={cfg.model.path}: not a Hugging Face model directory (no config.json)",
        )


def _check_embedded_answer(cfg: RunConfig) -> None:
    """The embedded model answers minicode in the form its warm start taught (the program, or a
    worked trace then the program): the task must ask for that form."""
    if cfg.model.path is not None or not isinstance(cfg.task, MiniCodeTaskConfig):
        return
    v2 = cfg.model.embedded_version is EmbeddedVersion.v2
    traces = v2 and cfg.model.embedded_v2.answer is MiniCodeAnswer.trace
    if isinstance(cfg.task, MiniCodeTraceTaskConfig):
        _require(traces, f"task=minicode_trace: the embedded model (model.embedded_version={cfg.model.embedded_version.value}) "
                 "was warm-started to answer with the program alone; give a model.path that writes traces, or "
                 "model=embedded_v2 model.embedded_v2.answer=trace (its warm start reaches no reward yet, docs/embedded.md)")
    else:
        _require(not traces, "model.embedded_v2.answer=trace: the model answers with a worked trace; use "
                 "task=minicode_trace, or model.embedded_v2.answer=program for task=minicode")


def model_fields(cfg: RunConfig) -> Mapping | None:
    """``model.path``'s config.json as a mapping; for the embedded v2 model the fields its build
    writes (None: the embedded v1 model, a Llama every backend serves)."""
    if cfg.model.path is None:
        if cfg.model.embedded_version is EmbeddedVersion.v1:
            return None
        if isinstance(cfg.task, AgentEnvConfig):  # the v2 agent model
            return v2_agent_hf_config(cfg.model.embedded_v2, cfg.model.embedded_agent)
        return cfg.model.embedded_v2.hf_config()
    try:
        return json.loads((Path(cfg.model.path) / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"model.path={cfg.model.path}: config.json is not valid JSON ({err.msg})") from None


def _check_activation_checkpointing(cfg: RunConfig, model: Mapping | None) -> None:
    """A model whose class cannot checkpoint its layers is refused before anything starts."""
    if not cfg.trainer.activation_checkpointing or model is None:
        return  # the embedded model is a Llama
    import transformers

    for arch in model.get("architectures") or ():
        cls = getattr(transformers, arch, None)
        _require(cls is None or getattr(cls, "supports_gradient_checkpointing", False),
                 f"trainer.activation_checkpointing=true: {arch} ({cfg.model.path}) does not support gradient "
                 "checkpointing; set it to false")


def _check_routing_replay(cfg: RunConfig, model: Mapping | None) -> None:
    """``correction.routing_replay`` needs experts to replay and a record of the sampler's choices."""
    if not cfg.correction.routing_replay:
        return
    key = "correction.routing_replay=true"
    experts = model is not None and (model.get("num_local_experts") or model.get("num_experts"))
    what = "the embedded model" if model is None else f"model.path={cfg.model.path} (model_type={model.get('model_type')!r})"
    _require(bool(experts), f"{key} needs a mixture-of-experts model: model=embedded_v2 (a small Qwen3-MoE), or a "
             f"model.path of model_type qwen3_moe or mixtral; {what} is dense: set it to false")
    _require(not cfg.trainer.activation_checkpointing,
             f"{key} cannot be combined with trainer.activation_checkpointing=true (the recomputed layers would "
             "route by the trainer's own choice); set one of them to false")
    for name, pool in cfg.fleet.pools.items():
        _require(pool.backend is SamplerBackend.torch,
                 f"{key}: fleet.pools.{name} has backend: {pool.backend.value}, which records no expert choices; "
                 "use torch pools or set it to false")


def model_vocabulary(cfg: RunConfig, model: Mapping | None) -> int | None:
    """The sampler's vocabulary (its logits' width): config.json's ``vocab_size`` (or its language
    model's), else the architecture's default; the embedded v1 model's, its character tokenizer's."""
    from rlmix.samplers.model_config import DEFAULTS

    if model is None:
        from rlmix.embedded.chartok import SPECIAL_TOKENS, char_vocab

        if isinstance(cfg.task, AgentEnvConfig):
            from rlmix.embedded.minicode_agent.model import ALPHABET, ROLE_TOKENS

            return len(SPECIAL_TOKENS) + len(ROLE_TOKENS) + len(set(ALPHABET))
        from rlmix.embedded.minicode import ALPHABET

        return len(char_vocab(ALPHABET))
    text = model.get("text_config") if isinstance(model.get("text_config"), Mapping) else {}
    default = DEFAULTS.get(model.get("model_type"), {}).get("vocab_size")
    vocab = model.get("vocab_size") or text.get("vocab_size") or default
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def model_positions(cfg: RunConfig, model: Mapping | None) -> int | None:
    """The model's context length: the smallest one config.json states (``parts.CONTEXT_KEYS``), else the
    architecture's default; the embedded v1 model's from its spec."""
    from rlmix.assembly.parts import CONTEXT_KEYS
    from rlmix.samplers.model_config import DEFAULTS

    if model is None:
        agent = isinstance(cfg.task, AgentEnvConfig)
        return (cfg.model.embedded_agent if agent else cfg.model.embedded).max_position_embeddings
    text = model.get("text_config") if isinstance(model.get("text_config"), Mapping) else {}
    stated = [v for where in (model, text) for key in CONTEXT_KEYS
              if isinstance(v := where.get(key), int) and not isinstance(v, bool) and v > 0]
    default = DEFAULTS.get(model.get("model_type"), {}).get("max_position_embeddings")
    return min(stated) if stated else default


def _check_vocabulary(cfg: RunConfig, model: Mapping | None, truncating: dict[str, tuple[float, int]]) -> None:
    """Records the sampler can fill: the support of a top-p pool without top-k can grow to the whole
    vocabulary (the sampler refuses a longer one mid-run), and slots beyond the vocabulary are padding
    in every record (the default K=128 stays allowed: the study ran it on the 32-token embedded model)."""
    c = cfg.correction
    if not any(top_k == 0 for _, top_k in truncating.values()) and \
            max(c.num_candidates, c.support_slots) <= CorrectionConfig.num_candidates:
        return
    vocab = model_vocabulary(cfg, model)
    if vocab is None:
        return
    for name, (top_p, top_k) in truncating.items():
        _require(top_k > 0 or c.support_slots >= vocab,
                 f"correction.support_slots={c.support_slots} with fleet.pools.{name} truncating by top_p={top_p} "
                 f"alone: its support can hold every token, so it needs support_slots >= the vocabulary size "
                 f"{vocab}; raise it or set a top_k <= support_slots")
    limit = max(vocab, CorrectionConfig.num_candidates)
    for key in ("num_candidates", "support_slots"):
        value = getattr(c, key)
        _require(value <= limit, f"correction.{key}={value}: the model's vocabulary has {vocab} tokens, so the "
                                 f"slots beyond it are padding in every record; set it <= {limit}")


def _check_context(cfg: RunConfig, model: Mapping | None) -> None:
    """A vLLM pool's ``max_model_len`` fits the model and holds a prompt and the completion budget."""
    from rlmix.samplers.vllm_checks import check_max_model_len

    positions = model_positions(cfg, model)
    for name, pool in cfg.fleet.pools.items():
        if pool.backend is SamplerBackend.vllm:
            check_max_model_len(f"fleet.pools.{name}", pool.vllm.max_model_len, positions, cfg.loop.max_new_tokens)


def _check_fleet(cfg: RunConfig) -> None:
    fleet, c = cfg.fleet, cfg.correction
    _require(bool(fleet.pools), "fleet.pools is empty: a run needs at least one sampler pool")
    model = model_fields(cfg)
    _check_activation_checkpointing(cfg, model)
    _check_routing_replay(cfg, model)
    _check_context(cfg, model)
    truncating, full = {}, []  # pool -> (top_p, top_k) where it truncates; the pools that do not
    for name, pool in fleet.pools.items():
        key = f"fleet.pools.{name}"
        # A pool's name ends its metric keys (mismatch/kl_k3/<pool>), beside the staleness buckets' lag_<a>_<b>.
        _require(POOL_NAME.fullmatch(name) is not None and not name.startswith("lag_"),
                 f"{key}: a pool's name is letters, digits, _ and - (it ends metric keys: .../{name}), and "
                 "not lag_* (the staleness buckets' keys)")
        _require(pool.count >= 1, f"{key}.count={pool.count}: must be >= 1")
        top_p, top_k = fleet.truncation(pool)
        # a value the pool takes from the fleet is named by the fleet's key, the one the user set
        _require(0 < top_p <= 1, f"fleet.top_p={top_p}: must be in (0, 1]"
                 if pool.top_p is None else f"{key}: top_p={top_p} must be in (0, 1]")
        _require(top_k >= 0, f"fleet.top_k={top_k}: must be >= 0 (0 = off)"
                 if pool.top_k is None else f"{key}: top_k={top_k} must be >= 0 (0 = off)")
        if top_p < 1 or top_k > 0:
            truncating[name] = top_p, top_k
            _require(
                c.replay_support,
                f"{key} truncates (top_p={top_p}, top_k={top_k}) but correction.replay_support=false: every ratio "
                "would be scaled by the kept mass (docs/math.md §4); set correction.replay_support=true or top_p=1, top_k=0",
            )
            _require(c.support_slots >= 1, f"correction.support_slots=0 with {key} truncating (top_p={top_p}, "
                     f"top_k={top_k}): no support would be recorded, so the trainer would compare its full log p "
                     "with the truncated q; set correction.support_slots >= 1")
            _require(
                top_k == 0 or c.support_slots >= top_k,
                f"correction.support_slots={c.support_slots} < top_k={top_k} of {key}: the support would not fit",
            )
        else:
            full.append(name)
    # A batch mixes pools, and the trainer replays one kind of record across it: a truncated pool's
    # support (log p renormalised over it, docs/math.md §4) or the full vocabulary. Records with and
    # without a support cannot be trained in one batch.
    _check_vocabulary(cfg, model, truncating)
    if truncating and full:
        cut, (top_p, top_k) = next(iter(truncating.items()))
        _require(False, f"fleet.pools.{cut} truncates (top_p={top_p}, top_k={top_k}) but fleet.pools.{full[0]} does "
                        "not: a batch mixes pools and is trained with one kind of record; truncate every pool or none "
                        "(fleet.top_p, fleet.top_k)")
