"""Configuration and fail-closed preflight: the ``boundedQueries`` section, the channel policy, the
checks before anything is staged, the images.

Modules: ``channel_policy``, ``config``, ``images``, ``preflight``.
"""
