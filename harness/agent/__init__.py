"""The agent and its confinement: its container or host process as values, launching it,
supervising it, and the fail-closed check before a host agent starts.

Modules: ``hostcheck``, ``launch``, ``spec``, ``supervise``.
"""
