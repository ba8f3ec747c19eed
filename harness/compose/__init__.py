"""The broker as a Docker Compose service (its document and image) and the ``compose``/``compose-
down`` commands.

Modules: ``project``, ``service``.
"""
