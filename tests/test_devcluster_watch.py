"""The benchmarks' raw watch (gpuscaler.devcluster.watch): LIST for a resource version, then WATCH from
it, handing on added and modified objects, resuming from the last version seen (a fake list call)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from gpuscaler.devcluster.watch import RawWatch


class Stream(list[bytes]):
    """A watch response: JSON lines, and the connection released after reading."""

    released = False

    def release_conn(self) -> None:
        self.released = True


def event(kind: str, name: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}).encode()


class Recorder(RawWatch):
    def __init__(self, streams: list[Stream]) -> None:
        super().__init__("thing")
        self.streams = streams
        self.calls: list[dict[str, Any]] = []
        self.objects: list[tuple[str, str]] = []

    def list_call(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if not kw.get("watch"):
            return SimpleNamespace(data=b'{"metadata": {"resourceVersion": "10"}, "items": []}')
        index = len(self.calls) - 2  # the watches after the one LIST
        if index == len(self.streams):  # every stream read: end the watch
            self.stop.set()
            return Stream()
        return self.streams[index]

    def seen(self, obj: dict[str, Any]) -> None:
        self.objects.append((obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))


def test_watch_hands_on_added_and_modified_objects_and_resumes_from_the_last_version() -> None:
    first = Stream([event("ADDED", "a", "11"), event("DELETED", "b", "12"), event("MODIFIED", "a", "13")])
    second = Stream([event("BOOKMARK", "", "14"), event("ADDED", "c", "15")])
    w = Recorder([first, second])
    w.run()
    assert w.ready.is_set() and first.released and second.released
    assert w.objects == [("a", "11"), ("a", "13"), ("c", "15")]
    assert w.calls[0] == {"limit": 1, "_preload_content": False}
    assert [c.get("resource_version") for c in w.calls[1:]] == ["10", "13", "15"]
    assert all(c["watch"] and c["_preload_content"] is False and c["timeout_seconds"] == 60 for c in w.calls[1:])


def test_a_broken_stream_says_so_unless_stopped(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(Recorder):
        def list_call(self, **kw: Any) -> Any:
            raise ConnectionError("reset")

    Broken([]).run()
    assert "thing watch failed: ConnectionError('reset')" in capsys.readouterr().err
    quiet = Broken([])
    quiet.stop.set()
    quiet.run()
    assert capsys.readouterr().err == ""
