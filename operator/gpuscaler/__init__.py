"""gpuscaler: cost-aware GPU autoscaling of deep-learning training on Kubernetes.

The pure layers (catalog, perfmodel, planner, policy, api) hold the domain; kube, cloud and
handlers adapt it to a cluster; runtime is the library the training container uses.
"""

__version__ = "0.1.0"
