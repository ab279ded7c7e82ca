"""kopf handlers of the TrainingJob operator: thin adapters from kopf to the controller.

:mod:`~gpuscaler.handlers.trainingjob` holds the handler functions (registered in
:mod:`gpuscaler.main`): kopf bodies -> models, a call to :mod:`gpuscaler.controller`, the outcome
-> a status patch and Events. :mod:`~gpuscaler.handlers.errors` is the one mapping of domain
errors onto kopf's retry/stop errors, :mod:`~gpuscaler.handlers.metrics` the operator's
Prometheus metrics.
"""
