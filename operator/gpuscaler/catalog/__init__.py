"""The catalog: GPUs, cloud instance types with prices, and workload profiles, as shipped data.

Pure data layer: imports nothing from Kubernetes or the cloud.
"""

from gpuscaler.catalog.loader import Catalog, CatalogError, UnknownIdError, load_catalog, normalize
from gpuscaler.catalog.models import GPU, CapacityType, InstanceType, Precision, Workload

__all__ = [
    "GPU",
    "CapacityType",
    "Catalog",
    "CatalogError",
    "InstanceType",
    "Precision",
    "UnknownIdError",
    "Workload",
    "load_catalog",
    "normalize",
]
