"""Does this machine have what a run asks for -- its GPUs, and CUDA for a DeepSpeed FP16 trainer?
Answered before Ray starts.

A pool with ``backend: vllm`` on a GPU accelerator takes its tensor-parallel size in GPUs per
instance (``num_gpus`` on its actor), and a DeepSpeed trainer on NCCL one per rank (one rank: the
trainer actor's own, ``trainer_gpus``). On a local Ray instance those GPUs must be on this machine:
otherwise Ray would wait forever for actors it cannot place, after the run directory exists.
``check_gpus`` turns that into one line at config time. With ``cluster.address`` set, the
cluster's own resources decide and nothing is checked here.

Emulated pools (``backend: torch``) take no GPU whatever accelerator they name: they compute on the
CPU and are placed by a declared ``accelerator_type`` resource.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rlmix.assembly.fleet import pool_gpus
from rlmix.config.deepspeed import CommBackend, check_deepspeed_fp16
from rlmix.config.schema import RunConfig, TrainerBackend, TrainerPrecision
from rlmix.errors import ConfigError


def _multi_rank(cfg: RunConfig) -> bool:
    return cfg.trainer.backend is TrainerBackend.deepspeed and cfg.trainer.deepspeed.ranks > 1


def _nccl(cfg: RunConfig, cuda: bool) -> bool:
    """DeepSpeed ranks on NCCL, hence on GPUs: ``comm_backend=nccl``, or ``auto`` on a machine with
    GPUs (``trainers.deepspeed_rank.comm_backend``)."""
    comm = cfg.trainer.deepspeed.comm_backend
    return comm is CommBackend.nccl or (comm is CommBackend.auto and cuda)


def trainer_gpus(cfg: RunConfig, cuda: bool) -> int:
    """GPUs the trainer actor itself asks Ray for: one for a one-rank DeepSpeed trainer on NCCL, whose
    engine runs in that actor on cuda:0 of the devices Ray leaves it (a 0-GPU actor keeps the whole
    node's, cuda:0 included, which Ray also hands to a sampler). Several ranks take theirs in their own
    actors; the torch trainer and gloo ranks stay on the CPU."""
    t = cfg.trainer
    return int(t.backend is TrainerBackend.deepspeed and t.deepspeed.ranks == 1 and _nccl(cfg, cuda))


def trainer_actor_gpus(cfg: RunConfig) -> int:
    """``trainer_gpus`` on this machine (``comm_backend=auto`` is NCCL where ``visible_gpus`` finds one)."""
    t = cfg.trainer
    if t.backend is not TrainerBackend.deepspeed or t.deepspeed.ranks != 1:
        return 0
    return trainer_gpus(cfg, cuda=t.deepspeed.comm_backend is CommBackend.auto and visible_gpus() > 0)


def gpu_demand(cfg: RunConfig, one_per_pool: bool = False, cuda: bool = False) -> dict[str, int]:
    """GPUs the run's actors request, keyed by the config key that asks for them.

    ``one_per_pool``: ``rlmix probe`` builds one instance per pool, not ``count``. ``cuda``: the
    machine has GPUs, so ``comm_backend=auto`` means NCCL (one GPU per rank, the one rank's in the
    trainer actor), as in the trainer.
    """
    demand = {}
    for name, pool in cfg.fleet.pools.items():
        if pool_gpus(pool):
            demand[f"fleet.pools.{name}"] = pool_gpus(pool) * (1 if one_per_pool else pool.count)
    if cfg.trainer.backend is TrainerBackend.deepspeed and _nccl(cfg, cuda):
        demand["trainer.deepspeed.ranks"] = cfg.trainer.deepspeed.ranks  # ranks > 1: rank actors; 1: trainer_gpus
    return demand


def check_gpus(cfg: RunConfig, visible: int, one_per_pool: bool = False) -> None:
    """ConfigError (one line) when a local run asks for more GPUs than ``visible``."""
    if cfg.cluster.address is not None:
        return
    demand = gpu_demand(cfg, one_per_pool, cuda=visible > 0)
    needed = sum(demand.values())
    if needed <= visible:
        return
    asks = ", ".join(f"{key}: {n}" for key, n in demand.items())
    has = "no CUDA device" if visible == 0 else f"{visible} GPU{'s' if visible > 1 else ''} (as Ray counts them)"
    plural = "s" if needed > 1 else ""
    raise ConfigError(
        f"fleet {cfg.fleet.name} needs {needed} GPU{plural} ({asks}) but this machine has {has}; "
        "use an emulated fleet (fleet=smoke|emulated_hetero6), accelerator CPU for vllm pools, "
        "or join a GPU cluster with cluster.address=auto"
    )


def check_machine(cfg: RunConfig, one_per_pool: bool = False) -> None:
    """``check_gpus`` against this machine, and CUDA for DeepSpeed FP16 ranks (its CPU accelerator
    has none); GPUs are counted only when the run may ask for some."""
    if cfg.cluster.address is not None:
        return
    ds_fp16 = cfg.trainer.backend is TrainerBackend.deepspeed and cfg.trainer.precision is TrainerPrecision.fp16
    if gpu_demand(cfg, one_per_pool) or _multi_rank(cfg) or ds_fp16:
        visible = visible_gpus()
        check_gpus(cfg, visible, one_per_pool)
        if ds_fp16:  # the trainer's own rule (DeepSpeedTrainer), asked before Ray starts
            check_deepspeed_fp16(cuda_ranks=visible > 0 and _nccl(cfg, cuda=True))


def visible_gpus() -> int:
    """NVIDIA GPUs a local Ray instance would report: devices found, capped by CUDA_VISIBLE_DEVICES.

    Ray's own detection (NVML through its bundled pynvml) when Ray is importable; otherwise the
    device nodes under /dev. torch.cuda is not imported: it would initialise CUDA in the driver.
    """
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as Nvidia

        found = Nvidia.get_current_node_num_accelerators()
    except ImportError:
        found = sum(1 for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ids is None:
        return found
    ids = [] if ids in ("", "NoDevFiles") else ids.split(",")
    return min(found, len(ids))
