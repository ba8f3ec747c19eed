"""A run's lifecycle: options, the pure plan, the roots, preparation, orchestration, the broker
child and its log, teardown, the sweep of stale roots, the workspace quota and the reaper.

Modules: ``broker_child``, ``broker_log``, ``options``, ``orchestrate``, ``paths``, ``plan``,
``prepare``, ``quota``, ``reaper``, ``sweep``, ``teardown``.
"""
