"""Tests of notice handling: downward API annotations file format, request watcher, stop signal."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpuscaler.runtime.constants import ANNOTATION_CHECKPOINT_ACK, ANNOTATION_CHECKPOINT_REQUESTED
from gpuscaler.runtime.notice import (
    AnnotationsFormatError,
    AnnotationWatcher,
    StopSignal,
    parse_downward_annotations,
)


def go_quote_file(annotations: dict[str, str]) -> str:
    """What the kubelet writes: sorted ``key=%q`` lines, no trailing newline (escapes Go would use)."""
    lines = []
    for key in sorted(annotations):
        value = annotations[key]
        out = []
        for ch in value:
            if ch == '"':
                out.append('\\"')
            elif ch == "\\":
                out.append("\\\\")
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ord(ch) < 0x20:
                out.append(f"\\x{ord(ch):02x}")
            else:
                out.append(ch)
        lines.append(f'{key}="{"".join(out)}"')
    return "\n".join(lines)


def test_parse_real_kubelet_format() -> None:
    text = (
        'gpuscaler.io/checkpoint-requested="spot-itn-1717171717"\n'
        'kubectl.kubernetes.io/last-applied-configuration="{\\"apiVersion\\":\\"v1\\",\\"kind\\":\\"Pod\\"}\\n"\n'
        'kubernetes.io/config.seen="2024-05-31T12:00:00.000000000Z"'
    )
    parsed = parse_downward_annotations(text)
    assert parsed == {
        "gpuscaler.io/checkpoint-requested": "spot-itn-1717171717",
        "kubectl.kubernetes.io/last-applied-configuration": '{"apiVersion":"v1","kind":"Pod"}\n',
        "kubernetes.io/config.seen": "2024-05-31T12:00:00.000000000Z",
    }


@pytest.mark.parametrize(
    "value",
    [
        "",
        'say "hi"',
        "back\\slash",
        "multi\nline\nvalue\n",
        "tab\there",
        "ünïcödé ✓ 日本",
        "bell\x07 and \x01",
        'trailing quote"',
        'key="value"\nother="x"',
    ],
)
def test_parse_round_trips_go_quoting(value: str) -> None:
    annotations = {"a.io/first": "1", "b.io/value": value, "c.io/last": "z"}
    assert parse_downward_annotations(go_quote_file(annotations)) == annotations


def test_parse_go_escape_forms() -> None:
    text = 'k="\\u00e9\\U0001F600\\x41\\101\\a\\v\\f\\r\\\'"'
    assert parse_downward_annotations(text) == {"k": "é😀AA\a\v\f\r'"}


def test_parse_tolerates_raw_newlines_crlf_and_unquoted() -> None:
    text = 'a="line one\nline two"\r\nb=plain value\r\n\n  c="x"  \n'
    assert parse_downward_annotations(text) == {"a": "line one\nline two", "b": "plain value", "c": "x"}


@pytest.mark.parametrize(
    "text", ["novalue\n", 'k="unterminated', 'k="bad \\q escape"', 'k="x" junk', 'k="\\x4"']
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(AnnotationsFormatError):
        parse_downward_annotations(text)


def write_annotations(path: Path, annotations: dict[str, str], mtime_ns: int) -> None:
    """Replace the file like the kubelet (new file, atomically) and pin its mtime."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(go_quote_file(annotations))
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def test_watcher_sees_new_request_once_and_respects_ack(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    watcher = AnnotationWatcher(path)
    assert watcher.poll() is None  # no file yet
    write_annotations(path, {"other": "x"}, 1_000)
    assert watcher.poll() is None
    write_annotations(path, {ANNOTATION_CHECKPOINT_REQUESTED: "req-1"}, 2_000)
    assert watcher.poll() == "req-1"
    assert watcher.poll() == "req-1"  # still pending until acknowledged
    watcher.acknowledge("req-1")
    assert watcher.poll() is None
    # The operator mirrors the ack into the pod; a fresh process (new watcher) sees it as done.
    write_annotations(
        path, {ANNOTATION_CHECKPOINT_REQUESTED: "req-1", ANNOTATION_CHECKPOINT_ACK: "req-1"}, 3_000
    )
    assert AnnotationWatcher(path).poll() is None
    write_annotations(
        path, {ANNOTATION_CHECKPOINT_REQUESTED: "req-2", ANNOTATION_CHECKPOINT_ACK: "req-1"}, 4_000
    )
    assert watcher.poll() == "req-2"


def test_watcher_only_rereads_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "annotations"
    write_annotations(path, {ANNOTATION_CHECKPOINT_REQUESTED: "r"}, 1_000)
    watcher = AnnotationWatcher(path)
    assert watcher.refresh() is True
    reads = []
    original = Path.read_text

    def counting_read(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting_read)
    for _ in range(100):
        assert watcher.refresh() is False
    assert reads == []
    write_annotations(path, {ANNOTATION_CHECKPOINT_REQUESTED: "r2"}, 2_000)
    assert watcher.refresh() is True
    assert len(reads) == 1


def test_watcher_min_interval_uses_clock(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    now = [0.0]
    watcher = AnnotationWatcher(path, min_interval_s=1.0, clock=lambda: now[0])
    assert watcher.poll() is None
    write_annotations(path, {ANNOTATION_CHECKPOINT_REQUESTED: "r"}, 1_000)
    now[0] = 0.5
    assert watcher.poll() is None  # too soon to stat again
    now[0] = 1.0
    assert watcher.poll() == "r"


def test_watcher_keeps_last_good_content_on_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    write_annotations(path, {ANNOTATION_CHECKPOINT_REQUESTED: "r"}, 1_000)
    watcher = AnnotationWatcher(path)
    assert watcher.poll() == "r"
    path.write_text('broken="')
    assert watcher.poll() == "r"


def test_stop_signal_sets_flag_and_restores_handler() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopSignal(clock=lambda: 42.0)
    assert stop.install()
    try:
        assert not stop.received
        signal.raise_signal(signal.SIGTERM)
        assert stop.received and stop.signum == signal.SIGTERM and stop.received_at == 42.0
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) == previous
