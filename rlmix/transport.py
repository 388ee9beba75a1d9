"""One buffer for the tensors of a message between processes: rollouts and published weights.

Pickled one by one, each torch tensor goes through torch's own serializer, an archive per
tensor, and Ray copies what it reads back out of its object store into each of them. A
``Rollouts`` holds about fifteen tensors and the weights every sampler loads after every step
dozens more, so each hand-off paid that per tensor. Here a message's CPU tensors are packed into
one byte buffer, which pickle protocol 5 hands to Ray out of band (written into the store as it
is, not inside the pickle), beside their names, dtypes and shapes. The receiver copies the buffer
once into memory of its own, so the tensors it gets are ordinary writable tensors that share
nothing with the sender or the store. Values, dtypes and shapes are exactly the sender's.

``TensorDict`` is a plain ``dict`` of tensors that pickles this way: the published weights are one
(``TrainerWorker.published_weights``), and ``Rollouts`` pickles its tensors as one
(``rlmix.rollout``). A tensor that is not on the CPU, or a value that is not a tensor, leaves the
dict to ordinary pickling.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping

import torch

ALIGN = 16  # bytes: every tensor starts at a multiple, so it can be viewed at its own dtype
Layout = tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]  # name, dtype, shape, offset, bytes


def _packable(tensors: Mapping[str, object]) -> bool:
    return all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_sparse for t in tensors.values())


def pack(tensors: Mapping[str, torch.Tensor]) -> tuple[Layout, bytearray]:
    """The tensors' layout and one buffer holding their bytes (each aligned to ``ALIGN``)."""
    layout, offset = [], 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        layout.append((name, t.dtype, tuple(t.shape), offset, size))
        offset += -(-size // ALIGN) * ALIGN
    buffer = bytearray(offset)
    if offset:
        flat = torch.frombuffer(buffer, dtype=torch.uint8)
        for (name, _, _, start, size), t in zip(layout, tensors.values()):
            if size:
                flat[start:start + size].view(t.dtype).view(t.shape).copy_(t.detach())
    return tuple(layout), buffer


def unpack(layout: Layout, buffer) -> dict[str, torch.Tensor]:
    """``pack``'s tensors again, views into one copy of ``buffer`` that the caller owns."""
    own = bytearray(buffer)  # the store's memory is read-only and not ours to keep
    flat = torch.frombuffer(own, dtype=torch.uint8) if own else torch.empty(0, dtype=torch.uint8)
    return {name: flat[start:start + size].view(dtype).view(shape) if size else torch.empty(shape, dtype=dtype)
            for name, dtype, shape, start, size in layout}


def _out_of_band(buffer: bytearray, protocol: int) -> object:
    """The buffer as pickle should carry it: out of band where the protocol allows (5 and up)."""
    return pickle.PickleBuffer(buffer) if protocol >= 5 else bytes(buffer)


def _tensor_dict(layout: Layout, buffer) -> TensorDict:
    return TensorDict(unpack(layout, buffer))


class TensorDict(dict):
    """A ``dict`` of tensors that crosses a process boundary as one buffer (module docstring)."""

    def __reduce_ex__(self, protocol: int):
        if not _packable(self):
            return dict, (dict(self),)
        layout, buffer = pack(self)
        return _tensor_dict, (layout, _out_of_band(buffer, protocol))
