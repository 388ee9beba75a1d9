"""How a run ended: summary.json's ``status``. rlmix.orchestration.outcome decides it; the report reads it
(without torch, which the rest of the run's code brings in)."""

from __future__ import annotations

import enum


class Status(enum.Enum):
    completed = "completed"
    collapsed = "collapsed"
    interrupted = "interrupted"
    failed = "failed"
