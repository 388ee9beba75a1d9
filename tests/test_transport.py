"""rlmix.transport: rollouts and weights cross a process boundary as one buffer, exactly and independently."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from rlmix.rollout import Rollouts
from rlmix.transport import ALIGN, TensorDict, pack, unpack

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)


def rollouts() -> Rollouts:
    b, p, t, k = 3, 4, 5, 2
    return Rollouts(
        prompt_ids=torch.randint(0, 50, (b, p)), prompt_lens=torch.tensor([4, 2, 3]),
        completion_ids=torch.randint(0, 50, (b, t)), mask=torch.rand(b, t) > 0.3,
        sampler_logprobs=-torch.rand(b, t), policy_version=torch.tensor([2, 2, 1]), pool=("a", "b", "a"),
        finish_reason=("stop", "length", "stop"), temperature=0.7,
        head_ids=torch.randint(0, 50, (b, t, k)), head_logprobs=torch.randn(b, k, t).transpose(1, 2),  # not contiguous
        routed_experts=torch.randint(-1, 4, (b, p + t, 2, 2), dtype=torch.int16), task_ids=("x", "y", "z"),
        group_ids=torch.tensor([0, 0, 1 << 48]), rewards=torch.tensor([1.0, 0.0, 0.5]),
        format_ok=torch.tensor([True, False, True]), gen_time_s=0.25, tags={"precision": "fp8"}, infra_errors=1,
    )


def assert_same(a: Rollouts, b: Rollouts) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert y.dtype == x.dtype and y.shape == x.shape and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_rollouts_round_trip_exactly_and_share_nothing(protocol):
    r = rollouts()
    back = pickle.loads(pickle.dumps(r, protocol=protocol))
    assert_same(r, back)
    back.rewards[0] = 7.0
    back.mask.fill_(False)
    assert r.rewards[0] == 1.0 and r.mask.any()


def test_every_tensor_is_one_buffer_out_of_band():
    r, buffers = rollouts(), []
    data = pickle.dumps(r, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(data) < 2_000  # the bytes travel beside the pickle, not in it
    assert_same(r, pickle.loads(data, buffers=buffers))


def test_every_dtype_shape_and_alignment():
    tensors = {f"t{i}": (torch.rand(3, 5) * 100).to(dtype) for i, dtype in enumerate(DTYPES)}
    tensors |= {"scalar": torch.tensor(3.5), "empty": torch.zeros(0, 7), "odd": torch.ones(3, dtype=torch.int8)}
    layout, buffer = pack(tensors)
    assert all(start % ALIGN == 0 for *_, start, _ in layout)
    back = unpack(layout, bytes(buffer))
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape and torch.equal(back[name], t), name


def test_weights_are_a_dict_that_travels_as_one_buffer():
    weights = TensorDict({"a.weight": torch.randn(4, 4).bfloat16(), "b.bias": torch.randn(4)})
    buffers = []
    back = pickle.loads(pickle.dumps(weights, protocol=5, buffer_callback=buffers.append), buffers=buffers)
    assert len(buffers) == 1 and isinstance(back, dict) and list(back) == list(weights)
    assert all(torch.equal(back[k], weights[k]) and back[k].dtype == weights[k].dtype for k in weights)


def test_what_is_not_cpu_tensors_pickles_as_before():
    meta = TensorDict({"w": torch.empty(2, 2, device="meta")})
    back = pickle.loads(pickle.dumps(meta, protocol=5))
    assert type(back) is dict and back["w"].device.type == "meta"
    mixed = TensorDict({"w": torch.ones(2), "step": 3})
    back = pickle.loads(pickle.dumps(mixed, protocol=5))
    assert type(back) is dict and back["step"] == 3 and torch.equal(back["w"], torch.ones(2))
