"""Multi-turn agentic evaluation on Harbor task directories (SWE-bench Pro V2, HARD-51; docs/math.md §7).

Entry point: ``run_swebench_eval`` (``rlmix.agentic.run``). Layout: ``harbor`` (task loading,
subsets), ``sandbox`` (runtime interface, git snapshot/patch), ``local`` / ``docker`` (runtimes),
``actions`` + ``episode`` (the agent loop), ``policy`` (policy interface, model adapter),
``grading``, ``results``, ``records`` (episodes as Rollouts). See docs/hard51.md.
"""

from rlmix.agentic.policy import AgentPolicy, ModelPolicy, PolicyTurn, Transcript
from rlmix.agentic.run import run_swebench_eval

__all__ = ["AgentPolicy", "ModelPolicy", "PolicyTurn", "Transcript", "run_swebench_eval"]
