"""Stable seeds from identities: the same run seed and the same request give the same draws on any
machine and in any process (Python's own ``hash`` of a string is salted per process)."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from the run seed and a request's identity."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
