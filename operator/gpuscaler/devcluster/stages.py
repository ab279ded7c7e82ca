"""Stages for kwok: how fake nodes and pods change state (kwok 0.8 needs them given explicitly).

Copied from kwok's ``kustomize/stage`` (v0.8.0): ``node/fast`` (node-initialize),
``node/heartbeat-with-lease`` and ``pod/fast`` (pod-ready, pod-complete, pod-delete). Two changes,
using the annotations kwok's own ``general`` stages read (a Go duration such as ``"30s"``; no
annotation means at once):

- ``node-initialize`` waits for ``node-initialize.stage.kwok.x-k8s.io/delay`` on the Node, so a
  node can be registered NotReady and turn Ready later, like a booting cloud instance;
- ``pod-complete``, which finishes pods owned by a Job, waits for
  ``pod-complete.stage.kwok.x-k8s.io/delay`` on the Pod, so a test can keep a Job's pod Running.

The stages are built here as objects (:data:`STAGES`) from the parts kwok's files repeat (the node
conditions, addresses and daemon endpoints both node stages write; a container's status; a
terminated state) and dumped as YAML (:data:`STAGES_YAML`): the templates render what kwok's
files' do. ``e2e/kind/stages.yaml`` is the same YAML for a kind cluster's kwok.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from gpuscaler.cloud.kwok_nodes import NODE_READY_DELAY_ANNOTATION

__all__ = ["NODE_READY_DELAY_ANNOTATION", "POD_COMPLETE_DELAY_ANNOTATION", "STAGES", "STAGES_YAML"]

POD_COMPLETE_DELAY_ANNOTATION: Final = "pod-complete.stage.kwok.x-k8s.io/delay"
"""Pod annotation: how long a Job's pod stays Running before kwok marks it Succeeded."""

# --------------------------------------------------------------------- statusTemplate parts
# Go templates that render YAML: each part is written at column 0 and indented where it is used.

_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""
"""Both node stages: the node conditions kwok keeps (Ready and the pressure ones)."""

_DAEMON_ENDPOINTS = """\
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
"""


def _address(value: str, kind: str) -> str:
    """One entry of a node's ``addresses`` from the template function ``value`` (when it gives one)."""
    return f"{{{{ with {value} }}}}\n- address: {{{{ . | Quote }}}}\n  type: {kind}\n{{{{ end }}}}\n"


def _unless_has(flag: str, value: str, kind: str) -> str:
    return f"{{{{ if not ${flag} }}}}\n{_address(value, kind)}{{{{ end }}}}\n"


def _resources(field: str) -> str:
    """``allocatable`` or ``capacity``: the node's own, else kwok's "unlimited" defaults."""
    return (
        f"{field}:\n{{{{ with .status.{field} }}}}\n{{{{ YAML . 1 }}}}\n{{{{ else }}}}\n"
        "  cpu: 1k\n  memory: 1Ti\n  pods: 1M\n{{ end }}\n"
    )


_NODE_INFO = """\
{{ $nodeInfo := .status.nodeInfo }}
{{ $kwokVersion := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $nodeInfo.architecture "amd64" }}
  bootID: {{ or $nodeInfo.bootID `""` }}
  containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
  kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
  kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
  kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
  machineID: {{ or $nodeInfo.machineID `""` }}
  operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
  osImage: {{ or $nodeInfo.osImage `""` }}
  systemUUID: {{ or $nodeInfo.systemUUID `""` }}
phase: Running
"""

_NODE_INITIALIZE = "\n".join(
    [
        _NODE_CONDITIONS,
        """\
{{ $hasInternalIP := false }}
{{ $hasHostname := false }}
{{ range .status.addresses }}
  {{ if eq .type "InternalIP" }}
    {{ $hasInternalIP = true }}
  {{ end }}
  {{ if eq .type "Hostname" }}
    {{ $hasHostname = true }}
  {{ end }}
{{ end }}
{{ if or (not $hasInternalIP) (not $hasHostname) }}
addresses:
{{ end }}
"""
        + _unless_has("hasInternalIP", "NodeIP", "InternalIP")
        + _unless_has("hasHostname", "NodeName", "Hostname"),
        _DAEMON_ENDPOINTS,
        _resources("allocatable") + _resources("capacity"),
        _NODE_INFO,
    ]
)

_NODE_HEARTBEAT = "\n".join(
    [
        _NODE_CONDITIONS,
        "addresses:\n{{ with .status.addresses }}\n{{ YAML . 1 }}\n{{ else }}\n"
        + _address("NodeIP", "InternalIP")
        + _address("NodeName", "Hostname")
        + "{{ end }}\n",
        _DAEMON_ENDPOINTS,
    ]
)


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def _container_status(item: str, ready: bool, state: str) -> str:
    """One entry of ``containerStatuses``: ``item`` is the template's container (``.`` or ``$item``)."""
    head = f"- image: {{{{ {item}.image | Quote }}}}\n  name: {{{{ {item}.name | Quote }}}}\n"
    return head + f"  ready: {str(ready).lower()}\n  restartCount: 0\n" + _indent(state, 2)


_RUNNING = "state:\n  running:\n    startedAt: {{ $now | Quote }}\n"
_TERMINATED = """\
state:
  terminated:
    exitCode: 0
    finishedAt: {{ $now | Quote }}
    reason: Completed
    startedAt: {{ $now | Quote }}
"""
_INIT_STATE = (
    '{{ if eq .restartPolicy "Always" }}\nstarted: true\n' + _RUNNING + "{{ else }}\n" + _TERMINATED + "{{ end }}\n"
)
"""An init container's: a sidecar (``restartPolicy: Always``) runs, the others have finished."""


def _true_condition(kind: str) -> str:
    return f'- lastTransitionTime: {{{{ $now | Quote }}}}\n  status: "True"\n  type: {kind}\n'


def _ips(var: str, found_by: str, field: str) -> str:
    """``hostIP``/``hostIPs`` or ``podIP``/``podIPs`` from a kwok template function."""
    return (
        f"{{{{ ${var} := {found_by} }}}}\n{{{{ with ${var} }}}}\n{field}: {{{{ index . 0 | Quote }}}}\n"
        f"{field}s:\n{{{{ range . }}}}\n- ip: {{{{ . | Quote }}}}\n{{{{ end }}}}\n{{{{ end }}}}\n"
    )


_POD_READY = "\n".join(
    [
        "{{ $now := Now }}\n",
        "conditions:\n"
        + "".join(_true_condition(c) for c in ("Initialized", "Ready", "ContainersReady"))
        + "{{ range .spec.readinessGates }}\n"
        + _true_condition("{{ .conditionType | Quote }}")
        + "{{ end }}\n",
        "containerStatuses:\n{{ range .spec.containers }}\n"
        + _container_status("", True, _RUNNING)
        + "{{ end }}\n",
        "initContainerStatuses:\n{{ range .spec.initContainers }}\n"
        + _container_status("", True, _INIT_STATE)
        + "{{ end }}\n"
        + _ips("hostIPs", "NodeIPsWith .spec.nodeName", "hostIP")
        + _ips(
            "podIPs",
            'PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) '
            '( or .metadata.name "" ) ( or .metadata.namespace "" )',
            "podIP",
        )
        + "phase: Running\nstartTime: {{ $now | Quote }}\n",
    ]
)

_POD_COMPLETE = (
    "{{ $now := Now }}\n{{ $root := . }}\ncontainerStatuses:\n{{ range $index, $item := .spec.containers }}\n"
    "{{ $origin := index $root.status.containerStatuses $index }}\n"
    + _container_status("$item", False, "started: false\n" + _TERMINATED)
    + "{{ end }}\nphase: Succeeded\n"
)

# ----------------------------------------------------------------------------------- the stages


def _match(key: str, operator: str, *values: str) -> dict[str, Any]:
    """One ``matchExpressions`` entry (a jq-like path into the object)."""
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_NOT_DELETING = _match(".metadata.deletionTimestamp", "DoesNotExist")


def _delay_from(annotation: str) -> dict[str, Any]:
    """At once, unless the object carries ``annotation`` (a Go duration such as ``"30s"``)."""
    expression = f'.metadata.annotations["{annotation}"]'
    return {"durationMilliseconds": 0, "durationFrom": {"expressionFrom": expression}}


def _stage(
    name: str, kind: str, match: list[dict[str, Any]], then: dict[str, Any], delay: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A kwok ``Stage``: when an object of ``kind`` matches ``match``, after ``delay``, do ``then``."""
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": match},
    }
    if delay is not None:
        spec["delay"] = delay
    spec["next"] = then
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


STAGES: Final[list[dict[str, Any]]] = [
    _stage(
        "node-initialize",
        "Node",
        [_match(_READY, "NotIn", "True")],
        {"statusTemplate": _NODE_INITIALIZE},
        _delay_from(NODE_READY_DELAY_ANNOTATION),
    ),
    _stage(
        "node-heartbeat-with-lease",
        "Node",
        [_match(".status.phase", "In", "Running"), _match(_READY, "In", "True")],
        {"statusTemplate": _NODE_HEARTBEAT},
        {"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000},
    ),
    _stage(
        "pod-ready",
        "Pod",
        [_NOT_DELETING, _match(".status.phase", "In", "Pending"), _match(_READY, "NotIn", "True")],
        {"statusTemplate": _POD_READY},
    ),
    _stage(
        "pod-complete",
        "Pod",
        [
            _NOT_DELETING,
            _match(".status.phase", "In", "Running"),
            _match(".metadata.ownerReferences.[].kind", "In", "Job"),
        ],
        {"statusTemplate": _POD_COMPLETE},
        _delay_from(POD_COMPLETE_DELAY_ANNOTATION),
    ),
    _stage("pod-delete", "Pod", [_match(".metadata.deletionTimestamp", "Exists")], {"delete": True}),
]
"""The five Stage objects."""


class _Dumper(yaml.SafeDumper):
    """Templates as literal blocks (``|``), so the YAML reads like kwok's own."""


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _literal)

STAGES_YAML: Final = "---\n".join(yaml.dump(s, Dumper=_Dumper, sort_keys=False, width=1000) for s in STAGES)
"""The five Stage objects, as one multi-document YAML string."""


def kwok_config() -> str:
    """A kwok ``--config`` file holding the stages only.

    Options go on kwok's command line: a ``KwokConfiguration`` document in the file would replace
    kwok's defaulted options wholesale (kwok 0.8 then refuses to start with zero parallelism).
    """
    return STAGES_YAML.strip() + "\n"
