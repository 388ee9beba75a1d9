"""task=dataset: loading, data order, rewards, the format rule, reward errors, and bad input."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlmix.correction.advantages import group_advantages
from rlmix.errors import ConfigError
from rlmix.metrics.aggregate import reward_metrics
from rlmix.embedded.chartok import build_char_tokenizer
from rlmix.assembly.producers import ERROR_GROUP_BASE, score_rollouts
from rlmix.orchestration.workers import make_request
from rlmix.rollout import Rollouts
from rlmix.tasks import dataset as dataset_module
from rlmix.tasks.chat import render_ids
from rlmix.tasks.dataset import AtLeast, DatasetTask, check_config, check_encodable, overlong_rows
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.embedded.minicode import ALPHABET
from rlmix.tasks.python_tests import run_python_tests, sandbox_problem
from rlmix.tasks.rewards import math_answer, parse_number
from tests.cli import rlmix_refusing

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "arith" / "train.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def numbers(n: int) -> list[dict]:
    return [{"prompt": f"{i} add 1?", "answer": str(i + 1)} for i in range(n)]


def test_jsonl_parquet_and_save_to_disk_load_the_same_rows(tmp_path):
    import datasets

    rows = numbers(7)
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "disk"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    seen = []
    for spec in (jsonl, tmp_path / "d.parquet", tmp_path / "disk", tmp_path / "dict"):
        task = DatasetTask(DatasetTaskConfig(train_files=str(spec)))
        seen.append([p.prompt for p in task.split("train")])
    assert all(s == [r["prompt"] for r in rows] for s in seen)


def test_data_order_is_a_permutation_per_epoch_derived_from_the_request_id(tmp_path):
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", numbers(10))))
    task = DatasetTask(cfg, seed=3)
    # 5 requests of 2 prompts = one epoch: every row exactly once.
    epoch0 = [p.task_id for r in range(5) for p in make_request(task, r, 2, seed=3).problems]
    epoch1 = [p.task_id for r in range(5, 10) for p in make_request(task, r, 2, seed=3).problems]
    assert sorted(epoch0) == sorted(epoch1) == sorted(f"dataset/train/{i}" for i in range(10))
    assert epoch0 != epoch1  # a fresh shuffle each epoch
    # A resumed run rebuilds the task in a new process and asks for request 7 directly.
    fresh = DatasetTask(cfg, seed=3)
    assert make_request(fresh, 7, 2, seed=3).problems == make_request(task, 7, 2, seed=3).problems
    assert DatasetTask(cfg, seed=4).row_at(0) != task.row_at(0) or DatasetTask(cfg, seed=4).row_at(1) != task.row_at(1)
    ordered = DatasetTask(DatasetTaskConfig(train_files=cfg.train_files, shuffle=False))
    assert [ordered.row_at(i) for i in range(12)] == list(range(10)) + [0, 1]


def test_builtin_verifiers():
    assert parse_number("so 1,234.5 then \\boxed{3/4}") == pytest.approx(0.75)
    assert math_answer("The answer is 12.", "12", {}) == 1.0
    assert math_answer("-7", "-7.0", {}) == 1.0 and math_answer("7", "-7", {}) == 0.0
    assert math_answer("no number", "1", {}) == 0.0


@pytest.mark.parametrize(("completion", "answer", "reward"), [
    ("\\boxed{\\frac{1}{2}}", "1/2", 1.0),  # a fraction in a box: its braces used to end the box early
    ("\\boxed{-\\dfrac{3}{4}}", "-0.75", 1.0),
    ("\\boxed{\\frac{1}{4}}", "4", 0.0),  # ... and then its last digits were the answer
    ("\\boxed{\\sqrt{2}}", "2", 0.0),  # an expression is not a number
    ("\\boxed{2^{10}}", "10", 0.0),
    ("\\boxed{10{,}000}", "10000", 1.0),  # LaTeX's thousands separators
    ("\\boxed{1,\\!000}", "1000", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("so x = \\frac{1}{2}", "0.5", 1.0),
])
def test_math_reads_latex_answers(completion, answer, reward):
    assert math_answer(completion, answer, {}) == reward


def test_a_numpy_bool_is_a_reward():
    import numpy as np

    from rlmix.tasks.rewards import as_reward

    assert as_reward(np.isclose(1.0, 1.0), "mine:f") == 1.0 and as_reward(np.float32(0.5), "mine:f") == 0.5
    with pytest.raises(TypeError, match="must return a finite number"):
        as_reward(np.array([1.0]), "mine:f")


@pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))
def test_python_tests_verifier(monkeypatch):
    passes = lambda code, tests, timeout_s=10: run_python_tests(code, tests, timeout_s).reward(False) == 1.0  # noqa: E731
    assert passes("def f(x):\n    return x + 1", "assert f(1) == 2")
    assert not passes("def f(x):\n    return x", "assert f(1) == 2")
    assert not passes("while True:\n    pass", "", timeout_s=1)  # killed at the timeout
    monkeypatch.setenv("RLMIX_HOST_SECRET", "x")
    assert not passes("import os\nos.environ['RLMIX_HOST_SECRET']", "")  # none of the host's environment


def test_format_rule_and_user_reward(tmp_path):
    cfg = DatasetTaskConfig(
        train_files=str(EXAMPLE), prompt_key="question", reward="examples.arith.reward:reward",
        format_regex="<p>(.*?)</p>",
    )
    task = DatasetTask(cfg)
    problem = task.sample_at(0, 1)[0]
    answer = int(problem.payload.answer)
    assert task.score(problem, f"<p>{answer}</p>").reward == 1.0
    assert task.score(problem, f"<p>{answer + 1}</p>").reward == 0.25
    off = task.score(problem, f"{answer}")
    assert off.reward == 0.0 and not off.format_ok


def test_a_sampler_process_imports_the_reward_module_from_the_runs_launch_directory(tmp_path, monkeypatch):
    """A process Ray keeps for the next job (a held session's next command, launched elsewhere) has
    Ray's start directory on its path, not this run's: the worker enters the run's launch directory."""
    from rlmix.orchestration.workers import LAUNCH_DIR_ENV, enter_launch_dir
    from rlmix.tasks.rewards import resolve_reward

    launch, elsewhere = tmp_path / "launch", tmp_path / "elsewhere"
    launch.mkdir(), elsewhere.mkdir()
    (launch / "launch_dir_reward.py").write_text("def reward(completion, answer, row):\n    return 0.5\n")
    monkeypatch.chdir(elsewhere)  # the worker's own directory
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(elsewhere)])
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(launch))
    with pytest.raises(ConfigError, match="does not import"):
        resolve_reward("launch_dir_reward:reward", 1.0)
    enter_launch_dir()
    assert sys.path[0] == str(launch)
    assert resolve_reward("launch_dir_reward:reward", 1.0).fn("a", "b", {}) == 0.5


def test_a_kept_process_imports_a_reward_module_again_when_its_directory_or_file_changed(tmp_path, monkeypatch):
    """A held session's sampler scores the next command with that command's reward: another launch
    directory's module of the same name, or the user's edit of theirs, not the module it cached."""
    from rlmix.orchestration.workers import LAUNCH_DIR_ENV, enter_launch_dir
    from rlmix.tasks.rewards import resolve_reward

    first, second = tmp_path / "first", tmp_path / "second"
    for where, value in ((first, "1.0"), (second, "0.0")):
        where.mkdir()
        (where / "held_reward.py").write_text(f"def reward(completion, answer, row):\n    return {value}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))

    def score() -> float:
        return resolve_reward("held_reward:reward", 1.0).fn("a", "b", {})

    monkeypatch.setenv(LAUNCH_DIR_ENV, str(first))
    enter_launch_dir()
    kept = resolve_reward("held_reward:reward", 1.0).fn
    assert score() == 1.0 and resolve_reward("held_reward:reward", 1.0).fn is kept  # unchanged: not imported again
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(second))  # the next command, launched elsewhere
    sys.path.remove(str(first))
    enter_launch_dir()
    assert score() == 0.0
    edited = second / "held_reward.py"
    edited.write_text("def reward(completion, answer, row):\n    return 0.25\n")
    later = edited.stat().st_mtime_ns + 2_000_000_000  # past the bytecode cache's one-second stamp
    os.utime(edited, ns=(later, later))
    assert score() == 0.25
    (second / "held_reward.py").unlink()
    with pytest.raises(ConfigError, match="does not import"):  # gone from disk: not served from the cache
        score()


def test_a_reward_that_raises_is_counted_and_kept_out_of_its_group(tmp_path, monkeypatch):
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""
        def reward(completion, answer, row):
            if completion == "boom":
                raise RuntimeError("cannot score")
            return float(completion == answer)
    """))
    monkeypatch.chdir(tmp_path)
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", numbers(4))), reward="flaky:reward")
    task = DatasetTask(cfg)
    request = make_request(task, 0, 1, seed=0)
    answer = request.problems[0].payload.answer
    tok = build_char_tokenizer(ALPHABET + "bmo")
    texts = [answer, "boom", "9", answer]
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    width = max(map(len, ids))
    out = Rollouts(
        prompt_ids=torch.ones(4, 1, dtype=torch.long), prompt_lens=torch.ones(4, dtype=torch.long),
        completion_ids=torch.tensor([row + [0] * (width - len(row)) for row in ids]),
        mask=torch.tensor([[j < len(row) for j in range(width)] for row in ids]),
        sampler_logprobs=torch.zeros(4, width), policy_version=torch.zeros(4, dtype=torch.long),
        pool=("p",) * 4, finish_reason=("stop",) * 4,
    )
    scored = score_rollouts(out, request, 4, tok, task)
    assert scored.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert scored.reward_errors.tolist() == [False, True, False, False]
    assert int(scored.group_ids[1]) >= ERROR_GROUP_BASE and len(set(scored.group_ids.tolist())) == 2
    adv = group_advantages(scored.rewards, scored.group_ids, normalize_std=False)
    # The baseline of the other three is their own mean (2/3); the failed sample has no advantage.
    assert adv.tolist() == pytest.approx([1 / 3, 0.0, -2 / 3, 1 / 3])
    assert reward_metrics(scored)["reward/errors"] == 1.0


def test_text_the_embedded_tokenizer_cannot_encode_is_named(tmp_path):
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 1+1?", "answer": "2"}])))
    with pytest.raises(ConfigError, match=r"cannot encode '\+Whi'"):
        check_encodable(DatasetTask(cfg), build_char_tokenizer(ALPHABET))
    check_encodable(DatasetTask(DatasetTaskConfig(train_files=str(EXAMPLE), prompt_key="question")),
                    build_char_tokenizer(ALPHABET))


def test_text_a_vocabulary_without_unknown_token_would_drop_is_named(tmp_path):
    """A BPE with no unknown token silently drops a character it lacks: that is refused too."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "a": 1, "b": 2, " ": 3, "?": 4}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    assert hf.unk_token_id is None and hf("abc", add_special_tokens=False).input_ids == [1, 2]  # "c" dropped
    rows = [{"prompt": "ab ba?", "answer": "1"}, {"prompt": "a cab?", "answer": "2"}]
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", rows)))
    with pytest.raises(ConfigError, match=r"/d.jsonl: line 2: the model's tokenizer cannot encode 'c'; use model="):
        check_encodable(DatasetTask(cfg), hf)
    check_encodable(DatasetTask(DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "ok.jsonl", rows[:1])))), hf)


def byte_bpe_with_template():
    """A byte-level BPE (a few merges of English) with a ChatML-like template: any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog, twice. "] * 50, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    hf.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return hf


@pytest.mark.parametrize("messages", [False, True], ids=["prompt_key", "messages_key"])
def test_overlong_prompts_are_found_as_encoding_every_row_finds_them(tmp_path, monkeypatch, messages):
    """The oracle encodes every row; ``overlong_rows`` encodes only the rows its byte bound cannot clear,
    and counts one its token floor already puts past the room as that floor (an ``AtLeast``)."""
    import random

    rng = random.Random(0)
    pieces = ["the ", "fox ", "jumps", "é", "€", "😀", "\n", "  ", "zq", "7"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(0, 120))) for _ in range(60)]
    if messages:
        rows = [{"chat": [{"role": "system", "content": t[:9]}, {"role": "user", "content": t}], "answer": "1"}
                for t in texts]
        cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", rows)), messages_key="chat")
    else:
        rows = [{"prompt": t, "answer": "1"} for t in texts]
        cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", rows)), system_prompt="Be brief.")
    task, tok = DatasetTask(cfg), byte_bpe_with_template()
    lengths = [len(render_ids(tok, p.messages, cfg.chat_template)) for p in task.split("train")]
    encoded = []
    monkeypatch.setattr(dataset_module, "render_ids", lambda *a: encoded.append(1) or render_ids(*a))
    for room in (10, 40, 90, 200, 10_000):
        found = overlong_rows(task, tok, room)
        assert [i for i, _ in found] == [i for i, n in enumerate(lengths) if n > room]
        assert all(room < n <= lengths[i] if isinstance(n, AtLeast) else n == lengths[i] for i, n in found)
    encoded.clear()
    assert overlong_rows(task, tok, 10_000) == [] and len(encoded) == 1  # the template alone: no row encoded


def test_epochs_bound_the_run_length(tmp_path):
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", numbers(10))), epochs=2)
    check_config(cfg, seed=0, trained_prompts=20)
    with pytest.raises(ConfigError, match=r"task.epochs=2: .* 21 prompts"):
        check_config(cfg, seed=0, trained_prompts=21)


BAD_INPUT = [
    (["task.train_files=missing.jsonl"], "task.train_files=missing.jsonl: no such file or directory"),
    (["task.train_files=d.jsonl", "task.prompt_key=question"], "task.prompt_key='question' is not a field"),
    (["task.train_files=d.jsonl", "task.answer_key=solution"], "task.answer_key='solution' is not a field"),
    (["task.train_files=d.jsonl", "task.reward=nosuchmodule:reward"], "module 'nosuchmodule' does not import"),
    (["task.train_files=d.jsonl", "task.reward=rewards:two_args"], "must accept (completion, answer, row)"),
    (["task.train_files=d.jsonl", "task.reward=rewards:text"], "returned str 'yes'; it must return a finite number"),
    (["task.train_files=d.jsonl", "task.reward=fuzzy"], "task.reward='fuzzy': use a built-in (exact|math|python_tests)"),
    (["task.train_files=gaps.jsonl"], "task.train_files=gaps.jsonl: line 3: no value for task.prompt_key='prompt'"),
    (["task.train_files=d.jsonl", "task.eval_files=nope/"], "task.eval_files=nope/: no such file or directory"),
    (["task.train_files=d.jsonl"], "cannot encode"),  # v1's tokenizer has no capital W
    (["task.train_files=broken.jsonl"], "task.train_files=broken.jsonl: line 2 is not JSON (Expecting value"),
    (["task.train_files=blank.jsonl"], "task.train_files=blank.jsonl: line 2: the prompt is empty"),
]
# Checked against the embedded model, which a machine whose cache lacks it builds first (minutes).
NEEDS_THE_MODEL = {"cannot encode"}


@pytest.mark.parametrize("args,message", [
    pytest.param(a, m, id=m.split(":")[0][:30], marks=[pytest.mark.slow] if m in NEEDS_THE_MODEL else [])
    for a, m in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, message):
    rows = numbers(3) if message != "cannot encode" else [{"prompt": "What?", "answer": "1"}]
    write_jsonl(tmp_path / "d.jsonl", rows)
    write_jsonl(tmp_path / "gaps.jsonl", numbers(2) + [{"answer": "1"}])
    write_jsonl(tmp_path / "blank.jsonl", numbers(1) + [{"prompt": " ", "answer": "1"}])
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1 add 1?", "answer": "2"}\n{"prompt": "2?", "answer": }\n')
    (tmp_path / "rewards.py").write_text("def two_args(completion, answer):\n    return 1.0\n\n"
                                         "def text(completion, answer, row):\n    return 'yes'\n")
    # A user reward is imported by name from the cwd, which the product puts first on sys.path: a
    # copy of sys.path takes that, and ``rewards`` is absent from sys.modules during the test and
    # after it (setitem records that it was absent, delitem makes it so), so no case sees another's.
    monkeypatch.setattr(sys, "path", sys.path[:])
    monkeypatch.setitem(sys.modules, "rewards", None)
    monkeypatch.delitem(sys.modules, "rewards")
    out = rlmix_refusing("train", "+experiment=smoke", "task=dataset", *args, "logger=disabled",
                         "model.embedded_version=v1",  # the model whose tokenizer has no capital W
                         f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_a_task_option_added_through_the_searchpath_trains(monkeypatch):
    from rlmix.commands.compose import compose_run_config

    monkeypatch.chdir(ROOT)
    cfg = compose_run_config(["+experiment=sc_mis", "hydra.searchpath=[file://examples/arith/conf]", "task=arith"])
    assert isinstance(cfg.task, DatasetTaskConfig) and cfg.task.format_regex == "<p>(.*?)</p>"
    assert cfg.task.reward == "examples.arith.reward:reward"


@pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))
def test_python_tests_counts_suspected_exploits_per_step(tmp_path):
    rows = [{"prompt": "Write f(x) = x + 1.", "answer": "assert f(1) == 2\nassert f(2) == 3\n"}]
    cfg = DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / "d.jsonl", rows)), reward="python_tests",
                            partial_credit=True)
    task = DatasetTask(cfg)
    request = make_request(task, 0, 1, seed=0)
    texts = ["def f(x):\n    return x + 1\n", "def f(x):\n    return 2\n", "import os\nos._exit(0)\n"]
    tok = build_char_tokenizer("".join(sorted(set("".join(texts)))))
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    width = max(map(len, ids))
    out = Rollouts(
        prompt_ids=torch.ones(3, 1, dtype=torch.long), prompt_lens=torch.ones(3, dtype=torch.long),
        completion_ids=torch.tensor([row + [0] * (width - len(row)) for row in ids]),
        mask=torch.tensor([[j < len(row) for j in range(width)] for row in ids]),
        sampler_logprobs=torch.zeros(3, width), policy_version=torch.zeros(3, dtype=torch.long),
        pool=("p",) * 3, finish_reason=("stop",) * 3,
    )
    scored = score_rollouts(out, request, 3, tok, task)
    assert scored.rewards.tolist() == [1.0, 0.5, 0.0]  # partial credit: one of two asserts held
    assert scored.exploit_suspected.tolist() == [False, False, True]
    metrics = reward_metrics(scored)
    assert metrics["reward/exploit_suspected"] == 1.0 and metrics["reward/errors"] == 0.0


def test_train_and_eval_files_take_one_path_or_a_list_like_verl(tmp_path, monkeypatch):
    """A list's rows are its files' rows in list order; one path and a one-element list are the same."""
    from rlmix.commands.compose import compose_run_config

    a = write_jsonl(tmp_path / "a.jsonl", numbers(3))
    b = write_jsonl(tmp_path / "b.jsonl", numbers(5)[3:])
    both = DatasetTask(DatasetTaskConfig(train_files=[str(a), str(b)], eval_files=[str(b), str(a)]))
    assert [r["answer"] for r in both.rows] == [str(i + 1) for i in range(5)]
    assert [p.payload.answer for p in both.split("test")] == ["4", "5", "1", "2", "3"]
    one = DatasetTask(DatasetTaskConfig(train_files=[str(a)]))
    assert one.rows.to_list() == DatasetTask(DatasetTaskConfig(train_files=str(a))).rows.to_list()
    monkeypatch.chdir(tmp_path)  # the CLI form: a Hydra list, validated before anything starts
    cfg = compose_run_config(["task=dataset", "task.train_files=[a.jsonl,b.jsonl]", "task.eval_files=b.jsonl",
                              "loop.steps=1", "loop.groups_per_step=2", "loop.groups_per_request=2"])
    assert cfg.task.train_files == ["a.jsonl", "b.jsonl"] and len(DatasetTask(cfg.task)) == 5


@pytest.mark.parametrize("files, message", [
    ("[]", r"^task.train_files=\[\]: give a path .* or a list of them$"),
    ("[a.jsonl,nope.jsonl]", r"^task.train_files=nope.jsonl: no such file or directory$"),
    ("[a.jsonl,c.jsonl]", r"^task.train_files=c.jsonl: line 1: no value for task.prompt_key='prompt'$"),
])
def test_bad_file_lists_are_refused_in_one_line(tmp_path, monkeypatch, files, message):
    from rlmix.commands.compose import compose_run_config

    write_jsonl(tmp_path / "a.jsonl", numbers(3))
    write_jsonl(tmp_path / "c.jsonl", [{"question": "x", "answer": "1"}])  # question, not prompt
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        compose_run_config(["task=dataset", f"task.train_files={files}", "loop.steps=1", "loop.groups_per_step=2",
                            "loop.groups_per_request=2"])


def test_a_glob_may_have_its_wildcards_in_a_folders_name(tmp_path):
    from rlmix.tasks.dataset import load_rows

    for shard in ("a", "b"):
        (tmp_path / shard).mkdir()
        (tmp_path / shard / "train.jsonl").write_text(json.dumps({"question": shard, "answer": "1"}) + "\n")
    assert sorted(load_rows(str(tmp_path / "*" / "train.jsonl"), "task.train_files")["question"]) == ["a", "b"]


def test_a_parquet_globs_rows_are_named_in_their_own_file(tmp_path):
    """Its rows were numbered across the glob's files (``row 3`` for the second file's second row)."""
    import datasets

    from rlmix.tasks.dataset import load_rows

    for shard in ("a", "b"):
        datasets.Dataset.from_list([{"question": f"{shard}{i}", "answer": "1"} for i in range(2)]).to_parquet(
            str(tmp_path / f"{shard}.parquet"))
    (tmp_path / "c.parquet").write_bytes(b"not parquet")
    rows = load_rows(str(tmp_path / "[ab].parquet"), "task.train_files")
    assert rows["question"] == ["a0", "a1", "b0", "b1"]
    assert rows.name(3) == f"task.train_files={tmp_path}/[ab].parquet: {tmp_path}/b.parquet row 1"
    with pytest.raises(ConfigError, match=r"^task.train_files=\S*/\*.parquet: \S*/c.parquet does not load as a dataset"):
        load_rows(str(tmp_path / "*.parquet"), "task.train_files")


def test_text_that_is_not_utf8_is_one_line_naming_the_file_and_field(tmp_path):
    # The JSON loader takes the bytes in; read only when their row came up, they ended a running job.
    from rlmix.tasks.dataset import load_rows

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"question": "ok", "answer": "1"}\n{"question": "bad \xff byte", "answer": "2"}\n')
    with pytest.raises(ConfigError,
                       match=r"^task.train_files=.*bad.jsonl: line 2: field 'question' holds text that is not UTF-8$"):
        load_rows(str(bad), "task.train_files")


def exact_task(tmp_path, rows: list[dict], name: str = "d.jsonl") -> DatasetTask:
    return DatasetTask(DatasetTaskConfig(train_files=str(write_jsonl(tmp_path / name, rows)), shuffle=False))


def test_numbers_of_a_json_column_keep_their_own_type(tmp_path):
    """A column typed as a whole made 42 beside 2.5 the float 42.0, and "42" missed the answer "42.0"."""
    task = exact_task(tmp_path, [{"prompt": "a?", "answer": 42}, {"prompt": "b?", "answer": 2.5}])
    problems = task.split("train")
    assert [p.payload.answer for p in problems] == [42, 2.5]
    assert [type(p.payload.answer) for p in problems] == [int, float]
    assert [task.score(p, text).reward for p, text in zip(problems, ["42", "2.5"])] == [1.0, 1.0]
    assert task.score(problems[0], "42.0").reward == 0.0


def test_text_beside_numbers_stays_as_written(tmp_path):
    """A column typed as a whole made the text "007" beside numbers the number 7."""
    rows = [{"prompt": "a?", "answer": "007"}, {"prompt": "b?", "answer": 7}, {"prompt": "c?", "answer": 2.5}]
    task = exact_task(tmp_path, rows)
    problems = task.split("train")
    assert [p.payload.answer for p in problems] == ["007", 7, 2.5]
    assert [p.payload.row for p in problems] == rows
    assert task.score(problems[0], "007").reward == 1.0 and task.score(problems[0], "7").reward == 0.0
    assert task.score(problems[1], "7").reward == 1.0
    # Files of a list whose answers differ in type load too: each value is its own.
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "d?", "answer": 12345678901234567890}])
    both = DatasetTask(DatasetTaskConfig(train_files=[str(tmp_path / "d.jsonl"), str(other)], shuffle=False))
    assert [p.payload.answer for p in both.split("train")] == ["007", 7, 2.5, 12345678901234567890]


def test_a_json_list_file_and_a_row_without_a_field(tmp_path):
    from rlmix.tasks.dataset import load_rows

    listed = tmp_path / "d.json"
    listed.write_text(json.dumps([{"prompt": "a?", "answer": 1}, {"prompt": "b?", "answer": "1.50", "note": "x"}]))
    rows = load_rows(str(listed), "task.train_files")
    assert rows.column_names == ["prompt", "answer", "note"]
    assert rows.to_list() == [{"prompt": "a?", "answer": 1, "note": None},
                              {"prompt": "b?", "answer": "1.50", "note": "x"}]
    rows[0]["answer"] = 2  # each read is a fresh row
    assert rows[0]["answer"] == 1 and rows["answer"] == [1, "1.50"]


def test_parquet_keeps_its_own_column_types(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "a?", "answer": 42.0}, {"prompt": "b?", "answer": 2.5}]).to_parquet(
        str(tmp_path / "d.parquet"))
    task = DatasetTask(DatasetTaskConfig(train_files=str(tmp_path / "d.parquet"), shuffle=False))
    assert [p.payload.answer for p in task.split("train")] == [42.0, 2.5]


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "a?", "answer": "1"}\n\n{"prompt": "b?", "answer": }\n',
     r"line 3 is not JSON \(Expecting value, column 28\)"),
    ('{"prompt": "a?", "answer": "1"}\n["b?", "2"]\n', r"line 2 is a JSON array, not an object of fields"),
    ('[{"prompt": "a?", "answer": "1"},\n "b?"]', r"item 1 of its list is a JSON string, not an object of fields"),
    ('[{"prompt": "a?", "answer": "1"},\n {"prompt" "b?"}]',
     r"line 2 is not JSON \(Expecting ':' delimiter, column 12\)"),
    ("\n", r"holds no rows"),
])
def test_a_bad_json_row_is_one_line_naming_its_file_and_line(tmp_path, text, message):
    from rlmix.tasks.dataset import load_rows

    (tmp_path / "bad.jsonl").write_text(text)
    with pytest.raises(ConfigError, match=rf"^task.train_files=\S*bad.jsonl: {message}$"):
        load_rows(str(tmp_path / "bad.jsonl"), "task.train_files")
    write_jsonl(tmp_path / "a.jsonl", numbers(2))  # a glob names the file among its files
    with pytest.raises(ConfigError, match=rf"^task.train_files=\S*/\*.jsonl: \S*/bad.jsonl {message}$"):
        load_rows(str(tmp_path / "*.jsonl"), "task.train_files")
