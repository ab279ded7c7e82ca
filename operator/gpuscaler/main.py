"""kopf registrations of the gpuscaler operator, and nothing else: ``kopf run -m gpuscaler.main``.

``gpuscaler run`` imports this module and runs kopf. Handler code lives in
:mod:`gpuscaler.handlers.trainingjob`.
"""

from __future__ import annotations

import kopf

from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, PLURAL
from gpuscaler.handlers import trainingjob as h
from gpuscaler.names import JOB_LABEL
from gpuscaler.policy import PLURAL as POLICY_PLURAL
from gpuscaler.settings import Settings

_settings = Settings()

kopf.on.startup()(h.startup)
kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})(h.job_pods)
kopf.index("nodes", labels={JOB_LABEL: kopf.PRESENT})(h.job_nodes)
kopf.index(API_GROUP, API_VERSION, PLURAL)(h.namespace_jobs)
if _settings.watch_policies:
    kopf.index(API_GROUP, API_VERSION, POLICY_PLURAL)(h.policy_objects)
kopf.timer(
    API_GROUP,
    API_VERSION,
    PLURAL,
    id="reconcile",
    interval=_settings.reconcile_interval_s,
    when=h.unfinished,
)(h.reconcile)  # type: ignore[arg-type]  # kopf's Protocols do not know index kwargs
kopf.on.delete(API_GROUP, API_VERSION, PLURAL, id="cleanup")(h.delete)  # type: ignore[arg-type]  # ditto
