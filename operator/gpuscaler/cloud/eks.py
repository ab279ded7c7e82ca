"""The eks provider: EKS managed node groups, one per (instance type, capacity type), via boto3.

How it maps the :class:`~gpuscaler.cloud.provider.NodePoolProvider` contract onto EKS:

- **Finding the group.** A node group serves an offering when its tags (or, failing that, its
  Kubernetes labels) say ``gpuscaler.io/instance-type=<type>`` and
  ``gpuscaler.io/capacity-type=<on-demand|spot>``; an untagged group whose ``instanceTypes`` is
  exactly ``[<type>]`` with the matching ``capacityType`` serves too. With a template configured
  (:class:`EksTemplate`: subnets and node role), a missing group is created
  (``gpuscaler-<type>-<capacity>``, min 0, tainted ``nvidia.com/gpu``, labelled and tagged).
- **Zones.** A plan pinned to a zone (``us-east-1b``) needs a group whose subnets are in that zone:
  one tagged ``gpuscaler.io/zone=<zone>``, or one created from the template with only the
  template's subnets in that Availability Zone (``ec2.describe_subnets`` says which) and named
  ``gpuscaler-<type>-<capacity>-<zone>``. The workers select ``topology.kubernetes.io/zone``.
- **Scaling up.** ``update_nodegroup_config`` raises ``desiredSize`` by what the job still lacks
  beyond instances already launching. Instances register their Node objects on their own; this
  provider never creates a Node. Registered nodes of the group that no job holds are *adopted*
  (:mod:`gpuscaler.cloud.adoption`): labelled with the job, which is how the loop sees them.
- **Scaling down.** Each released node's instance (from ``spec.providerID``) is terminated through
  its Auto Scaling group with ``ShouldDecrementDesiredCapacity`` when an autoscaling client is
  given, so exactly that node goes; the node group's ``desiredSize`` is then lowered by as many.
  Without one, only ``desiredSize`` is lowered and the ASG picks the instances.
- **Errors.** Throttling (``ThrottlingException`` and kin) is retried with exponential backoff.
  ``InsufficientInstanceCapacity``, spot shortages (``InsufficientSpotCapacity``,
  ``SpotMaxPriceTooLow``…), either as API error codes or inside the group's health issues
  (``AsgInstanceLaunchFailures``), become :class:`InsufficientCapacityError` wrapping the cause,
  so the loop leaves the offering out and the planner chooses again.
- **Credentials.** boto3's default chain: on EKS, IRSA (a ServiceAccount annotated
  ``eks.amazonaws.com/role-arn``) or EKS Pod Identity. The IAM policy is in ``docs/providers.md``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpuscaler import names
from gpuscaler.catalog import CapacityType
from gpuscaler.catalog.models import HELD_CAPACITY
from gpuscaler.cloud.adoption import NodeAdopter
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    InsufficientCapacityError,
    JobRef,
    NodeRequest,
    ProviderError,
    Scheduling,
    cloud_error,
)
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, JOB_LABEL

INSTANCE_TAG = names.INSTANCE_TYPE_KEY
"""Node-group tag (or label) naming the instance type it serves."""
CAPACITY_TAG = names.CAPACITY_TYPE_KEY
"""Node-group tag (or label) naming the capacity type it serves: ``on-demand`` or ``spot``."""
ZONE_TAG = names.ZONE_KEY
"""Node-group tag (or label) naming the Availability Zone it serves (its subnets are in it)."""
NODEGROUP_LABEL = names.EKS_NODEGROUP_LABEL
"""Label EKS puts on every node of a managed node group."""
EKS_CAPACITY_LABEL = names.EKS_CAPACITY_LABEL
"""Label EKS puts on every node: ``ON_DEMAND`` or ``SPOT``."""

EKS_CAPACITY = {
    CapacityType.ON_DEMAND: "ON_DEMAND",
    CapacityType.SPOT: "SPOT",
    CapacityType.RESERVED: "ON_DEMAND",  # an ODCR's instances are on-demand ones its launch template targets
    CapacityType.CAPACITY_BLOCK: "CAPACITY_BLOCK",
}
"""EKS's ``capacityType`` of each capacity type it serves (no flex-start: EKS has none)."""


def eks_capacity(capacity: CapacityType) -> str:
    """EKS's ``capacityType`` of a capacity type.

    Raises:
        ProviderError: flex-start (EKS offers none).
    """
    if capacity not in EKS_CAPACITY:
        raise ProviderError(f"eks: EKS has no {capacity.value} capacity; leave it out of the policy's capacity for this cluster")
    return EKS_CAPACITY[capacity]

THROTTLING_CODES = frozenset(
    {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}
)
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientSpotCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "UnfulfillableCapacity",
    }
)
"""EC2 error codes that mean "no capacity of this offering right now" (EC2 API error reference)."""
CAPACITY_MESSAGE = re.compile(
    "|".join(
        [*sorted(CAPACITY_CODES), r"no Spot capacity", r"capacity-not-available", r"insufficient capacity"]
    ),
    re.IGNORECASE,
)
CAPACITY_ISSUES = frozenset({"AsgInstanceLaunchFailures", "NodeCreationFailure"})
"""Node-group health issues whose message may carry a capacity error."""
BUSY_CODES = frozenset({"ResourceInUseException"})
"""The group is being created or updated: not an error, the next reconcile tries again."""

_PROVIDER_ID = re.compile(r"^aws:///[^/]*/(i-[0-9a-f]+)$")


@dataclass(frozen=True)
class EksTemplate:
    """How to create a node group for an offering that has none (all of it from settings)."""

    subnets: list[str]
    node_role_arn: str
    ami_type: str = "AL2023_x86_64_NVIDIA"
    """EKS AMI type with the NVIDIA driver (``AL2023_x86_64_NVIDIA``, ``BOTTLEROCKET_x86_64_NVIDIA``)."""
    disk_size_gb: int = 200
    max_nodes: int = 16
    """``maxSize`` of a created group (raised when a plan needs more)."""
    taint_key: str = names.GPU_RESOURCE
    tags: dict[str, str] = field(default_factory=dict)
    subnet_zones: dict[str, str] = field(default_factory=dict)
    """Availability Zone of each subnet, when known up front; else asked of EC2 when a zone is planned."""


@dataclass
class _Group:
    name: str
    asg: str | None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


class EksProvider(AdoptsNodes):
    """Scales EKS managed node groups; adopts the nodes they register."""

    name = "eks"

    def __init__(
        self,
        eks: Any,
        core: Any,
        *,
        cluster: str,
        autoscaling: Any | None = None,
        template: EksTemplate | None = None,
        ec2: Any | None = None,
        retries: int = 5,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        toleration_key: str | None = None,
    ) -> None:
        """
        Args:
            eks: A boto3 ``eks`` client.
            core: A Kubernetes ``CoreV1Api`` (to adopt and find the group's nodes).
            cluster: The EKS cluster name.
            autoscaling: A boto3 ``autoscaling`` client for targeted scale-down (optional).
            template: How to create missing node groups; None = only use existing ones.
            ec2: A boto3 ``ec2`` client, to learn the template subnets' Availability Zones
                (``describe_subnets``) when a plan names a zone.
            retries: Attempts of a throttled call before giving up.
            backoff_s: First backoff delay; doubled per attempt.
            sleep: Injected for tests.
            toleration_key: Taint key of the GPU nodes that workers tolerate (the operator's
                ``GPUSCALER_GPU_TOLERATION_KEY``); None: the template's taint key, else
                ``nvidia.com/gpu`` (the EKS GPU AMIs' own).
        """
        self.toleration_key = toleration_key or (template.taint_key if template else names.GPU_RESOURCE)
        self.eks = eks
        self.autoscaling = autoscaling
        self.cluster = cluster
        self.template = template
        self.ec2 = ec2
        self._subnet_zones: dict[str, str] = dict(template.subnet_zones) if template else {}
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.adopter = NodeAdopter(core)
        self._groups: dict[tuple[str, str, str], _Group] = {}

    # ------------------------------------------------------------------ AWS calls

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Call a boto3 method, retrying throttling with exponential backoff; map errors to typed ones."""
        delay = self.backoff_s
        for attempt in range(self.retries):
            try:
                return fn(**kwargs)
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                if code in THROTTLING_CODES and attempt < self.retries - 1:
                    self.sleep(delay)
                    delay *= 2
                    continue
                no_capacity = code in CAPACITY_CODES or bool(CAPACITY_MESSAGE.search(str(err)))
                raise cloud_error(f"eks: {what}, {err}", no_capacity=no_capacity) from err
            except BotoCoreError as err:
                raise ProviderError(f"eks: {what}, {err}") from err
        raise AssertionError("unreachable")  # pragma: no cover

    def _describe(self, group: str) -> dict[str, Any]:
        out: dict[str, Any] = self._call(
            f"describing node group {group}",
            self.eks.describe_nodegroup,
            clusterName=self.cluster,
            nodegroupName=group,
        )["nodegroup"]
        return out

    def _list_groups(self) -> list[str]:
        names: list[str] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"clusterName": self.cluster}
            if token:
                kw["nextToken"] = token
            page = self._call(f"listing node groups of {self.cluster}", self.eks.list_nodegroups, **kw)
            names += page.get("nodegroups", [])
            token = page.get("nextToken")
            if not token:
                return names

    @staticmethod
    def _serves(ng: dict[str, Any], instance: str, capacity: CapacityType, zone: str = "") -> bool:
        for meta in (ng.get("tags") or {}, ng.get("labels") or {}):
            if zone and meta.get(ZONE_TAG, "") != zone:
                continue
            if INSTANCE_TAG in meta:
                return bool(meta[INSTANCE_TAG] == instance and meta.get(CAPACITY_TAG) == capacity.value)
        if zone:
            return False  # a group serves a zone only when tagged with it
        return bool(
            ng.get("instanceTypes") == [instance]
            and capacity is not CapacityType.RESERVED  # a reservation's group is told apart by its tags only
            and ng.get("capacityType", "ON_DEMAND") == eks_capacity(capacity)
        )

    @staticmethod
    def _asg(ng: dict[str, Any]) -> str | None:
        asgs = (ng.get("resources") or {}).get("autoScalingGroups") or []
        return str(asgs[0]["name"]) if asgs else None

    def find_group(self, instance: str, capacity: CapacityType, zone: str = "") -> str | None:
        """The name of the node group that serves an offering (in ``zone``, when given), or None."""
        key = (instance, capacity.value, zone)
        if key in self._groups:
            return self._groups[key].name
        for name in self._list_groups():
            ng = self._describe(name)
            if self._serves(ng, instance, capacity, zone):
                self._groups[key] = _Group(name, self._asg(ng))
                return name
        return None

    def _subnets(self, zone: str) -> list[str]:
        """The template's subnets in ``zone`` (all of them for ""), their zones asked of EC2 once.

        Raises:
            ProviderError: no subnet of the template is in ``zone``, or EC2 cannot say.
        """
        t = self.template
        assert t is not None
        if not zone:
            return list(t.subnets)
        unknown = [s for s in t.subnets if s not in self._subnet_zones]
        if unknown:
            if self.ec2 is None:
                raise ProviderError(f"eks: the Availability Zones of subnets {unknown} are unknown (no EC2 client)")
            page = self._call(f"describing subnets {unknown}", self.ec2.describe_subnets, SubnetIds=unknown)
            self._subnet_zones.update({s["SubnetId"]: s["AvailabilityZone"] for s in page.get("Subnets", [])})
        inside = [s for s in t.subnets if self._subnet_zones.get(s) == zone]
        if not inside:
            raise ProviderError(
                f"eks: no subnet of GPUSCALER_EKS_SUBNETS is in {zone} (theirs: "
                f"{', '.join(sorted({self._subnet_zones.get(s, '?') for s in t.subnets}))}); add one in "
                f"{zone}, or keep plans out of it (constraints.zones, policy zones)"
            )
        return inside

    def _create_group(self, request: NodeRequest, desired: int) -> str:
        t = self.template
        assert t is not None
        inst, cap, zone = request.instance.name, request.capacity, request.zone
        subnets = self._subnets(zone)
        name = f"gpuscaler-{_slug(inst)}-{cap.value}" + (f"-{zone}" if zone else "")
        name = name[:63]
        meta = {INSTANCE_TAG: inst, CAPACITY_TAG: cap.value, **({ZONE_TAG: zone} if zone else {})}
        self._call(
            f"creating node group {name} ({inst}, {cap.value})",
            self.eks.create_nodegroup,
            clusterName=self.cluster,
            nodegroupName=name,
            scalingConfig={"minSize": 0, "maxSize": max(t.max_nodes, desired), "desiredSize": desired},
            diskSize=t.disk_size_gb,
            subnets=subnets,
            instanceTypes=[inst],
            amiType=t.ami_type,
            nodeRole=t.node_role_arn,
            capacityType=eks_capacity(cap),
            labels={**meta, CAPACITY_TYPE_LABEL: cap.value},
            taints=[{"key": t.taint_key, "effect": "NO_SCHEDULE"}],
            tags={**t.tags, **meta, names.MANAGED_LABEL: "true"},
        )
        self._groups[(inst, cap.value, zone)] = _Group(name, None)
        return name

    @staticmethod
    def _capacity_issue(ng: dict[str, Any]) -> str | None:
        for issue in (ng.get("health") or {}).get("issues") or []:
            msg = f"{issue.get('code', '')}: {issue.get('message', '')}"
            if issue.get("code") in CAPACITY_ISSUES and CAPACITY_MESSAGE.search(msg):
                return msg
        return None

    # ------------------------------------------------------------------ the Protocol

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        inst, cap = request.instance.name, request.capacity
        have = sum(1 for n in existing if not n.deleting)
        group = self.find_group(inst, cap, request.zone)
        if group is None:
            if cap in HELD_CAPACITY:  # its launch template must target the reservation: made by the platform team
                raise ProviderError(
                    f"eks: no node group of cluster {self.cluster} serves {inst} ({cap.value}"
                    f"{f', reservation {request.reservation_id}' if request.reservation_id else ''}); create one whose "
                    f"launch template targets the reservation (capacityType {eks_capacity(cap)}) and tag it "
                    f"{INSTANCE_TAG}={inst}, {CAPACITY_TAG}={cap.value} (docs/providers.md)"
                )
            if self.template is None:
                where = f" in {request.zone}" if request.zone else ""
                zone_tag = f", {ZONE_TAG}={request.zone}" if request.zone else ""
                raise ProviderError(
                    f"eks: no node group of cluster {self.cluster} serves {inst} ({cap.value}){where}; tag one "
                    f"{INSTANCE_TAG}={inst}, {CAPACITY_TAG}={cap.value}{zone_tag} or configure a node-group "
                    "template (GPUSCALER_EKS_SUBNETS, GPUSCALER_EKS_NODE_ROLE_ARN)"
                )
            self._create_group(request, max(0, request.count - have))
            return []  # CREATING: nodes register later; the next reconcile adopts them
        selector = f"{NODEGROUP_LABEL}={group}"
        adopted = self.adopter.adopt(request, selector, have)
        missing = request.count - have - len(adopted)
        if missing <= 0:
            return adopted
        ng = self._describe(group)
        self._groups[(inst, cap.value, request.zone)].asg = self._asg(ng)
        issue = self._capacity_issue(ng)
        if issue:
            raise InsufficientCapacityError(
                f"eks: node group {group} cannot launch {inst} ({cap.value}): {issue}"
            )
        if ng.get("status") != "ACTIVE":
            return adopted  # CREATING / UPDATING: try again on the next reconcile
        scaling = ng.get("scalingConfig") or {}
        desired = int(scaling.get("desiredSize", 0))
        registered = len(self.adopter.group_nodes(selector))
        launching = max(0, desired - registered)
        if missing <= launching:
            return adopted
        new_desired = desired + missing - launching
        config = {
            "minSize": int(scaling.get("minSize", 0)),
            "maxSize": max(int(scaling.get("maxSize", 1)), new_desired),
            "desiredSize": new_desired,
        }
        try:
            self._call(
                f"scaling node group {group} to {new_desired} ({inst}, {cap.value})",
                self.eks.update_nodegroup_config,
                clusterName=self.cluster,
                nodegroupName=group,
                scalingConfig=config,
            )
        except ProviderError as err:
            cause = err.__cause__
            if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") in BUSY_CODES:
                return adopted  # an update is in progress; the next reconcile tries again
            raise
        return adopted

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        """Terminate the nodes' instances (or lower ``desiredSize``) and drop the job label."""
        if not nodes:
            return []
        names = [n.name for n in nodes]
        by_group: dict[str, list[Any]] = {}
        for node in self.adopter.group_nodes(f"{JOB_LABEL}={job.label}"):
            if node.metadata.name in names:
                group = (node.metadata.labels or {}).get(NODEGROUP_LABEL)
                if group:
                    by_group.setdefault(group, []).append(node)
        released: list[str] = []
        for group, group_nodes in by_group.items():
            ng = self._describe(group)
            asg = self._asg(ng)
            terminated = 0
            for node in group_nodes:
                m = _PROVIDER_ID.match(node.spec.provider_id or "") if node.spec else None
                if self.autoscaling is not None and asg and m:
                    self._call(
                        f"terminating instance {m[1]} of node {node.metadata.name} ({job.key})",
                        self.autoscaling.terminate_instance_in_auto_scaling_group,
                        InstanceId=m[1],
                        ShouldDecrementDesiredCapacity=True,
                    )
                    terminated += 1
                released.append(node.metadata.name)
            scaling = ng.get("scalingConfig") or {}
            desired = int(scaling.get("desiredSize", 0))
            new_desired = max(int(scaling.get("minSize", 0)), desired - len(group_nodes))
            if new_desired != desired:
                self._call(
                    f"scaling node group {group} down to {new_desired} (released {len(group_nodes)} of {job.key})",
                    self.eks.update_nodegroup_config,
                    clusterName=self.cluster,
                    nodegroupName=group,
                    scalingConfig={
                        "minSize": int(scaling.get("minSize", 0)),
                        "maxSize": int(scaling.get("maxSize", 1)),
                        "desiredSize": new_desired,
                    },
                )
            if terminated < len(group_nodes):
                # the ASG picks which instances go: free the nodes for other jobs meanwhile
                self.adopter.disown([n.metadata.name for n in group_nodes])
        return released

    def scheduling(self, request: NodeRequest) -> Scheduling:
        key = self.toleration_key
        return Scheduling(
            node_selector={
                INSTANCE_TYPE_LABEL: request.instance.name,
                EKS_CAPACITY_LABEL: eks_capacity(request.capacity),
                JOB_LABEL: request.job.label,
                **request.zone_selector(),
            },
            tolerations=[{"key": key, "operator": "Exists", "effect": "NoSchedule"}],
        )
