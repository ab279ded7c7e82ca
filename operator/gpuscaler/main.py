"""kopf registrations of the gpuscaler operator, and nothing else: ``kopf run -m gpuscaler.main``.

``gpuscaler run`` imports this module and runs kopf. Handler code lives in
:mod:`gpuscaler.handlers.trainingjob`.
"""

from __future__ import annotations

import kopf

from gpuscaler.api.profile import PLURAL as PROFILE_PLURAL
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, PLURAL
from gpuscaler.handlers import trainingjob as h
from gpuscaler.names import JOB_LABEL
from gpuscaler.policy import PLURAL as POLICY_PLURAL
from gpuscaler.settings import Settings

_settings = Settings()
DAEMON_EXIT_S = 30.0
"""A job's daemon, told to stop (the job finished or is deleted, the operator exits), gets this long
to finish its step before it is cancelled, then as long again before kopf leaves it (kopf's
cancellation backoff and timeout): a step is at most a few API calls."""

kopf.on.startup()(h.startup)
kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})(h.job_pods)
kopf.index("nodes", labels={JOB_LABEL: kopf.PRESENT})(h.job_nodes)
kopf.index(API_GROUP, API_VERSION, PLURAL)(h.namespace_jobs)
if _settings.watch_policies:
    kopf.index(API_GROUP, API_VERSION, POLICY_PLURAL)(h.policy_objects)
kopf.daemon(
    API_GROUP,
    API_VERSION,
    PLURAL,
    id="reconcile",
    when=h.unfinished,
    cancellation_backoff=DAEMON_EXIT_S,
    cancellation_timeout=DAEMON_EXIT_S,
)(h.job_daemon)  # type: ignore[arg-type]  # kopf's Protocols do not know index kwargs
# every other watch event of these reaches their index functions above, which wake the jobs (h.deleted)
kopf.on.event("pods", labels={JOB_LABEL: kopf.PRESENT}, when=h.deleted)(h.pod_event)
kopf.on.event("nodes", labels={JOB_LABEL: kopf.PRESENT}, when=h.deleted)(h.node_event)
kopf.on.event(API_GROUP, API_VERSION, PLURAL, when=h.deleted)(h.job_event)
if _settings.watch_policies:
    kopf.on.event(API_GROUP, API_VERSION, POLICY_PLURAL)(h.policy_event)
if _settings.profiles_enabled:
    kopf.on.event(API_GROUP, API_VERSION, PROFILE_PLURAL)(h.profile_event)
kopf.on.delete(API_GROUP, API_VERSION, PLURAL, id="cleanup")(h.delete)  # type: ignore[arg-type]  # ditto
