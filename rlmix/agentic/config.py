"""The agentic tasks' schemas live in ``rlmix.config.swebench``; these names stay importable here."""

from rlmix.config.swebench import UNSET, AgentEnvConfig, MiniCodeAgentConfig, RuntimeKind, SwebenchProConfig

__all__ = ["UNSET", "AgentEnvConfig", "MiniCodeAgentConfig", "RuntimeKind", "SwebenchProConfig"]
