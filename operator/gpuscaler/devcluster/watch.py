"""One collection's LIST and WATCH as raw JSON lines in a thread: what the benchmarks time with.

The kubernetes client's ``Watch`` builds a model object per event; at thousands of events a second
that is what limits the watcher, not the API server. :class:`RawWatch` reads the stream with
``_preload_content=False`` instead and hands each added or modified object, a plain dict, to
:meth:`RawWatch.seen`. It takes nothing from the dev cluster but a list call, so it watches any
cluster's collection (``benchmarks/cluster_scale.py`` times pods with it).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

WATCH_TIMEOUT_S = 60
"""Each watch request's ``timeout_seconds``: the longest :attr:`RawWatch.stop` waits for an event."""


class RawWatch(threading.Thread):
    """A daemon thread watching one collection from its current resource version.

    Subclasses define :meth:`list_call` (the collection's list call of the kubernetes client) and
    :meth:`seen`. ``ready`` is set once the first watch is open: what happens after it is seen.
    ``stop`` ends the thread at the next event, or when the open watch times out. A broken stream
    ends it too, with a line on stderr unless ``stop`` was set (the cluster stopping breaks it).

    Args:
        what: The collection, for that line (``pod``: ``pod watch failed: ...``).
    """

    def __init__(self, what: str) -> None:
        super().__init__(daemon=True)
        self.what = what
        self.stop = threading.Event()
        self.ready = threading.Event()

    def list_call(self, **kw: Any) -> Any:
        """The collection's list call with these keywords (``limit``, ``watch``, ``resource_version``,
        ``_preload_content`` ...), e.g. ``core.list_namespaced_pod(namespace, **kw)``."""
        raise NotImplementedError

    def seen(self, obj: dict[str, Any]) -> None:
        """An object as an ADDED or MODIFIED event carried it (called on this thread)."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            self._watch()
        except Exception as e:  # the stream breaks when the cluster stops: expected then
            if not self.stop.is_set():
                print(f"{self.what} watch failed: {e!r}", file=sys.stderr, flush=True)

    def _watch(self) -> None:
        rv = json.loads(self.list_call(limit=1, _preload_content=False).data)["metadata"]["resourceVersion"]
        while not self.stop.is_set():
            resp = self.list_call(
                watch=True,
                resource_version=rv,
                timeout_seconds=WATCH_TIMEOUT_S,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
            self.ready.set()
            for line in resp:
                if self.stop.is_set():
                    break
                ev = json.loads(line)
                obj = ev["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                if ev["type"] in ("ADDED", "MODIFIED"):
                    self.seen(obj)
            resp.release_conn()
