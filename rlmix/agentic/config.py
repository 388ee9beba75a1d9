"""The evaluation's schema lives in ``rlmix.config.swebench``; these names stay importable here."""

from rlmix.config.swebench import UNSET, RuntimeKind, SwebenchProConfig

__all__ = ["UNSET", "RuntimeKind", "SwebenchProConfig"]
