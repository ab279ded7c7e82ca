"""The eks provider against moto's EKS: find/create node groups, scale up and down, typed errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from kubernetes import client
from moto import mock_aws

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JOB_LABEL, InsufficientCapacityError, JobRef, NodeRequest, ProviderError
from gpuscaler.cloud.eks import CAPACITY_TAG, INSTANCE_TAG, EksProvider, EksTemplate
from gpuscaler.cloud.nodes import node_state
from gpuscaler.planner import plan
from loop_harness import FakeCore

CAT = load_catalog()
REGION = "us-east-1"
CLUSTER = "train"
JOB = JobRef("ml", "bert")


def request(
    instance: str = "p4d.24xlarge", capacity: CapacityType = CapacityType.ON_DEMAND, count: int = 2
) -> NodeRequest:
    inst = CAT.instance(instance)
    return NodeRequest(JOB, inst, capacity, count, inst.price(capacity) or 0.0)


def states(core: FakeCore) -> list[Any]:
    return [
        node_state(client.ApiClient().sanitize_for_serialization(n))
        for n in core.nodes.values()
        if (n.metadata.labels or {}).get(JOB_LABEL) == JOB.label
    ]


@pytest.fixture
def aws() -> Iterator[tuple[Any, Any]]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        iam = boto3.client("iam", region_name=REGION)
        role = iam.create_role(RoleName="eks", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
        eks = boto3.client("eks", region_name=REGION)
        eks.create_cluster(name=CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]})
        yield eks, (role, subnet)


def _group(
    eks: Any, name: str, instance: str, capacity: str, role: str, subnet: str, tags: bool = True
) -> None:
    eks.create_nodegroup(
        clusterName=CLUSTER,
        nodegroupName=name,
        scalingConfig={"minSize": 0, "maxSize": 8, "desiredSize": 0},
        subnets=[subnet],
        nodeRole=role,
        instanceTypes=[instance],
        capacityType="SPOT" if capacity == "spot" else "ON_DEMAND",
        tags={INSTANCE_TAG: instance, CAPACITY_TAG: capacity} if tags else {},
    )


def _desired(eks: Any, name: str) -> int:
    return int(
        eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]["scalingConfig"][
            "desiredSize"
        ]
    )


def test_scale_up_adopt_and_scale_down(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    _group(eks, "a100-od", "p4d.24xlarge", "on-demand", role, subnet)
    _group(eks, "a100-spot", "p4d.24xlarge", "spot", role, subnet)
    _group(eks, "untagged-h100", "p5.48xlarge", "on-demand", role, subnet, tags=False)
    core = FakeCore()
    p = EksProvider(eks, core, cluster=CLUSTER)

    assert p.find_group("p4d.24xlarge", CapacityType.SPOT) == "a100-spot"
    assert p.find_group("p5.48xlarge", CapacityType.ON_DEMAND) == "untagged-h100"  # by instanceTypes
    assert p.find_group("g5.xlarge", CapacityType.ON_DEMAND) is None

    req = request(count=2)
    assert p.ensure_nodes(req, []) == []
    assert _desired(eks, "a100-od") == 2
    assert p.ensure_nodes(req, []) == []  # idempotent: 2 instances already launching
    assert _desired(eks, "a100-od") == 2

    core.register("ip-10-0-0-1", "a100-od", "i-0000000000000001")
    core.register("ip-10-0-0-2", "a100-od", "i-0000000000000002")
    assert sorted(p.ensure_nodes(req, [])) == ["ip-10-0-0-1", "ip-10-0-0-2"]
    held = states(core)
    assert len(held) == 2 and all(
        n.usd_per_hour == pytest.approx(req.usd_per_hour_per_node, rel=1e-5) for n in held
    )
    assert p.ensure_nodes(req, held) == []
    assert _desired(eks, "a100-od") == 2

    sched = p.scheduling(req)
    assert sched.node_selector == {
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        JOB_LABEL: JOB.label,
    }

    # scale down without an autoscaling client: desiredSize lowered, nodes freed for other jobs
    assert sorted(p.release_nodes(JOB, held)) == ["ip-10-0-0-1", "ip-10-0-0-2"]
    assert _desired(eks, "a100-od") == 0
    assert states(core) == []


def test_targeted_scale_down_terminates_the_instances(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    _group(eks, "a100-od", "p4d.24xlarge", "on-demand", role, subnet)
    core = FakeCore()
    asg = mock.Mock()
    p = EksProvider(eks, core, cluster=CLUSTER, autoscaling=asg)
    p.ensure_nodes(request(count=1), [])
    core.register("ip-1", "a100-od", "i-00000000000000aa")
    p.ensure_nodes(request(count=1), [])
    # moto's node groups have no ASG: pretend EKS reports one
    real = eks.describe_nodegroup

    def with_asg(**kw: Any) -> Any:
        out = real(**kw)
        out["nodegroup"]["resources"] = {"autoScalingGroups": [{"name": "eks-a100-od"}]}
        return out

    with mock.patch.object(eks, "describe_nodegroup", side_effect=with_asg):
        assert p.release_nodes(JOB, states(core)) == ["ip-1"]
    asg.terminate_instance_in_auto_scaling_group.assert_called_once_with(
        InstanceId="i-00000000000000aa", ShouldDecrementDesiredCapacity=True
    )
    assert _desired(eks, "a100-od") == 0


def test_creates_a_missing_group_from_the_template(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    p = EksProvider(
        eks, FakeCore(), cluster=CLUSTER, template=EksTemplate(subnets=[subnet], node_role_arn=role)
    )
    assert p.ensure_nodes(request("g5.12xlarge", CapacityType.SPOT, 3), []) == []
    ng = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpuscaler-g5-12xlarge-spot")["nodegroup"]
    assert ng["capacityType"] == "SPOT" and ng["instanceTypes"] == ["g5.12xlarge"]
    assert ng["scalingConfig"]["desiredSize"] == 3
    assert ng["tags"][INSTANCE_TAG] == "g5.12xlarge" and ng["labels"]["karpenter.sh/capacity-type"] == "spot"


def test_no_group_and_no_template_says_what_to_do(aws: tuple[Any, Any]) -> None:
    eks, _ = aws
    with pytest.raises(ProviderError, match=r"tag one gpuscaler\.io/instance-type=p4d\.24xlarge"):
        EksProvider(eks, FakeCore(), cluster=CLUSTER).ensure_nodes(request(), [])


def _client_error(code: str, op: str = "UpdateNodegroupConfig") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} for p4d.24xlarge"}}, op)


def test_throttling_is_retried_with_backoff(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    _group(eks, "a100-od", "p4d.24xlarge", "on-demand", role, subnet)
    slept: list[float] = []
    p = EksProvider(eks, FakeCore(), cluster=CLUSTER, sleep=slept.append, backoff_s=0.25)
    real = eks.update_nodegroup_config
    fails = iter([_client_error("ThrottlingException"), _client_error("ThrottlingException")])

    def flaky(**kw: Any) -> Any:
        err = next(fails, None)
        if err:
            raise err
        return real(**kw)

    with mock.patch.object(eks, "update_nodegroup_config", side_effect=flaky):
        p.ensure_nodes(request(count=1), [])
    assert slept == [0.25, 0.5]
    assert _desired(eks, "a100-od") == 1

    p2 = EksProvider(eks, FakeCore(), cluster=CLUSTER, sleep=slept.append, retries=2)
    with (
        mock.patch.object(eks, "describe_nodegroup", side_effect=_client_error("ThrottlingException")),
        pytest.raises(ProviderError, match="ThrottlingException") as info,
    ):
        p2.ensure_nodes(request(count=1), [])
    assert not isinstance(info.value, InsufficientCapacityError)


def _spec() -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {
            "workload": {"model": "resnet50"},
            "globalBatch": 1024,
            "training": {"epochs": 10},
            "constraints": {"providers": ["aws"], "spot": "allowed"},
        }
    )


def test_capacity_error_is_typed_and_the_planner_chooses_again(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    first = plan(_spec(), CAT).chosen
    assert first is not None
    inst, cap = first.instance.name, first.capacity
    _group(eks, "chosen", inst, cap.value, role, subnet)
    p = EksProvider(eks, FakeCore(), cluster=CLUSTER)
    err = _client_error("InsufficientInstanceCapacity")
    with (
        mock.patch.object(eks, "update_nodegroup_config", side_effect=err),
        pytest.raises(InsufficientCapacityError, match="InsufficientInstanceCapacity") as info,
    ):
        p.ensure_nodes(request(inst, cap, first.nodes), [])
    assert info.value.__cause__ is err
    again = plan(_spec(), CAT, unavailable=frozenset({(inst, cap.value)})).chosen
    assert again is not None
    assert (again.instance.name, again.capacity) != (inst, cap)


def test_launch_failure_health_issue_is_a_capacity_error(aws: tuple[Any, Any]) -> None:
    eks, (role, subnet) = aws
    _group(eks, "a100-spot", "p4d.24xlarge", "spot", role, subnet)
    p = EksProvider(eks, FakeCore(), cluster=CLUSTER)
    real = eks.describe_nodegroup

    def unhealthy(**kw: Any) -> Any:
        out = real(**kw)
        out["nodegroup"]["health"] = {
            "issues": [
                {
                    "code": "AsgInstanceLaunchFailures",
                    "message": "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot "
                    "capacity available that matches your request.",
                    "resourceIds": ["eks-a100-spot"],
                }
            ]
        }
        return out

    with (
        mock.patch.object(eks, "describe_nodegroup", side_effect=unhealthy),
        pytest.raises(InsufficientCapacityError, match="AsgInstanceLaunchFailures"),
    ):
        p.ensure_nodes(request("p4d.24xlarge", CapacityType.SPOT, 2), [])


def test_a_zoned_plan_gets_a_group_in_that_zones_subnets(aws: tuple[Any, Any]) -> None:
    eks, (role, _) = aws
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    by_zone = {
        z: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=z)["Subnet"]["SubnetId"]
        for z, cidr in (("us-east-1b", "10.1.1.0/24"), ("us-east-1c", "10.1.2.0/24"))
    }
    p = EksProvider(
        eks, FakeCore(), cluster=CLUSTER, ec2=ec2,
        template=EksTemplate(subnets=list(by_zone.values()), node_role_arn=role),
    )  # fmt: skip
    inst = CAT.instance("g5.12xlarge")
    req = NodeRequest(JOB, inst, CapacityType.SPOT, 2, inst.spot_usd_hr or 0.0, zone="us-east-1c")
    assert p.ensure_nodes(req, []) == []
    name = "gpuscaler-g5-12xlarge-spot-us-east-1c"
    ng = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]
    assert ng["subnets"] == [by_zone["us-east-1c"]]
    assert ng["tags"]["gpuscaler.io/zone"] == "us-east-1c"
    assert p.find_group("g5.12xlarge", CapacityType.SPOT, "us-east-1c") == name
    assert p.find_group("g5.12xlarge", CapacityType.SPOT, "us-east-1b") is None
    assert p.scheduling(req).node_selector["topology.kubernetes.io/zone"] == "us-east-1c"
    elsewhere = NodeRequest(JOB, inst, CapacityType.SPOT, 1, 1.0, zone="us-east-1d")
    with pytest.raises(ProviderError, match="no subnet of GPUSCALER_EKS_SUBNETS is in us-east-1d"):
        p.ensure_nodes(elsewhere, [])


def test_workers_tolerate_the_configured_gpu_taint_with_or_without_a_template(aws: tuple[Any, Any]) -> None:
    """``GPUSCALER_GPU_TOLERATION_KEY`` reaches the workers' toleration on EKS whether or not the
    operator may create node groups (it did only through the node-group template before)."""
    from gpuscaler.cloud import factories
    from gpuscaler.settings import Settings

    _, (role, subnet) = aws
    for template in ({}, {"eks_subnets": [subnet], "eks_node_role_arn": role}):
        settings = Settings(eks_cluster_name=CLUSTER, aws_region=REGION, gpu_toleration_key="example.com/gpu", **template)  # type: ignore[arg-type]
        p = factories.eks(settings, client.ApiClient())
        assert [t["key"] for t in p.scheduling(request()).tolerations] == ["example.com/gpu"], template
    plain = EksProvider(boto3.client("eks", region_name=REGION), FakeCore(), cluster=CLUSTER)
    assert [t["key"] for t in plain.scheduling(request()).tolerations] == ["nvidia.com/gpu"]
