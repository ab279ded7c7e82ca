"""The TrainingJob controller: the operator's decisions, free of kopf.

:mod:`~gpuscaler.controller.reconcile` is the loop (one level-triggered step per job),
:mod:`~gpuscaler.controller.interruptions` the spot-interruption handling it calls,
:mod:`~gpuscaler.controller.policy` the policy gate around its planner,
:mod:`~gpuscaler.controller.outcomes` the statuses of a step that never reaches the loop.
The kopf adapters in :mod:`gpuscaler.handlers` read the objects, call these, and write status
and events; an import-linter contract keeps kopf out of this package.
"""
