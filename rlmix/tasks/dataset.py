"""``task=dataset``: train on the rows of a JSONL / Parquet file or a ``save_to_disk`` directory.

Data order. Training problem ``i`` of a run (the ``i``-th prompt the loop asks for) is row
``perm_e[i mod N]`` of epoch ``e = i // N``, where ``perm_e`` is a permutation drawn from
``(run seed, e)`` (identity when ``task.shuffle=false``). The loop asks for problems by position
(request id x prompts per request), so the position — and with it the data order — follows from
the request counter alone: a resumed run continues with the rows after its checkpoint's step, and
any sampler serving a request sees the same rows.

Scoring. ``task.format_regex`` first (no match: a format error, reward 0), then the reward function
(``rlmix.tasks.rewards``) on the completion or the regex's first group. A reward function that raises
is reported as ``Score.error`` instead of stopping the run.
"""

from __future__ import annotations

import glob
import json
import random
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Any

from rlmix.errors import ConfigError
from rlmix.tasks.base import Problem, Score
from rlmix.tasks.chat import Message, prompt_messages, render_ids
from rlmix.config.dataset import DatasetTaskConfig
from rlmix.tasks.rewards import BuiltinReward, as_reward, resolve_reward

SPLITS = {"train": "train_files", "test": "eval_files"}
ROLES = {"system", "user", "assistant", "tool"}


@dataclass(frozen=True)
class DatasetPayload:
    answer: Any  # the row's answer_key value
    row: dict  # the whole row, passed to the reward function
    where: str = ""  # the row as a user finds it: ``task.train_files=data/train.jsonl: line 3``


def file_specs(spec, key: str) -> list[str]:
    """``task.train_files`` / ``task.eval_files`` as a list of paths: one path or a non-empty list of them."""
    specs = [spec] if isinstance(spec, str) else spec
    if not isinstance(specs, (list, tuple)) or not specs or not all(isinstance(s, str) and s for s in specs):
        raise ConfigError(f"{key}={spec}: give a path (file, glob, save_to_disk directory) or a list of them")
    return list(specs)


def load_rows(spec, key: str) -> Rows:
    """Every row of ``spec`` (one path or a list, rows in list order; a glob's files in name order)."""
    loaded = [found for s in file_specs(spec, key) for found in _load_one(s, key)]
    return Rows([part for part, _ in loaded], [where for _, where in loaded])


class Rows:
    """The rows of a task's files in order, each a dict of every file's fields (None where a row has
    no value); ``rows[field]`` is that field's column. A JSON file's part is a ``JsonRows``, a Parquet
    file's or saved dataset's a ``datasets.Dataset`` (the types of its columns). ``wheres`` holds
    each part's file as its messages name it (``task.train_files=a.jsonl: ``); ``name(i)`` is row
    ``i`` as a user finds it in its file."""

    def __init__(self, parts: list, wheres: list[str] | None = None) -> None:
        self.parts = parts
        self.wheres = wheres if wheres is not None else [""] * len(parts)
        self.column_names = list(dict.fromkeys(name for part in parts for name in part.column_names))
        self.blank = dict.fromkeys(self.column_names)
        self.ends = list(accumulate(len(part) for part in parts))

    def __len__(self) -> int:
        return self.ends[-1]

    def __getitem__(self, key):
        if isinstance(key, str):
            return [value for part in self.parts
                    for value in (part[key] if key in part.column_names else [None] * len(part))]
        if not -len(self) <= key < len(self):
            raise IndexError(f"row {key} of {len(self)}")
        i, j = self._locate(key)
        return {**self.blank, **self.parts[i][j]}

    def _locate(self, index: int) -> tuple[int, int]:
        """(part, row within the part) of row ``index``."""
        index %= len(self)
        i = bisect_right(self.ends, index)
        return i, index - (self.ends[i - 1] if i else 0)

    def name(self, index: int) -> str:
        """Row ``index`` as its file holds it: ``task.train_files=b.jsonl: line 2`` (1-based, as the
        JSON checks count; a JSON list's ``item N of its list``), a Parquet file's or saved dataset's
        ``row N`` (0-based, as ``datasets`` indexes it)."""
        i, j = self._locate(index)
        part = self.parts[i]
        return self.wheres[i] + (part.places[j] if isinstance(part, JsonRows) else f"row {j}")

    def __iter__(self):
        for part in self.parts:
            for row in part:
                yield {**self.blank, **row}

    def to_list(self) -> list[dict]:
        return list(self)


class JsonRows:
    """One JSON / JSON Lines file's rows, each kept as its JSON text and read again per access: a
    value is what Python's json module makes of it (42 an int beside 2.5, "007" text beside numbers),
    not a column type inferred for the whole file, and a reward that changes its ``row`` changes no
    other."""

    def __init__(self, texts: list[str], column_names: list[str], places: list[str] | None = None) -> None:
        self.texts, self.column_names = texts, column_names
        self.places = places if places is not None else [f"item {i} of its list" for i in range(len(texts))]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, key):
        if isinstance(key, str):
            return [json.loads(text).get(key) for text in self.texts]
        return json.loads(self.texts[key])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _load_one(spec: str, key: str) -> list[tuple[Any, str]]:
    """The rows of a file, a glob or a ``save_to_disk`` directory (ConfigError otherwise), each part
    with the prefix that names its file: a JSON glob's a ``JsonRows`` per file, a Parquet glob's a
    ``datasets.Dataset`` per file."""
    path = Path(spec).expanduser()
    if not path.exists() and not glob.glob(str(path)):  # a glob may have its wildcards in a folder's name
        raise ConfigError(f"{key}={spec}: no such file or directory")
    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
    files: list[Path] = []
    if kind is not None and not path.is_dir():  # a glob's files each their own part: rows named in their file
        found = [str(path)] if path.exists() else sorted(glob.glob(str(path), recursive=True))
        files = [Path(f) for f in found if Path(f).is_file()]
        if not files:
            raise ConfigError(f"{key}={spec}: no such file")
    wheres = [f"{key}={spec}: " + ("" if f == path else f"{f} ") for f in files]
    if kind == "json" and files:
        return [(_read_json(f, where), where) for f, where in zip(files, wheres)]
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as err:  # not a saved dataset
            raise ConfigError(f"{key}={spec}: {_not_loading(err)}") from None
        if isinstance(loaded, datasets.DatasetDict):
            split = "train" if "train" in loaded or len(loaded) != 1 else next(iter(loaded))
            if split not in loaded:
                raise ConfigError(f"{key}={spec}: a DatasetDict without a 'train' split ({sorted(loaded)})")
            loaded = loaded[split]
        return [(loaded, f"{key}={spec}: ")]
    if kind is None:
        raise ConfigError(f"{key}={spec}: use .jsonl, .json, .parquet files or a save_to_disk directory")
    parts = []
    for f, where in zip(files, wheres):
        try:
            parts.append((_valid_text(datasets.load_dataset(kind, data_files=str(f), split="train"), where), where))
        except ConfigError:
            raise
        except Exception as err:  # not Parquet, ...
            raise ConfigError(f"{where}{_not_loading(err)}") from None
    return parts


def _not_loading(err: Exception) -> str:
    first = (str(err).splitlines() or [""])[0][:200]
    return f"does not load as a dataset ({type(err).__name__}: {first})"


def _read_json(path: Path, where: str) -> JsonRows:
    """A JSON Lines file's rows (a file that starts with ``[``: one JSON list of them), read with
    Python's json module rather than a typed loader, which gives a column one type for all its rows
    (42 beside 2.5 became 42.0, "007" beside numbers 7). ConfigError naming the line for a row that
    is not a JSON object, or holds bytes that are not UTF-8."""
    try:
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
    except OSError as err:
        raise ConfigError(f"{where}cannot be read ({err.strerror})") from None
    text = data.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 are named per field below
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}line {err.lineno} is not JSON ({err.msg}, column {err.colno})") from None
        rows = [(f"item {i} of its list", item) for i, item in enumerate(items)]
    else:
        rows = []
        for number, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    rows.append((f"line {number}", json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{where}line {number} is not JSON ({err.msg}, column {err.colno})") from None
    if not rows:
        raise ConfigError(f"{where}holds no rows")
    texts, fields = [], {}
    for place, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{where}{place} is a JSON {_json_kind(row)}, not an object of fields")
        texts.append(json.dumps(row, ensure_ascii=False))
        if not _utf8(texts[-1]):
            bad = next((name for name, value in row.items() if not _utf8(json.dumps(value, ensure_ascii=False))),
                       None)
            what = f"field {bad!r} holds" if bad is not None else "a field's name is"
            raise ConfigError(f"{where}{place}: {what} text that is not UTF-8")
        fields.update(dict.fromkeys(row))
    return JsonRows(texts, list(fields), [place for place, _ in rows])


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (not so: bytes that did not decode, a lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _json_kind(value) -> str:
    """What JSON calls the type of ``value`` (a row that is not an object)."""
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _valid_text(rows, where: str):
    """``rows`` once every text column is valid UTF-8 (``where`` names its file). A loader may take
    invalid bytes into a column; left there, they would surface only when that row is read, mid-run."""
    import pyarrow as pa

    for name in rows.column_names:
        column = rows.data.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid as err:
                raise ConfigError(f"{where}field {name!r} holds text that is not UTF-8 ({err})") from None
    return rows


# Built-in rewards that compare the completion with the row's answer.
COMPARES_ANSWER = (BuiltinReward.exact.value, BuiltinReward.math.value)


def check_columns(rows, cfg: DatasetTaskConfig, key: str) -> None:
    """Every field the task reads is a column, every row has a value for each and a prompt that is not
    empty or whitespace only (``_blank``), whatever the model's chat template would wrap around it (a
    sampler would answer no question), the first rows' messages are well-formed, and, for a reward that
    compares with the answer (``COMPARES_ANSWER``), no answer is blank."""
    source = "task.messages_key" if cfg.messages_key else "task.prompt_key"
    wanted = {source: cfg.messages_key or cfg.prompt_key, "task.answer_key": cfg.answer_key}
    for name, column in wanted.items():
        if column not in rows.column_names:
            raise ConfigError(f"{name}={column!r} is not a field of {key}={getattr(cfg, key.split('.')[1])}; "
                              f"fields: {', '.join(rows.column_names)}")
    if len(rows) == 0:
        raise ConfigError(f"{key}: the dataset has no rows")
    columns = {name: rows[column] for name, column in wanted.items()}  # read once: a JSON row parses per read
    for name, column in wanted.items():  # a row without the field reads as None
        first = next((i for i, value in enumerate(columns[name]) if value is None), None)
        if first is not None:
            raise ConfigError(f"{rows.name(first)}: no value for {name}={column!r}")
    for i in range(min(len(rows), 8)):
        messages_of(rows[i], cfg, rows.name(i))
    first = next((i for i, value in enumerate(columns[source]) if _blank(value, cfg)), None)
    if first is not None:
        refuse_empty_prompt(rows.name(first), cfg)
    if cfg.reward in COMPARES_ANSWER:  # a blank answer is matched by a blank completion
        first = next((i for i, value in enumerate(columns["task.answer_key"])
                      if isinstance(value, str) and not value.strip()), None)
        if first is not None:
            raise ConfigError(f"{rows.name(first)}: the answer is empty (task.answer_key={cfg.answer_key!r} holds "
                              f"no text but whitespace, and task.reward={cfg.reward} compares with it); "
                              f"give the row its answer or drop it")


def messages_of(row: dict, cfg: DatasetTaskConfig, where: str) -> list[Message]:
    """The row's prompt as chat messages (ConfigError naming the row, ``where``, if the field is not a
    string / message list)."""
    if cfg.messages_key is None:
        prompt = row[cfg.prompt_key]
        if not isinstance(prompt, str):
            raise ConfigError(f"{where}: task.prompt_key={cfg.prompt_key!r} holds {type(prompt).__name__}, not text")
        return prompt_messages(prompt, cfg.system_prompt)
    messages = row[cfg.messages_key]
    ok = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages
    )
    if not ok:
        raise ConfigError(f"{where}: task.messages_key={cfg.messages_key!r} is not a list of {{role, content}} "
                          "messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _blank(value, cfg: DatasetTaskConfig) -> bool:
    """Whether a row's prompt field holds no text but whitespace (a message list: ``is_blank``); a list
    that is not well-formed is left to ``messages_of`` to refuse."""
    if cfg.messages_key is None:
        return isinstance(value, str) and not value.strip()
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value) and is_blank(value))


def is_blank(messages) -> bool:
    """Whether a prompt's user turns (a prompt without one: all its messages) hold no text but whitespace.
    ``task.system_prompt`` or a row's system message is no question to answer."""
    turns = [m for m in messages if m.get("role") == "user"] or messages
    return all(not m["content"].strip() for m in turns)


def refuse_empty_prompt(where: str, cfg: DatasetTaskConfig) -> None:
    """The one-line refusal of a row (``where``) whose prompt is empty or whitespace only."""
    what = (f"task.messages_key={cfg.messages_key!r}: its user turns hold" if cfg.messages_key
            else f"task.prompt_key={cfg.prompt_key!r} holds")
    raise ConfigError(f"{where}: the prompt is empty ({what} no text but whitespace); give the row text or drop it")


def problem_name(problem: Problem) -> str:
    """A problem's row as a user finds it in its file (``task.eval_files=test.jsonl: line 4``)."""
    payload = problem.payload
    return payload.where if isinstance(payload, DatasetPayload) and payload.where else row_name(problem.task_id)


def row_name(task_id: str) -> str:
    """``dataset/test/3`` as the key and row (0-based, in list order) a user looks up, for a problem
    that does not know its file (``problem_name``); other text as is."""
    kind, _, rest = task_id.partition("/")
    split, _, index = rest.partition("/")
    return f"task.{SPLITS[split]} row {index}" if kind == "dataset" and split in SPLITS and index.isdigit() else task_id


def to_problem(row: dict, cfg: DatasetTaskConfig, task_id: str, where: str = "") -> Problem:
    """The row as a problem; ``where`` names it in its file (``Rows.name``) for every later message."""
    messages = messages_of(row, cfg, where or row_name(task_id))
    return Problem(
        task_id=task_id,
        prompt=messages[-1]["content"],
        difficulty=0,
        payload=DatasetPayload(answer=row[cfg.answer_key], row=row, where=where),
        messages=tuple(messages),
    )


class DatasetTask:
    """Prompts and answers from files, scored by a verifier or a user function (implements ``Task``)."""

    name = "dataset"

    def __init__(self, cfg: DatasetTaskConfig, seed: int = 0) -> None:
        self.cfg, self.seed = cfg, seed
        # None without task.train_files: `rlmix eval` and `rlmix probe` read task.eval_files only.
        self.rows = None if cfg.train_files is None else load_rows(cfg.train_files, "task.train_files")
        if self.rows is not None:
            check_columns(self.rows, cfg, "task.train_files")
        self.reward = resolve_reward(cfg.reward, cfg.python_timeout_s, cfg.partial_credit)
        self.format_re = compile_format(cfg.format_regex)

    def __len__(self) -> int:
        return len(self.rows)

    def row_at(self, position: int) -> int:
        """The row index of training problem ``position`` (see the module docstring)."""
        n = len(self.rows)
        epoch, offset = divmod(position, n)
        return _permutation(n, self.seed, epoch, self.cfg.shuffle)[offset]

    def sample_at(self, position: int, n: int) -> list[Problem]:
        """Training problems ``position .. position + n - 1`` of the run's data order."""
        out = []
        for i in range(position, position + n):
            index = self.row_at(i)
            out.append(to_problem(self.rows[index], self.cfg, f"dataset/train/{index}", self.rows.name(index)))
        return out

    def sample(self, n: int, seed: int) -> list[Problem]:
        """n problems drawn with ``seed`` (tests and probes; training uses ``sample_at``)."""
        rng = random.Random(f"dataset:{self.seed}:{seed}")
        return self.sample_at(rng.randrange(1 << 40), n)

    def split(self, name: str) -> list[Problem]:
        """Every row of ``test`` (task.eval_files) or ``train`` (task.train_files), in file order."""
        if name not in SPLITS:
            raise ConfigError(f"task.split={name!r} is not a dataset split; use one of {sorted(SPLITS)}")
        spec = getattr(self.cfg, SPLITS[name])
        if spec is None:
            # The way out `rlmix eval` offers too (docs/tasks.md): the training rows, where there are some.
            other = "; or task.split=train to use task.train_files" if self.cfg.train_files is not None else ""
            raise ConfigError(f"task.split={name}: set task.{SPLITS[name]} (a file or directory of rows to "
                              f"evaluate){other}")
        if name == "train":
            rows = self.rows  # checked as the task loaded them
        else:
            rows = load_rows(spec, f"task.{SPLITS[name]}")
            check_columns(rows, self.cfg, f"task.{SPLITS[name]}")
        return [to_problem(row, self.cfg, f"dataset/{name}/{i}", rows.name(i)) for i, row in enumerate(rows)]

    def score(self, problem: Problem, completion: str) -> Score:
        """Format rule first, then the reward; a reward function that raises gives ``Score.error``."""
        text = completion
        if self.format_re is not None:
            m = self.format_re.fullmatch(completion.strip())
            if m is None:
                return Score(reward=0.0, format_ok=False)
            text = m.group(1) if self.format_re.groups else completion
        payload: DatasetPayload = problem.payload
        try:
            graded = self.reward.grade(text, payload.answer, payload.row)
        except Exception as err:  # the user's code: one bad sample must not end the run
            return Score(reward=0.0, format_ok=True, error=f"{type(err).__name__}: {err}")
        return Score(reward=graded.reward, format_ok=True, exploit_suspected=graded.exploit_suspected)


def compile_format(pattern: str | None) -> re.Pattern | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ConfigError(f"task.format_regex={pattern!r}: not a regular expression ({err})") from None


@lru_cache(maxsize=8)
def _permutation(n: int, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    order = list(range(n))
    if shuffle:
        random.Random(f"dataset-order:{seed}:{epoch}").shuffle(order)
    return tuple(order)


def check_config(cfg: DatasetTaskConfig, seed: int, trained_prompts: int, for_training: bool = True) -> None:
    """Everything that can be checked before any process starts (ConfigError, one line).

    Files load, fields exist and hold text/messages, the reward imports with the right signature
    and returns a number on the first row, and ``trained_prompts`` fit in ``task.epochs``. Only
    training needs ``task.train_files``: ``rlmix eval`` and ``rlmix probe`` may read ``task.eval_files`` alone.
    """
    if for_training and cfg.train_files is None:
        raise ConfigError("task.train_files: not set, and it has no default; give task.train_files=...")
    if not cfg.python_timeout_s > 0:
        raise ConfigError(f"task.python_timeout_s={cfg.python_timeout_s}: must be a positive number of seconds")
    task = DatasetTask(cfg, seed)
    eval_rows = None
    if cfg.eval_files is not None:
        eval_rows = load_rows(cfg.eval_files, "task.eval_files")
        check_columns(eval_rows, cfg, "task.eval_files")
    if cfg.epochs is not None:
        if cfg.epochs < 1:
            raise ConfigError(f"task.epochs={cfg.epochs}: must be >= 1 or null (cycle forever)")
        if task.rows is not None and trained_prompts > cfg.epochs * len(task):
            raise ConfigError(
                f"task.epochs={cfg.epochs}: loop.steps x loop.groups_per_step = {trained_prompts} prompts, "
                f"more than {cfg.epochs} pass(es) over {len(task)} rows; lower loop.steps or raise task.epochs"
            )
    rows = task.rows if task.rows is not None else eval_rows
    if ":" in cfg.reward and rows is not None:  # a user function: call it once, as the run will
        row = rows[0]
        try:
            value = task.reward(str(row[cfg.answer_key]), row[cfg.answer_key], row)
        except Exception as err:
            raise ConfigError(f"task.reward={cfg.reward!r} raised {type(err).__name__} on the first row: {err}") from None
        try:
            as_reward(value, cfg.reward)
        except TypeError as err:
            raise ConfigError(str(err)) from None


def check_encodable(task: DatasetTask, tokenizer, limit: int = 2000) -> None:
    """ConfigError if the tokenizer cannot encode a character of the first ``limit`` training prompts
    (``check_problems_encodable``); nothing without ``task.train_files``."""
    if task.rows is not None:
        count = min(len(task), limit)
        rows = task.rows
        check_problems_encodable((to_problem(rows[i], task.cfg, f"dataset/train/{i}", rows.name(i))
                                  for i in range(count)), tokenizer)


def check_problems_encodable(problems: Iterable[Problem], tokenizer) -> None:
    """ConfigError naming the row of the first problem the tokenizer cannot encode a character of.

    The tokenizer is asked, character by character (each distinct one once): a character it maps to
    its unknown token, or, not being whitespace, to no token at all (a vocabulary without an unknown
    token drops what it lacks), does not encode. A byte-level vocabulary encodes every character.
    """
    unk = tokenizer.unk_token_id
    verdicts: dict[str, bool] = {}

    def encodes(ch: str) -> bool:
        if ch not in verdicts:
            ids = tokenizer(ch, add_special_tokens=False).input_ids
            verdicts[ch] = (unk is None or unk not in ids) and (bool(ids) or ch.isspace())
        return verdicts[ch]

    for problem in problems:
        for message in problem.messages:
            bad = sorted({ch for ch in message["content"] if not encodes(ch)})
            if bad:
                raise ConfigError(
                    f"{problem_name(problem)}: the model's tokenizer cannot encode {''.join(bad)!r}; "
                    "use model=embedded_v2 (byte-level BPE: any text) or model.path=<an HF model>"
                )


def refuse_no_token(problem: Problem) -> None:
    """The one-line refusal of a prompt that renders to no token: a sampler cannot continue nothing."""
    raise ConfigError(f"{problem_name(problem)}: the prompt renders to no token (the tokenizer has no chat "
                      "template or beginning-of-sequence token to add, and none for its text); give the row text "
                      "or drop it")


class AtLeast(int):
    """A prompt's token count known from below (``token_floor``): it reads ``at least N``."""

    def __format__(self, spec: str) -> str:
        return f"at least {int(self):{spec}}"

    def __repr__(self) -> str:
        return format(self)

    __str__ = __repr__


# What the character tokenizer's pre-tokenizer (``Regex(".")``) may leave unmatched: a run of these
# becomes one token (or none), every other character a token of its own.
LINE_BREAKS = "\n\r\x0b\x0c\x85\u2028\u2029"


def token_floor(tokenizer) -> Callable[[str], int] | None:
    """A function giving, without encoding it, a number of tokens a text takes at least with
    ``tokenizer``, wherever a chat template puts it among other text; None where no bound is sound
    (the prompt is encoded then).

    Each token stands for at most as many bytes as its own text has (the longest in the vocabulary,
    added tokens included, is ``longest``), so a text the tokenizer keeps whole takes at least its
    length over ``longest``. Kept whole: a byte-level BPE (``ByteLevel`` maps every byte to a symbol of
    its vocabulary; ``Split`` steps beside it must not remove what they match) keeps every byte; the
    character tokenizer (WordLevel after ``Split(Regex("."))``) every character but line breaks. Not
    bounded: a normalizer (NFKC, stripping: text may shrink), any other model or pre-tokenizer (a
    WordPiece ``[UNK]`` stands for a whole word, a whitespace pre-tokenizer drops spaces), an added
    token that strips the whitespace beside it, or truncation.
    """
    from tokenizers import Tokenizer, pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tok", None)
    if not isinstance(backend, Tokenizer):
        return None
    spec = json.loads(backend.to_str())
    if spec.get("normalizer") is not None or spec.get("truncation") is not None:
        return None
    if any(added.get("lstrip") or added.get("rstrip") for added in spec.get("added_tokens") or []):
        return None
    pre = spec.get("pre_tokenizer") or {}
    steps = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    vocab = backend.get_vocab(with_added_tokens=True)
    model = (spec.get("model") or {}).get("type")
    keeps = all(kind == "ByteLevel" or (kind == "Split" and step.get("behavior") != "Removed")
                for kind, step in zip(kinds, steps))
    if model == "BPE" and "ByteLevel" in kinds and keeps and set(pre_tokenizers.ByteLevel.alphabet()) <= vocab.keys():
        longest = max(len(token.encode()) for token in vocab)
        return lambda text: -(-len(text.encode()) // longest)
    if (model == "WordLevel" and len(steps) == 1 and kinds == ["Split"] and steps[0].get("pattern") == {"Regex": "."}
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")):
        longest = max(len(token) for token in vocab)
        return lambda text: -(-(len(text) - sum(text.count(ch) for ch in LINE_BREAKS)) // longest)
    return None


def _floor_text(messages) -> str:
    """The text a chat template surely renders of a prompt: its user turns, trimmed (a template may
    trim a turn or leave out another role's)."""
    return "".join(m["content"].strip() for m in messages if m["role"] == "user")


def floor_tokens(floor: Callable[[str], int] | None, messages) -> int:
    """``floor``'s bound for a prompt's messages (0 without one)."""
    return 0 if floor is None else floor(_floor_text(messages))


def overlong_rows(task: DatasetTask, tokenizer, room: int) -> list[tuple[int, int]]:
    """(row, prompt tokens) of each training row whose prompt, through the task's chat template,
    takes more than ``room`` tokens.

    Only a row that could is encoded: one whose text is long enough that two tokens a UTF-8 byte
    (more than any byte-level, SentencePiece or character vocabulary spends) plus the template's
    own tokens for its messages would exceed ``room``. A dataset of short prompts for a model with a
    long context is therefore checked without encoding a row. Nor is one whose ``token_floor``
    already exceeds ``room`` (a megabyte of text would take seconds and a gigabyte of memory to
    encode): its count is that bound, an ``AtLeast``.
    """
    cfg = task.cfg
    column = task.rows[cfg.messages_key or cfg.prompt_key]
    frame: dict[tuple, int] = {}  # the template's own tokens around each sequence of roles
    floor = token_floor(tokenizer)
    found = []
    for index, value in enumerate(column):
        if cfg.messages_key is None:
            texts, roles = [value], ("user",)
        else:
            messages = value if isinstance(value, list) and all(isinstance(m, dict) for m in value) else []
            texts, roles = [m.get("content") for m in messages], tuple(m.get("role") for m in messages)
        # A row that is not well-formed is encoded below, where to_problem names what is wrong with it.
        if roles and set(roles) <= ROLES and all(isinstance(t, str) for t in texts):
            if roles not in frame:
                if cfg.messages_key:
                    empty = [{"role": r, "content": ""} for r in roles]
                else:
                    empty = prompt_messages("", cfg.system_prompt)
                frame[roles] = len(render_ids(tokenizer, empty, cfg.chat_template))
            if 2 * sum(len(t.encode()) for t in texts) + frame[roles] <= room:
                continue
        problem = to_problem(task.rows[index], cfg, f"dataset/train/{index}", task.rows.name(index))
        least = floor_tokens(floor, problem.messages)
        tokens = AtLeast(least) if least > room else len(render_ids(tokenizer, problem.messages, cfg.chat_template))
        if tokens > room:
            found.append((index, tokens))
    return found
