"""What a run records for its operator: JSONL events, per-repository usage and the step summary,
terminal progress, the ``report`` command, problem notices.

Modules: ``events``, ``notices``, ``progress``, ``report``, ``usage``.
"""
