"""Continuous batching on the torch sampler: turns join a running decode batch and leave it one by one.

``TorchSampler.generate`` serves the prompts it is given and returns when the longest is done, so
a turn that arrives meanwhile waits for the whole call, and an episode waiting on its tools holds
no row. A ``DecodeBatch`` takes turns as they come (``rlmix.agentic.batching.TurnBatcher`` drives
it): a joining turn's prompt is prefilled on its own (``TorchSampler.prefill``, from the prefix
cache where an earlier turn of its episode ran the same tokens) and from the next step on it
decodes with every other live row; a row leaves as soon as it draws a stop token or reaches its
own budget, and its result is the one-row ``Rollouts`` a call of its own returns.

Cache layout: every live row writes its next token at the same column ``end``; row i's fed tokens
(prompt, then the completion tokens fed back) fill the columns just left of it, and the columns
further left are masked for it (``key_valid``). A join lays the running rows and the new ones
right-aligned at ``max(end, width of the new prompts)``; a leave drops the row and every column no
live row reads. RoPE positions are each row's own token count, so where a row sits does not change
its numbers under the exact view; kernels that split keys into fixed column blocks (the block-wise
views) see other block edges, as they do when a prompt shares a whole call with longer ones.

What a row draws comes from its own uniforms (a seeded turn: the generator of its seed, as
``TorchSampler.generate`` with ``row_seeds``), so which turns shared steps does not change its tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rlmix.rollout import FINISH_LENGTH, FINISH_STOP, Rollouts, SamplingParams
from rlmix.samplers.prefix_cache import CachedPrefix
from rlmix.samplers.sampling import StepDraw, check_support, draw

# The fields of ``SamplingParams`` every row of one batch must share (a row brings its own budget
# and seed): they decide how the whole batch's logits are turned into draws.
SHARED_PARAMS = ("temperature", "top_k", "top_p", "num_candidates", "support_slots", "stop_token_ids")


# Cache columns allocated ahead of the longest live row: a join copies the running rows' columns,
# so it allocates only this much room (or what the rows' budgets can use, if less) and a step that
# reaches the end grows the cache by at least as much (by half its width on long contexts).
GROW_COLUMNS = 64


def shared_params(params: SamplingParams) -> tuple:
    return tuple(getattr(params, name) for name in SHARED_PARAMS)


class _Draws:
    """Per row and per its own step, what the record needs: (B, S[, K|slots]) tensors, S the longest budget."""

    def __init__(self, params: SamplingParams, pad_id: int) -> None:
        self.params, self.pad_id = params, pad_id
        self.stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long)
        self.fields: dict[str, torch.Tensor] = {}
        self.kept_max = torch.zeros(0, dtype=torch.long)

    def _fill(self, name: str):
        """What a field holds past a row's last step (``Rollouts``' padding)."""
        return {"tokens": self.pad_id, "logprobs": 0.0, "head_ids": -1, "head_logprobs": float("-inf"),
                "support_ids": -1, "support_probs": 0.0}[name]

    def _new(self, rows: int, steps: int) -> dict[str, torch.Tensor]:
        p, k, s = self.params, self.params.num_candidates, self.params.support_slots
        shapes = {"tokens": (), "logprobs": ()}
        if k > 0:
            shapes |= {"head_ids": (k,), "head_logprobs": (k,)}
        if p.truncates and s > 0:
            shapes |= {"support_ids": (s,), "support_probs": (s,)}
        return {name: torch.full((rows, steps, *shape), self._fill(name),
                                 dtype=torch.long if name in ("tokens", "head_ids", "support_ids") else torch.float32)
                for name, shape in shapes.items()}

    def join(self, rows: int, steps: int) -> None:
        new = self._new(rows, steps)
        if self.fields:
            width = max(steps, self.fields["tokens"].shape[1])

            def wide(name: str, x: torch.Tensor) -> torch.Tensor:
                extra = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), self._fill(name))
                return torch.cat([x, extra], dim=1)

            new = {name: torch.cat([wide(name, self.fields[name]), wide(name, x)]) for name, x in new.items()}
        self.fields = new
        self.kept_max = torch.cat([self.kept_max, torch.zeros(rows, dtype=torch.long)])

    def record(self, t: torch.Tensor, step: StepDraw) -> None:
        """Row i's draw ``step[i]`` as its step ``t[i]``."""
        rows = torch.arange(len(t))
        for name, x in self.fields.items():
            x[rows, t] = getattr(step, name)
        if "support_ids" in self.fields:
            self.kept_max = torch.maximum(self.kept_max, step.kept)

    def keep(self, rows: torch.Tensor) -> None:
        self.fields = {n: x[rows] for n, x in self.fields.items()}
        self.kept_max = self.kept_max[rows]

    def row(self, i: int, n: int) -> dict[str, torch.Tensor]:
        """Row i's first ``n`` steps, each field (1, n[, ...])."""
        if "support_ids" in self.fields:
            check_support(int(self.kept_max[i]), self.params.support_slots)
        return {n_: x[i : i + 1, :n].clone() for n_, x in self.fields.items()}


class DecodeBatch:
    """The running batch of one ``TorchSampler``: ``join`` adds turns, ``step`` draws one token for
    every live row and returns the rows that finished. Not thread-safe: one thread drives it.

    Per row (dim 0 of every tensor, in join order): its prompt length, budget and tokens drawn, its
    uniforms, and by cache column its keys, values, validity and (mixture-of-experts models) the
    experts each fed position chose. A row's fed tokens (its prompt and every drawn token but the
    latest) sit in the ``fed`` columns left of ``end``.
    """

    def __init__(self, sampler, params: SamplingParams) -> None:
        self.sampler, self.params = sampler, params
        self.shared = shared_params(params)
        self.draws = _Draws(params, sampler.pad_id)
        self.prompts: list[tuple[int, ...]] = []
        self.handles: list[object] = []
        self.joined: list[float] = []  # perf_counter at each row's join
        self.lens = torch.zeros(0, dtype=torch.long)
        self.budgets = torch.zeros(0, dtype=torch.long)
        self.drawn = torch.zeros(0, dtype=torch.long)
        self.uniforms = torch.zeros((0, 0))
        self.cache = None
        self.key_valid = torch.zeros((0, 0), dtype=torch.bool)  # (B, capacity)
        self.routes: torch.Tensor | None = None  # (B, capacity, M, k) int16
        self.logits: torch.Tensor | None = None  # (B, V): every live row's next draw
        self.end = 0  # the column every live row writes its next token at
        self.moe = sampler.model.shape.spec.moe is not None

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def fed(self) -> torch.Tensor:
        """(B,) tokens in each row's cache: its prompt and every drawn token but the latest."""
        return self.lens + (self.drawn - 1).clamp(min=0)

    @torch.no_grad()
    def join(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], uniforms: torch.Tensor,
             handles: Sequence[object]) -> None:
        """Prefill ``prompts`` and add them as rows, each with its own params (its budget is
        ``max_new_tokens``; the rest must be the batch's: ``SHARED_PARAMS``) and its uniforms (a row
        of ``uniforms``, at least as long as its budget); ``handles`` come back with the results."""
        for q in params:
            if shared_params(q) != self.shared:
                raise ValueError(f"turns of one decode batch must share {', '.join(SHARED_PARAMS)}; "
                                 f"got {q} beside {self.params}")
            if q.max_new_tokens < 1:
                raise ValueError(f"every turn needs a budget of at least one token, got {q.max_new_tokens}")
        budgets = torch.tensor([q.max_new_tokens for q in params])
        pre = self.sampler.prefill(prompts, 0)
        old, new, width = len(self), len(prompts), pre.width
        end = max(self.end, width)
        capacity = end + min(int(torch.cat([self.budgets - self.drawn, budgets]).max()), GROW_COLUMNS)

        cache = self.sampler.model.new_cache(0, 0)  # (layers, B, Hkv, capacity, D) each, set here
        cache.k = _columns(self.cache.k if old else None, pre.cache.k, old, end, self.end, width, capacity)
        cache.v = _columns(self.cache.v if old else None, pre.cache.v, old, end, self.end, width, capacity)
        self.cache = cache
        self.key_valid = _columns(self.key_valid if old else None, pre.key_valid, old, end, self.end, width, capacity,
                                  row_dim=0, col_dim=1)
        if self.moe:
            self.routes = _columns(self.routes if old else None, pre.routes.by_column(), old, end, self.end, width,
                                   capacity, row_dim=0, col_dim=1, fill=-1)
        self.end = end
        self.logits = pre.logits if not old else torch.cat([self.logits, pre.logits])
        self.prompts += [tuple(p) for p in prompts]
        self.handles += list(handles)
        self.joined += [time.perf_counter()] * new
        self.lens = torch.cat([self.lens, pre.lens])
        self.budgets = torch.cat([self.budgets, budgets])
        self.drawn = torch.cat([self.drawn, torch.zeros(new, dtype=torch.long)])
        steps = max(self.uniforms.shape[1], int(budgets.max()))  # the running rows' and each new row's budget
        self.uniforms = torch.cat([F.pad(self.uniforms, (0, steps - self.uniforms.shape[1])),
                                   F.pad(uniforms, (0, steps - uniforms.shape[1]))[:, :steps]])
        self.draws.join(new, int(budgets.max()))

    @torch.no_grad()
    def step(self) -> list[tuple[object, Rollouts]]:
        """Draw one token for every live row; feed the rows that go on; return (handle, one-row
        Rollouts) for each row that finished."""
        p = self.params
        uniforms = self.uniforms.gather(1, self.drawn[:, None])[:, 0]
        step = draw(self.logits, uniforms, p.temperature, p.top_k, p.top_p, p.num_candidates, p.support_slots)
        self.draws.record(self.drawn, step)
        self.drawn += 1
        stopped = torch.isin(step.tokens, self.draws.stop_ids)
        done = stopped | (self.drawn >= self.budgets)
        tokens, finished = step.tokens, []
        if bool(done.any()):
            finished = [(self.handles[i], self._result(i, bool(stopped[i]))) for i in done.nonzero()[:, 0].tolist()]
            live = (~done).nonzero()[:, 0]
            self._keep(live)
            tokens = tokens[live]
        if len(self):
            self._feed(tokens)
        return finished

    def _result(self, i: int, stopped: bool) -> Rollouts:
        """Row i as the one-row ``Rollouts`` a call of its own returns; its fed tokens go to the prefix cache."""
        sampler, prompt = self.sampler, self.prompts[i]
        n, fed = int(self.drawn[i]), int(self.fed[i])
        drawn = self.draws.row(i, n)
        columns = slice(self.end - fed, self.end)
        routes = self.routes[i, columns].clone() if self.moe else None
        if sampler.prefix_cache.max_bytes > 0:
            tokens = prompt + tuple(drawn["tokens"][0, : n - 1].tolist())
            sampler.prefix_cache.store(CachedPrefix(tokens, self.cache.k[:, i, :, columns].clone(),
                                                    self.cache.v[:, i, :, columns].clone(), sampler.version, routes))
        if routes is not None:  # the last drawn token was never fed: no experts
            routes = torch.cat([routes, routes.new_full((1, *routes.shape[1:]), -1)])[None]
        return Rollouts(
            prompt_ids=torch.tensor([prompt]), prompt_lens=torch.tensor([len(prompt)]),
            completion_ids=drawn.pop("tokens"), mask=torch.ones((1, n), dtype=torch.bool),
            sampler_logprobs=drawn.pop("logprobs"), policy_version=torch.tensor([sampler.version]),
            pool=(sampler.pool,), finish_reason=(FINISH_STOP if stopped else FINISH_LENGTH,),
            temperature=self.params.temperature, routed_experts=routes,
            gen_time_s=time.perf_counter() - self.joined[i], tags={**sampler.view.tags(), "backend": "torch"},
            **drawn)

    def _keep(self, live: torch.Tensor) -> None:
        """Keep rows ``live`` and drop the columns none of them reads."""
        keep = live.tolist()
        self.prompts = [self.prompts[i] for i in keep]
        self.handles = [self.handles[i] for i in keep]
        self.joined = [self.joined[i] for i in keep]
        self.lens, self.budgets, self.drawn = self.lens[live], self.budgets[live], self.drawn[live]
        self.uniforms = self.uniforms[live]
        self.draws.keep(live)
        self.logits = None
        first = self.end - int(self.fed.max()) if keep else self.end
        self.cache.k = self.cache.k[:, live, :, first:]
        self.cache.v = self.cache.v[:, live, :, first:]
        self.key_valid = self.key_valid[live, first:]
        if self.routes is not None:
            self.routes = self.routes[live, first:]
        self.end -= first

    def _feed(self, tokens: torch.Tensor) -> None:
        """Feed each live row's latest token at column ``end`` and keep the next logits."""
        if self.end == self.key_valid.shape[1]:
            self._grow(max(GROW_COLUMNS, self.end // 2))
        self.key_valid[:, self.end] = True
        routes: list[torch.Tensor] | None = [] if self.moe else None
        self.logits = self.sampler.model.forward(tokens[:, None], self.fed[:, None], self.key_valid[:, : self.end + 1],
                                                 self.cache, self.end, last_only=True, routes=routes)[:, 0]
        if routes is not None:
            self.routes[:, self.end] = torch.stack(routes, dim=2)[:, 0].to(torch.int16)  # (B, M, k)
        self.end += 1

    def _grow(self, columns: int) -> None:
        """``columns`` more empty columns on the right of the cache, validity and expert record."""
        self.cache.k = F.pad(self.cache.k, (0, 0, 0, columns))
        self.cache.v = F.pad(self.cache.v, (0, 0, 0, columns))
        self.key_valid = F.pad(self.key_valid, (0, columns))
        if self.routes is not None:
            self.routes = F.pad(self.routes, (0, 0, 0, 0, 0, columns), value=-1)


def _columns(mine: torch.Tensor | None, theirs: torch.Tensor, old: int, end: int, mine_end: int, width: int,
             capacity: int, row_dim: int = 1, col_dim: int = 3, fill=0) -> torch.Tensor:
    """The running rows' columns [0, mine_end) (``mine``, ``old`` rows) above the joining rows' columns
    [0, width) (``theirs``), both moved to end at column ``end`` of a tensor ``capacity`` columns wide."""
    size = list(theirs.shape)
    size[row_dim], size[col_dim] = old + theirs.shape[row_dim], capacity
    out = theirs.new_full(size, fill)

    def at(rows: slice, cols: slice) -> tuple:
        index = [slice(None)] * len(size)
        index[row_dim], index[col_dim] = rows, cols
        return tuple(index)

    if old:
        out[at(slice(0, old), slice(end - mine_end, end))] = mine[at(slice(None), slice(0, mine_end))]
    out[at(slice(old, None), slice(end - width, end))] = theirs[at(slice(None), slice(0, width))]
    return out
