"""kopf handlers of the TrainingJob operator: thin adapters from kopf to the reconcile loop.

:mod:`~gpuscaler.handlers.trainingjob` holds the handler functions (registered in
:mod:`gpuscaler.main`), :mod:`~gpuscaler.handlers.reconcile` the loop, :mod:`~gpuscaler.handlers.errors`
the one mapping of domain errors onto kopf's retry/stop errors, :mod:`~gpuscaler.handlers.metrics`
the operator's Prometheus metrics.
"""
