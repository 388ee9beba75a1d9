"""Typed configuration: the one place every default lives.

Each dataclass is registered in Hydra's ConfigStore (``register_configs``), so a YAML typo or a
wrong type fails at load time. The YAML files under ``conf/`` pick values; they never invent keys.
Hydra 1.3 / OmegaConf 2.3 constraints shape this file: enums instead of ``Literal`` (member names
are the YAML spelling), no unions of dataclasses, no frozen schemas.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from rlmix.config.dataset import MISSING, ChatTemplateMode, DatasetTaskConfig
from rlmix.config.deepspeed import DeepSpeedConfig
from rlmix.config.embedded import AgentModelSpec, EmbeddedModelSpec, EmbeddedMoeSpec, EmbeddedVersion
from rlmix.config.monitor import MonitorConfig
from rlmix.config.swebench import MiniCodeAgentConfig, SwebenchProConfig
from rlmix.correction import (
    AdvantageNorm,
    CorrectionMode,
    ISLevel,
    KLEstimator,
    LossAggregation,
    Objective,
    OldLogprobs,
)
from rlmix.correction.weights import MIS_HIGH, MIS_LOW, PPO_EPS_HIGH, PPO_EPS_LOW, TIS_CAP


class SamplerBackend(enum.Enum):
    torch = "torch"
    vllm = "vllm"


class TrainerBackend(enum.Enum):
    torch = "torch"
    deepspeed = "deepspeed"


class AttentionBackward(enum.Enum):
    """The trainer's attention backward on the CPU (rlmix/trainers/attention.py); the forward is the
    same either way."""

    dense = "dense"  # recomputed fp32 probabilities, dense products: faster on the CPU at short lengths
    fused = "fused"  # PyTorch's fused flash-attention backward (transformers' sdpa as it comes)


class TrainerPrecision(enum.Enum):
    """What the trainer's forward and backward compute in, over fp32 master weights; samplers get
    the weights in this format (fp32: bf16)."""

    bf16 = "bf16"  # autocast
    fp16 = "fp16"  # autocast with dynamic loss scaling (the FP16 remedy for train/sample mismatch)
    fp32 = "fp32"


class Overlong(enum.Enum):
    """What becomes of a completion cut at loop.max_new_tokens (rlmix/orchestration/filters.py)."""

    keep = "keep"  # trained like any other (the study's)
    filter = "filter"  # out of the loss; its reward still counts in its group's baseline (DAPO)
    penalty = "penalty"  # loop.overlong_penalty taken off its reward


class LRSchedule(enum.Enum):
    """What follows the warm-up (rlmix/trainers/schedule.py)."""

    constant = "constant"  # the study's: trainer.lr throughout
    linear = "linear"  # linear decay to trainer.lr x trainer.min_lr_ratio
    cosine = "cosine"  # half a cosine down to trainer.lr x trainer.min_lr_ratio


class WandbMode(enum.Enum):
    disabled = "disabled"
    offline = "offline"
    online = "online"


@dataclass
class VllmEngineConfig:
    """vLLM engine settings of one ``backend: vllm`` pool; the field names are ``VllmSampler``'s
    keyword arguments. None means the platform's default, chosen inside the sampler: the GPU
    defaults of vLLM on a GPU, the small-footprint ones of the CPU build on the CPU."""

    tensor_parallel_size: int = 1  # GPUs per sampler instance, all on one node
    gpu_memory_utilization: Optional[float] = None  # in (0, 1]; None: 0.9 on GPUs, 0.15 of host memory on the CPU
    max_model_len: Optional[int] = None  # None: the model's own context length
    kv_cache_dtype: str = "auto"  # auto (the model dtype), bfloat16, fp8, fp8_e4m3, fp8_e5m2 (GPU only)
    quantization: Optional[str] = None  # None: what the pool's precision implies (fp8_e4m3 -> fp8)
    enforce_eager: Optional[bool] = None  # None: eager on the CPU, CUDA graphs on GPUs
    dtype: Optional[str] = None  # bfloat16 float16 float32; None: what the pool's precision implies
    cpu_kv_cache_gib: int = 1  # CPU build only: the KV cache size (VLLM_CPU_KVCACHE_SPACE)


@dataclass
class PoolConfig:
    """One pool of identical sampler instances (one Ray actor each)."""

    accelerator: str = "CPU"  # a key of rlmix.samplers.accelerators.CATALOG
    precision: str = "bf16"  # weight format: fp32 bf16 fp16 fp8_e4m3 fp8_e5m2 int8 int4 nvfp4
    kv_precision: Optional[str] = None  # None: the accelerator's default for this precision
    # fp8 weights: channel (per-channel weights, per-token inputs) or tensor (vLLM's quantization=fp8)
    fp8_scales: str = "channel"
    # GEMM input format; None: the precision's own (fp8 -> fp8 W8A8, else 16-bit); nvfp4: W4A4, int8: W8A8
    linear_inputs: Optional[str] = None
    fp8_attention: bool = False  # over an fp8 KV cache, query and probabilities in fp8 too (FlashAttention-3)
    count: int = 1
    backend: SamplerBackend = SamplerBackend.torch
    top_p: Optional[float] = None  # None: the fleet's default
    top_k: Optional[int] = None  # None: the fleet's default
    allow_emulation: bool = False  # emulate a precision the accelerator lacks (logged as such)
    vllm: VllmEngineConfig = field(default_factory=VllmEngineConfig)  # backend: vllm only


@dataclass
class FleetConfig:
    name: str = "single_bf16"
    # name -> a PoolConfig's keys: untyped so that a pool can be added on the command line
    # (+fleet.pools.<name>={accelerator:L4,precision:int8}); rlmix.config.load.to_pool types each one.
    pools: dict[str, Any] = field(default_factory=dict)
    top_p: float = 1.0  # run-level default for every pool
    top_k: int = 0  # 0 = off
    # Set: every pool serves this weight format, its KV cache in the same (e.g. fp16 with
    # trainer.precision=fp16: the FP16 remedy for the train/sample mismatch). null: per pool.
    precision: Optional[str] = None

    def truncation(self, pool: PoolConfig) -> tuple[float, int]:
        """(top_p, top_k) ``pool`` samples with: its own where set, else the fleet's."""
        return (self.top_p if pool.top_p is None else pool.top_p,
                self.top_k if pool.top_k is None else pool.top_k)


@dataclass
class CorrectionConfig:
    """Objective and off-policy correction (docs/math.md §2–§5)."""

    mode: CorrectionMode = CorrectionMode.sc_mis
    objective: Objective = Objective.reinforce
    # ppo_clip's pi_old: the trainer's own detached log-probs at the weights taking the batch's
    # first update (ratio 1 with one optimizer step: the study's GRPO), or the sampler's (bypass).
    # REINFORCE has no pi_old: only `trainer` is accepted with it.
    old_logprobs: OldLogprobs = OldLogprobs.trainer
    advantage: AdvantageNorm = AdvantageNorm.group_mean
    level: ISLevel = ISLevel.token  # where the weight's ratio is taken: token, sequence, geometric
    aggregation: LossAggregation = LossAggregation.token_mean  # the study's token mean over the step
    low: float = MIS_LOW  # MIS band [low, high] on the ratio at `level`
    high: float = MIS_HIGH
    cap: float = TIS_CAP  # TIS cap on the ratio at `level`
    eps_low: float = PPO_EPS_LOW  # PPO clip range (ppo_clip only)
    eps_high: float = PPO_EPS_HIGH
    num_candidates: int = 128  # K: top-K candidates recorded per token
    support_slots: int = 128  # slots recorded for the top-p/top-k support
    replay_support: bool = True  # renormalise the trainer over the recorded support (§4)
    # Mixture-of-experts models: the trainer's forward uses the experts the sampler chose for each
    # token (rlmix/trainers/routing.py), weighted by its own router; needs a model with experts.
    routing_replay: bool = False
    # Terms beside the objective (rlmix/correction/regularizers.py), 0 in the study: kl_coef x
    # KL(pi || pi_ref) to a frozen copy of the start weights (built only when kl_coef > 0;
    # trainer.ref_on_cpu keeps it in host memory), estimated per token by kl_estimator; and
    # -entropy_coef x the policy's entropy (a bonus; needs the dense (N, V) logits).
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = KLEstimator.k3
    entropy_coef: float = 0.0


@dataclass
class TrainerConfig:
    backend: TrainerBackend = TrainerBackend.torch
    lr: float = 3e-4
    # The schedule, in trainer steps (batches; rlmix/trainers/schedule.py): a linear warm-up over
    # lr_warmup_steps, then constant, linear or cosine decay to lr x min_lr_ratio at lr_decay_steps
    # (null: loop.steps). Logged as train/lr; resumed from the checkpoint's step.
    lr_schedule: LRSchedule = LRSchedule.constant
    lr_warmup_steps: int = 0
    lr_decay_steps: Optional[int] = None
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    micro_batch_size: int = 64  # sequences per forward/backward; gradients accumulate over the batch
    # Optimizer steps per rollout batch (verl's names): the batch is cut into mini-batches of this
    # many groups (prompts), each one optimizer step, and the whole is repeated ppo_epochs times.
    # null: the whole batch, one step (the study's).
    ppo_mini_batch_size: Optional[int] = None
    ppo_epochs: int = 1
    # Padded positions (rows × longest prompt+completion) per forward/backward; rows are packed
    # longest first so mixed lengths waste little on padding. null: blocks of micro_batch_size rows.
    max_tokens_per_micro_batch: Optional[int] = None
    precision: TrainerPrecision = TrainerPrecision.bf16  # autocast dtype over fp32 master weights
    num_threads: Optional[int] = None  # torch threads of the trainer; None: its share of the cores Ray reports
    # Recompute each decoder layer in the backward instead of keeping its activations (HF
    # gradient_checkpointing_enable): less memory for longer sequences, one more forward, same gradients.
    activation_checkpointing: bool = False
    # The attention backward on the CPU: dense (rlmix/trainers/attention.py) or fused (PyTorch's
    # kernel, what every run used before dense existed). The forward is the same; the gradients
    # differ at bf16 rounding, so a run repeats bit for bit only with the setting it ran with.
    attention_backward: AttentionBackward = AttentionBackward.dense
    ref_on_cpu: bool = False  # correction.kl_coef > 0: the reference model in host memory, not the trainer's device
    # Deaths of the trainer actor the run survives: each one starts a new trainer process from the
    # newest complete checkpoint (or the start weights before the first), and the steps after it
    # are trained again. One more death fails the run.
    max_restarts: int = 3
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class ModelConfig:
    path: Optional[str] = None  # any Hugging Face causal-LM directory; None builds the embedded model
    # Which embedded model a run starts from when path is None: v1 (embedded; the Llama agent model for
    # agentic tasks) or v2 (embedded_v2; for agentic tasks the v2 agent model, embedded_v2's shapes and
    # tokenizer warm-started as embedded_agent says). auto, the default: v2 for task=dataset, whose
    # rows are the user's own text (v1 reads only minicode's characters), v1 for the rest.
    embedded_version: EmbeddedVersion = EmbeddedVersion.auto
    embedded: EmbeddedModelSpec = field(default_factory=EmbeddedModelSpec)
    embedded_v2: EmbeddedMoeSpec = field(default_factory=EmbeddedMoeSpec)
    # What agentic tasks (task=minicode_agent, task=swebench_pro) start from when path is None: the v1
    # agent's shapes and warm start; with v2, its context and warm start.
    embedded_agent: AgentModelSpec = field(default_factory=AgentModelSpec)


@dataclass
class MiniCodeTaskConfig:
    name: str = "minicode"
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    split: str = "train"  # evaluation: "test" or "hard51"
    chat_template: ChatTemplateMode = ChatTemplateMode.auto  # auto: the tokenizer's template; raw: none


@dataclass
class MiniCodeTraceTaskConfig(MiniCodeTaskConfig):
    """minicode answered with a worked trace of tries (rlmix/embedded/minicode_trace.py): long answers."""

    name: str = "minicode_trace"
    trace_tries: list[int] = field(default_factory=lambda: [8, 16])
    """[min, max] wrong tries before the right one in a reference trace (the warm start's target)."""


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.offline
    project: str = "rlmix"
    entity: Optional[str] = None
    group: Optional[str] = None  # None: the sweep's name (date, time, experiment) for multiruns, else the run name


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    console_every: int = 1  # print a progress line every N steps
    verbose: bool = False  # stream Ray, vLLM, DeepSpeed, W&B output to the console (else: the run dir's logs)


@dataclass
class LoopConfig:
    """The asynchronous loop (docs/architecture.md, "Process model")."""

    steps: int = 150
    groups_per_step: int = 16  # prompts per trainer step
    group_size: int = 8  # samples per prompt
    groups_per_request: int = 2  # prompts per sampler request
    max_staleness: Optional[int] = None  # trainer version − generating version; None = unbounded
    # Controlled lag (rlmix/orchestration/lag.py): null, the free-running asynchronous loop, where a
    # sample's version depends on process speed. s >= 0: the batch trained at version k is generated
    # from version k − s, request i by sampler i mod n, so one seed gives one run (s = 0: synchronous).
    lag: Optional[int] = None
    buffer_groups: Optional[int] = None  # finished + in-flight groups held ahead; None = 2 × groups_per_step
    weight_sync_every: int = 1  # publish weights every N trainer steps
    temperature: float = 1.0
    max_new_tokens: int = 24
    # DAPO's dynamic sampling: drop groups whose rewards are all equal (no gradient) and request
    # more to fill the batch; a task whose every group scores alike then waits for the watchdog.
    dynamic_sampling: bool = False
    overlong: Overlong = Overlong.keep  # completions cut at max_new_tokens: keep, filter or penalty
    overlong_penalty: float = 1.0  # overlong=penalty: taken off the reward of a cut completion
    sampler_threads: Optional[int] = None  # torch threads per CPU sampler actor; None: 1
    concurrent_requests: Optional[int] = None  # CPU-sampler requests generating at once; None: the samplers' cores
    # Checkpoints (docs/reliability.md): after every N steps or M minutes, whichever comes first,
    # and at the end; 0 switches a trigger off. Only the newest ``keep_checkpoints`` are kept.
    checkpoint_every: int = 25
    checkpoint_every_min: float = 10.0
    keep_checkpoints: int = 2
    sampler_max_restarts: int = 3  # deaths of one sampler actor before it is dropped from the fleet
    step_timeout_s: float = 900.0  # watchdog: no trainer step within this long stops the run as failed


@dataclass
class ClusterConfig:
    address: Optional[str] = None  # None starts a local Ray instance; "auto" joins a running cluster
    num_cpus: Optional[int] = None  # local instance only; None = all cores
    # local instance only: actor processes are forked from one that has imported torch (docs/performance.md)
    fork_workers: bool = True


@dataclass
class EvalConfig:
    k: list[int] = field(default_factory=lambda: [1, 4])
    samples: int = 8  # samples per task (n of pass@k)
    accelerator: str = "CPU"  # the fixed reference backend and precision
    precision: str = "fp32"
    temperature: float = 1.0
    max_new_tokens: int = 24
    # None: <run dir>/eval_<split> (+ -<keys>-<hash> for task settings not the run's: docs/tasks.md),
    # or outputs/eval/<time>_<split>
    out_dir: Optional[str] = None


@dataclass
class ProbeConfig:
    """``rlmix probe``: each pool's mismatch on a fixed prompt set, without training."""

    prompts: int = 16  # prompts from the task's test split, evenly spaced over it
    samples_per_prompt: int = 8
    num_candidates: Optional[int] = None  # K for the SC tail ratio / head mass; None: correction.num_candidates
    out_dir: Optional[str] = None  # None: outputs/probe/<time>


@dataclass
class RunConfig:
    name: str = "default"  # the arm; experiment presets set it
    seed: int = 0
    fleet: FleetConfig = field(default_factory=FleetConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: Any = MISSING  # a group option: MiniCodeTaskConfig (or its trace form), DatasetTaskConfig, MiniCodeAgentConfig or SwebenchProConfig
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    resume: Optional[str] = None  # a run directory to continue from its last checkpoint
    checkpoint: Optional[str] = None  # rlmix eval: a run directory or any HF model dir (None: the base model)


def lr_horizon(cfg: RunConfig) -> int:
    """The trainer step at which the learning rate's decay ends: ``trainer.lr_decay_steps``, or ``loop.steps``."""
    return cfg.loop.steps if cfg.trainer.lr_decay_steps is None else cfg.trainer.lr_decay_steps


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore, once per process (building the structured
    configs is ~0.1 s, and the driver registers from more than one place before Ray starts)."""
    from hydra.core.config_store import ConfigStore

    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    if "run_schema.yaml" in cs.repo:
        return
    run, fleet = OmegaConf.structured(RunConfig), OmegaConf.structured(FleetConfig)
    for pools in (run.fleet.pools, fleet.pools):  # a pool's keys are checked by rlmix.config.load.to_pool
        OmegaConf.set_struct(pools, False)
    cs.store(name="run_schema", node=run)
    cs.store(group="fleet", name="fleet_schema", node=fleet)
    cs.store(group="correction", name="correction_schema", node=CorrectionConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="task", name="minicode_schema", node=MiniCodeTaskConfig)
    cs.store(group="task", name="minicode_trace_schema", node=MiniCodeTraceTaskConfig)
    cs.store(group="task", name="swebench_pro_schema", node=SwebenchProConfig)
    cs.store(group="task", name="dataset_schema", node=DatasetTaskConfig)
    cs.store(group="task", name="minicode_agent_schema", node=MiniCodeAgentConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
