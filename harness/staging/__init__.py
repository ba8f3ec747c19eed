"""Staging: the seeds (cloned with the token only in GIT_ASKPASS children), the token's removal,
and what staging hands to the broker and the agent (outputs, SKILL.md, MCP client
configuration).

Modules: ``mcp_config``, ``outputs``, ``seeds``, ``skill``, ``tokens``.
"""
