"""Every config option composes; presets say what the study's arms are; bad input fails at load time."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest

from rlmix.commands.compose import compose_run_config, expand_jobs, split_args
from rlmix.config.schema import CorrectionConfig, TrainerPrecision
from rlmix.correction import (
    AdvantageNorm,
    CorrectionMode,
    ISLevel,
    LossAggregation,
    Objective,
    OldLogprobs,
    ppo_clip_loss,
    token_loss,
)
from rlmix.errors import ConfigError
from rlmix.samplers.accelerators import KernelFamily
from rlmix.samplers.precision import Precision

CONF = Path(__file__).resolve().parents[1] / "conf"
OPTIONS = sorted(p.relative_to(CONF) for p in CONF.rglob("*.yaml") if p.parent != CONF)


def test_every_option_is_seen():
    # 8 fleets + 6 corrections + 2 trainers + 2 models + 5 tasks + 2 loggers + 13 experiments
    assert len(OPTIONS) == 38, OPTIONS


@pytest.mark.parametrize("option", OPTIONS, ids=str)
def test_every_option_composes(option: Path, request):
    group, name = option.parent.as_posix(), option.stem
    override = f"+{group}={name}" if group == "experiment" else f"{group}={name}"
    extra = {
        "swebench_pro": lambda: ["task.tasks_dir=/nonexistent"],
        "dataset": lambda: [f"task.train_files={CONF.parent / 'examples/arith/train.jsonl'}", "task.prompt_key=question"],
        "sc_mis_replay": lambda: [f"model.path={request.getfixturevalue('tiny_qwen3_moe_dir')}"],  # experts to replay
        "minicode_trace": lambda: ["model=embedded_v2", "model.embedded_v2.answer=trace"],  # writes traces
        # sized for the real models it serves: longer than the embedded model's 256 positions
        "vllm_gpu_mixed": lambda: [f"fleet.pools.{p}.vllm.max_model_len=null" for p in ("h100_fp8", "h200_bf16",
                                                                                        "a100_fp16")],
    }.get(name, list)()
    cfg = compose_run_config([override, *extra], for_training=group != "task")
    if group == "experiment":
        assert cfg.name == name
    elif group == "correction":
        assert cfg.correction.mode is CorrectionMode(name)
    elif group == "fleet":
        assert cfg.fleet.name == name and cfg.fleet.pools


# docs/math.md §5: (objective, pi_old, advantages, correction, level, (low, high), top_p, top_k)
T, S, TOKEN, BAND = OldLogprobs.trainer, OldLogprobs.sampler, ISLevel.token, (0.5, 5.0)
ARMS = {
    "grpo": (Objective.ppo_clip, T, AdvantageNorm.group_mean_std, CorrectionMode.none, TOKEN, BAND, 1.0, 0),
    "icepop": (Objective.ppo_clip, T, AdvantageNorm.group_mean_std, CorrectionMode.mis, TOKEN, BAND, 1.0, 0),
    "ppo_bypass": (Objective.ppo_clip, S, AdvantageNorm.group_mean_std, CorrectionMode.none, TOKEN, BAND, 1.0, 0),
    "sc": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.sc, TOKEN, BAND, 1.0, 0),
    "sc_mis": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.sc_mis, TOKEN, BAND, 1.0, 0),
    "grpo_topp": (Objective.ppo_clip, T, AdvantageNorm.group_mean_std, CorrectionMode.none, TOKEN, BAND, 0.97, 64),
    "sc_mis_topp": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.sc_mis, TOKEN, BAND, 0.97, 64),
    "reinforce": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.none, TOKEN, BAND, 1.0, 0),
    "mis": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.mis, TOKEN, BAND, 1.0, 0),
    "mis_seq": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.mis, ISLevel.sequence, (0.5, 2.0),
                1.0, 0),
    "fp16": (Objective.reinforce, T, AdvantageNorm.group_mean, CorrectionMode.none, TOKEN, BAND, 1.0, 0),
}


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_experiment_presets_are_the_studys_arms(arm):
    cfg = compose_run_config([f"+experiment={arm}"])
    c = cfg.correction
    got = (c.objective, c.old_logprobs, c.advantage, c.mode, c.level, (c.low, c.high), cfg.fleet.top_p, cfg.fleet.top_k)
    assert got == ARMS[arm]
    assert c.aggregation is LossAggregation.token_mean  # the study's token mean, every arm
    assert c.num_candidates == 128
    assert (cfg.trainer.ppo_mini_batch_size, cfg.trainer.ppo_epochs) == (None, 1)  # one optimizer step per batch
    assert cfg.loop.max_staleness is None  # the study's setting: unbounded
    assert cfg.fleet.name == "emulated_hetero6"


def test_every_preset_says_what_it_corrects_and_cites_a_source():
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        if path.stem == "smoke":
            continue
        comment = " ".join(line for line in path.read_text().splitlines() if line.startswith("#"))
        assert "correct" in comment and ("Source" in comment or "source" in comment or "docs/math.md" in comment), path.name


def test_the_fp16_arm_switches_the_trainer_and_every_pool_to_fp16():
    from rlmix.samplers.checks import pool_view

    cfg = compose_run_config(["+experiment=fp16"])
    assert cfg.trainer.precision is TrainerPrecision.fp16
    views = {name: pool_view(name, pool) for name, pool in cfg.fleet.pools.items()}
    assert len(views) == 6
    for view in views.values():  # the pool's own format and KV cache are replaced
        assert (view.weights, view.activations, view.kv_cache) == (Precision.fp16,) * 3
    assert {v.kernel for v in views.values()} == {f for f in KernelFamily if f is not KernelFamily.fp32_softmax}
    assert compose_run_config(["+experiment=sc_mis"]).trainer.precision is TrainerPrecision.bf16


def test_pools_are_a_dict_keyed_by_name():
    cfg = compose_run_config(["fleet.pools.h100_fp8.count=2", "fleet.pools.b200_nvfp4.kv_precision=fp8_e4m3"])
    assert cfg.fleet.pools["h100_fp8"].count == 2
    assert cfg.fleet.pools["b200_nvfp4"].kv_precision == "fp8_e4m3"
    assert len(cfg.fleet.pools) == 6


def test_correction_knobs_are_loss_arguments():
    """A knob that does nothing is a bug: every numeric correction field is a loss keyword."""
    from rlmix.trainers.loss import regularized  # the terms beside the objective: kl_coef, entropy_coef

    params = set(inspect.signature(token_loss).parameters) | set(inspect.signature(ppo_clip_loss).parameters)
    params |= set(inspect.signature(regularized).parameters)
    numeric = [f for f, v in vars(CorrectionConfig()).items() if isinstance(v, float)]
    assert numeric and all(f in params for f in numeric), numeric
    assert {"level", "aggregation", "old"} <= params  # correction.level, .aggregation, .old_logprobs


def test_the_correction_group_resolves_field_for_field():
    """``Correction.resolve`` takes the ``correction`` group's fields one for one, so a new field must
    be resolved (or the resolution refuses to run)."""
    from dataclasses import fields

    from rlmix.correction import Correction

    resolve_kwargs = set(inspect.signature(Correction.resolve).parameters) - {"cls"}
    assert resolve_kwargs == {f.name for f in fields(CorrectionConfig)}


def test_a_mode_row_is_read_in_one_place():
    """Only ``rlmix.correction.variant`` reads ``MODES``; everything else takes the resolved ``Correction``."""
    from pathlib import Path

    import rlmix

    readers = sorted(str(p.relative_to(Path(rlmix.__file__).parent)) for p in Path(rlmix.__file__).parent.rglob("*.py")
                     if "MODES[" in p.read_text() or "MODES.items()" in p.read_text())
    assert readers == ["correction/variant.py"]


def test_resolved_correction_carries_each_arm():
    from rlmix.assembly.rules import resolve_correction
    from rlmix.correction.weights import MaskedIS, NoWeight

    sc_mis = resolve_correction(compose_run_config(["+experiment=sc_mis"]).correction)
    assert sc_mis.centered and isinstance(sc_mis.variant.weight, MaskedIS) and sc_mis.head_size == 128
    grpo = resolve_correction(compose_run_config(["+experiment=grpo"]).correction)
    assert not grpo.centered and isinstance(grpo.variant.weight, NoWeight) and grpo.head_size == 0
    assert grpo.advantage is AdvantageNorm.group_mean_std and grpo.objective is Objective.ppo_clip


BAD = [
    (["fleet=nope"], "fleet"),
    (["trainer.lrr=1e-3"], "trainer.lrr"),
    (["trainer.lr=fast"], "trainer.lr"),
    (["loop.max_staleness=soon"], "loop.max_staleness"),
    (["loop.lag=-1"], "loop.lag"),
    (["loop.lag=2", "loop.max_staleness=1"], "loop.max_staleness"),
    # weights published every 2 steps: no request could start between publishes (the run hung)
    (["loop.max_staleness=0", "loop.weight_sync_every=2"], "loop.weight_sync_every=2"),
    (["loop.lag=1", "loop.max_staleness=1", "loop.weight_sync_every=2"], "loop.max_staleness"),
    # a fixed schedule cannot ask for groups to replace the ones dynamic sampling drops (the run hung)
    (["loop.lag=1", "loop.dynamic_sampling=true"], "loop.dynamic_sampling"),
    (["fleet.pools.a100_bf16.precision=fp8_e4m3"], "fleet.pools.a100_bf16"),
    (["fleet.pools.a100_bf16.accelerator=Z80"], "Z80"),
    (["correction=sc_mis", "correction.objective=ppo_clip"], "correction.objective=ppo_clip"),
    (["fleet.top_p=0.9", "correction.replay_support=false"], "correction.replay_support"),
    (["loop.groups_per_step=5", "loop.groups_per_request=2"], "loop.groups_per_request"),
    (["fleet.top_k=200"], "correction.support_slots"),
    # one pool truncating, the others not: the batch's records could not be concatenated (a traceback)
    (["fleet.pools.h100_fp8.top_p=0.9"], "fleet.pools.h100_fp8"),
    (["task=swebench_pro", "task.tasks_dir="], "task.tasks_dir"),
    (["task=minicode_agent", "task.levels=[4]"], "task.levels"),
    (["task=minicode_agent", "task.concurrent_episodes=-1"], "task.concurrent_episodes"),
    (["trainer.max_tokens_per_micro_batch=0"], "trainer.max_tokens_per_micro_batch"),
    (["task=dataset"], "task.train_files"),
    (["trainer.precision=fp8"], "trainer.precision"),
    (["fleet.precision=fp4"], "fleet.pools"),
]


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose_run_config(overrides)
    message = str(err.value)
    assert key in message and "\n" not in message, message


def test_a_key_with_no_default_says_to_set_it():
    with pytest.raises(ConfigError, match=r"^task.train_files: not set, and it has no default; give task.train_files=\.\.\.$"):
        compose_run_config(["task=dataset"])


def test_deepspeed_fp16_without_cuda_is_refused_before_ray():
    from rlmix.orchestration.hardware import check_machine, visible_gpus

    if visible_gpus():
        pytest.skip("CUDA ranks run DeepSpeed FP16")
    cfg = compose_run_config(["trainer=deepspeed", "trainer.precision=fp16"])  # a valid config ...
    with pytest.raises(ConfigError, match="trainer.precision=fp16 with trainer.backend=deepspeed needs CUDA ranks"):
        check_machine(cfg)  # ... that this machine cannot run
    check_machine(compose_run_config(["trainer=deepspeed", "trainer.precision=fp16", "cluster.address=auto"]))


def test_deepspeed_fp16_machine_check_follows_the_trainers_comm_backend_rule(monkeypatch):
    from rlmix.orchestration import hardware

    monkeypatch.setattr(hardware, "visible_gpus", lambda: 1)  # the machine, not the unit: one GPU
    fp16 = ["trainer=deepspeed", "trainer.precision=fp16"]
    hardware.check_machine(compose_run_config(fp16))  # auto -> NCCL on a GPU: CUDA ranks
    with pytest.raises(ConfigError, match="needs CUDA ranks"):  # gloo ranks are CPU ranks, GPU or not
        hardware.check_machine(compose_run_config([*fp16, "trainer.deepspeed.comm_backend=gloo"]))


def test_unknown_option_lists_the_available_ones():
    with pytest.raises(ConfigError, match="available: .*emulated_hetero6.*single_bf16"):
        compose_run_config(["fleet=nope"])


def test_sweeps_expand_to_one_job_per_combination():
    overrides, multirun, info = split_args(["-m", "correction=sc,sc_mis", "seed=0,1", "--cfg", "job"])
    assert multirun and info and overrides == ["correction=sc,sc_mis", "seed=0,1"]
    jobs = expand_jobs(overrides, multirun=True)
    assert sorted(map(tuple, jobs)) == sorted(
        (f"correction={c}", f"seed={s}") for c in ("sc", "sc_mis") for s in ("0", "1")
    )


def test_each_sweep_job_is_planned_once_and_hydras_job_finds_its_plan(tmp_path):
    """The preflight returns one plan per job, keyed so that the job Hydra composes (its task
    overrides: the job's own, without ``hydra.*``) finds its plan instead of resolving again."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from rlmix.commands.compose import CONFIG_MODULE, CONFIG_NAME, job_key, preflight

    args = ["-m", "+experiment=smoke", "correction=mis,sc_mis", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    plans = preflight(args)
    assert len(plans) == 4
    overrides, _, _ = split_args(args)
    for job in expand_jobs(overrides, multirun=True):
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            hydra_job = compose(config_name=CONFIG_NAME, overrides=job, return_hydra_config=True)
        GlobalHydra.instance().clear()
        plan = plans[job_key(list(hydra_job.hydra.overrides.task))]
        assert plan.cfg.correction.mode.value == hydra_job.correction.mode and plan.cfg.seed == hydra_job.seed
    assert preflight(["-m", "+experiment=smoke", "--help"]) == {}  # nothing planned: Hydra prints its help
    with pytest.raises(ConfigError, match="--help shows one config"):  # Hydra's help composes one job
        preflight([*args, "--help"])


def test_hydra_reads_the_run_mode_the_preflight_read_instead_of_composing_again(tmp_path, monkeypatch):
    """``Hydra.get_mode`` composes the whole config to read ``hydra.mode``; under ``mode_known`` it
    answers the preflight's value (what that composition gives) and composes nothing."""
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    from rlmix.commands.compose import mode_known, plan_jobs

    run = plan_jobs(["+experiment=smoke", f"hydra.run.dir={tmp_path / 'a'}"])
    multi = plan_jobs(["+experiment=smoke", "hydra.mode=MULTIRUN", f"hydra.run.dir={tmp_path / 'b'}"])
    assert [run[0].mode, multi[0].mode] == [None, RunMode.MULTIRUN]
    original = Hydra.get_mode
    composed = []
    monkeypatch.setattr(Hydra, "compose_config", lambda *a, **k: composed.append(a))
    with mode_known(multi):
        assert Hydra.get_mode(object(), "train", ["seed=0,1"]) is RunMode.MULTIRUN
    with mode_known([]):  # nothing planned (--help): Hydra's own
        assert Hydra.get_mode is original
    assert Hydra.get_mode is original and composed == []


def test_a_sweep_jobs_directory_is_a_path_hydra_accepts(tmp_path):
    """Sweep job directories carry their overrides (``=``, ``,``) in their names; as ``checkpoint=`` or
    ``resume=`` values they are quoted for Hydra, so the commands a run prints work as printed."""
    from rlmix.commands.compose import quote_paths

    job = tmp_path / "3_correction.mode=sc_mis,seed=1"
    job.mkdir()
    args = quote_paths([f"checkpoint={job}", "seed=0,1", f"resume={job}", "model.path=missing=dir"])
    assert args[1] == "seed=0,1" and args[3] == "model.path=missing=dir"  # sweeps and non-paths untouched
    cfg = compose_run_config(args[:3:2], for_training=False)
    assert (cfg.checkpoint, cfg.resume) == (str(job), str(job))


def test_a_fleet_wide_precision_replaces_every_pool_knob_of_the_format(caplog):
    """fleet.precision=fp16 (the FP16 remedy) serves every pool in fp16: a pool's KV format, fp8
    scales, GEMM inputs and fp8 attention belong to its own format and go with it (the FP16 arm is
    swept across the map's doses this way); one set beside it is replaced in one line, not unseen."""
    pool = "fleet.pools.b200_nvfp4"
    with caplog.at_level(logging.WARNING, logger="rlmix.config.load"):
        cfg = compose_run_config(["fleet=emulated_hetero6", "fleet.precision=fp16", f"{pool}.linear_inputs=nvfp4",
                                  f"{pool}.kv_precision=fp8_e4m3", "fleet.pools.h100_fp8.fp8_attention=true"])
    for p in cfg.fleet.pools.values():
        assert (p.precision, p.kv_precision, p.fp8_scales, p.linear_inputs, p.fp8_attention) == (
            "fp16", None, "channel", None, False)
    said = [r.getMessage() for r in caplog.records]
    assert any("fleet.precision=fp16 replaces fleet.pools.b200_nvfp4.kv_precision=fp8_e4m3" in m for m in said), said
    assert any("fleet.pools.h100_fp8.fp8_attention=true" in m for m in said), said
    # the fleet's own formats are replaced without a word: that is what fleet.precision is for
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlmix.config.load"):
        compose_run_config(["fleet=emulated_nvfp4", "fleet.precision=fp16"])
    assert not caplog.records

FIXED_BAD = [
    # a seed torch cannot take killed the trainer at start (a Ray traceback, exit 1)
    (["seed=99999999999999999999"], "seed="),
    # no support recorded: the trainer compared its full log p with the truncated q
    (["correction.support_slots=0", "fleet.top_p=0.9"], "correction.support_slots=0"),
    # top-p alone can keep every token: the sampler refused the record mid-run
    (["correction.support_slots=2", "fleet.top_p=0.99"], "vocabulary size 32"),
    # slots beyond the 32-token vocabulary: padding in every record, sampling 5x slower
    (["correction.num_candidates=20000"], "correction.num_candidates=20000"),
    (["fleet=vllm_cpu_smoke", "fleet.pools.cpu_vllm_bf16.vllm.max_model_len=100000"], "vllm.max_model_len=100000"),
    (["fleet=vllm_cpu_smoke", "fleet.pools.cpu_vllm_bf16.vllm.max_model_len=8"], "loop.max_new_tokens"),
    (["+fleet.pools.mypool={acelerator:L4}"], "fleet.pools.mypool.acelerator: no such key"),
    (["fleet.pools.h100_fp8.acelerator=L4"], "fleet.pools.h100_fp8.acelerator: no such key"),
    (["+fleet.pools.mypool={count:two}"], "fleet.pools.mypool.count"),
    # the constant schedule has no decay; a decay ending inside the warm-up dropped the lr to its floor
    (["trainer.lr_decay_steps=1", "trainer.min_lr_ratio=0.1"], "trainer.lr_decay_steps=1"),
    (["trainer.lr_schedule=linear", "trainer.lr_warmup_steps=3", "trainer.lr_decay_steps=2"],
     "trainer.lr_warmup_steps=3"),
    # a pool's name ends its metric keys: lag_0_0 wrote into the staleness bucket's (a fleet file's name
    # with a / or a space made them ambiguous)
    (["+fleet.pools.lag_0_0={accelerator:H100,precision:bf16}"], "fleet.pools.lag_0_0: a pool's name"),
    # named a pool's key the user never typed; offered KV formats that are then refused as KV formats
    (["fleet.precision=fp8_e4m3"], "fleet.precision=fp8_e4m3: fleet.pools.a100_bf16: accelerator A100"),
    (["fleet.pools.h100_fp8.kv_precision=fp3"], "allowed: fp32, bf16, fp16, fp8_e4m3, fp8_e5m2"),
]


@pytest.mark.parametrize(("overrides", "key"), FIXED_BAD, ids=[" ".join(o) for o, _ in FIXED_BAD])
def test_settings_that_ran_wrong_or_died_in_an_actor_are_refused(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose_run_config(["+experiment=smoke", *overrides])
    message = str(err.value)
    assert key in message and "\n" not in message, message


@pytest.mark.parametrize("override", ["+fleet.pools.mypool={accelerator:L4,precision:int8,count:2}",
                                      "++fleet.pools.mypool={accelerator:L4,precision:int8,count:2}"])
def test_a_pool_can_be_added_on_the_command_line(override):
    cfg = compose_run_config(["+experiment=smoke", override, "+fleet.pools.other.accelerator=A100"])
    pool = cfg.fleet.pools["mypool"]
    assert (pool.accelerator, pool.precision, pool.count, pool.kv_precision) == ("L4", "int8", 2, None)
    assert cfg.fleet.pools["other"].accelerator == "A100" and set(cfg.fleet.pools) == {
        "h100_fp8", "a100_bf16", "mypool", "other"}


def test_an_actor_that_dies_of_bad_input_is_one_config_error(monkeypatch):
    import ray

    from rlmix.errors import RunFailed
    from rlmix.orchestration.runner import started

    died = ray.exceptions.RayActorError()
    died.__cause__ = ConfigError("fleet.pools.x.vllm.max_model_len=9: too long\n(vLLM's details)")
    monkeypatch.setattr(ray, "get", lambda ready: (_ for _ in ()).throw(died))
    with pytest.raises(ConfigError, match=r"^fleet.pools.x.vllm.max_model_len=9: too long$"):
        started([])
    crashed = ray.exceptions.RayActorError()
    crashed.__cause__ = ValueError("Overflow when unpacking long long")
    monkeypatch.setattr(ray, "get", lambda ready: (_ for _ in ()).throw(crashed))
    with pytest.raises(RunFailed, match="did not start") as err:
        started([])
    assert "\n" not in str(err.value)
    # Ray 2.60 keeps a constructor's error as its traceback's text only: the ConfigError is read from it.
    text = ("The actor died because of an error raised in its creation task, \x1b[36mray::SamplerWorker.__init__()"
            "\x1b[39m (pid=1, ip=192.0.2.2)\n  File \"workers.py\", line 9, in __init__\n    raise ConfigError(...)\n"
            "rlmix.errors.ConfigError: pool b200_nvfp4: cannot serve model.path='m': weights lack 7 parameters\nmore")
    in_init = ray.exceptions.RayActorError(error_msg=text, actor_init_failed=True)
    monkeypatch.setattr(ray, "get", lambda ready: (_ for _ in ()).throw(in_init))
    with pytest.raises(ConfigError, match=r"^pool b200_nvfp4: cannot serve model.path='m': weights lack 7 parameters$"):
        started([])
    other = ray.exceptions.RayActorError(error_msg=text.replace("rlmix.errors.ConfigError", "KeyError"),
                                         actor_init_failed=True)
    monkeypatch.setattr(ray, "get", lambda ready: (_ for _ in ()).throw(other))
    with pytest.raises(RunFailed, match=r"^a process did not start: RayActorError: The actor died .*ray::Sampler"):
        started([])  # one line, without the terminal's colours


def test_the_mandatory_value_marker_is_omegaconfs():
    """rlmix.config spells OmegaConf's marker out (its actors do not import OmegaConf); a field
    left at it must still be one OmegaConf calls missing."""
    import omegaconf

    from rlmix.config.dataset import MISSING
    from rlmix.config.schema import RunConfig

    assert MISSING == omegaconf.MISSING
    assert omegaconf.OmegaConf.is_missing(omegaconf.OmegaConf.structured(RunConfig), "task")
