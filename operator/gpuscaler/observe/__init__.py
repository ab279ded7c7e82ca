"""Observed performance: what a running TrainingJob measures, against what the model predicted.

- :mod:`~gpuscaler.observe.estimators` (pure): robust rates over counter samples (resets, gaps,
  noise), medians of windows, utilisation averages.
- :mod:`~gpuscaler.observe.assess` (pure): observed vs predicted, the per-GPU efficiency factor,
  named bottlenecks with advice, and whether a re-plan pays (with hysteresis).
- :mod:`~gpuscaler.observe.prometheus`: the only module that talks to Prometheus
  (``prometheus-api-client``); it turns DCGM exporter and runtime series into observations.
- :mod:`~gpuscaler.observe.controller`: called by the reconcile loop while a job runs; writes
  ``status.observed`` and the bottleneck conditions and decides pending re-plans.
- :mod:`~gpuscaler.observe.cli`: ``gpuscaler report JOB``.

See ``docs/observe.md``.
"""
