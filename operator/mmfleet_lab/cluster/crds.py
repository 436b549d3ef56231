"""Installing a CustomResourceDefinition on a lab cluster as a user would, and knowing when it is served.

One place for it: the tests, the benchmarks, the fuzz and the demo all need the MultimodalInference CRD (or the
Prometheus Operator's PodMonitor) Established before they create objects of it. Not ``kubectl wait
--for=condition=Established``: it exits 1 at once on a new CRD whose ``status.conditions`` is still null (CI,
2026-12-01). A CRD that is not Established in time raises ``ClusterError`` with its conditions.
"""

from __future__ import annotations

import time
from typing import Any

from mmfleet_lab.cluster.discovery import dynamic_client
from mmfleet_lab.cluster.process import ClusterError


def read_crd(api: Any, name: str) -> Any | None:
    """The CustomResourceDefinition ``name``; None when it does not exist."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _conditions(api: Any, name: str) -> list[Any] | None:
    """The CRD's status conditions; None when it does not exist."""
    got = read_crd(api, name)
    if got is None:
        return None
    return list(got.status.conditions or []) if got.status else []


def established(api: Any, name: str) -> bool:
    """Whether the CRD ``name`` exists and the API server serves its resource."""
    conditions = _conditions(api, name)
    return any(c.type == "Established" and c.status == "True" for c in conditions or [])


def wait_established(api: Any, name: str, timeout: float = 60.0) -> None:
    """Block until the CRD ``name`` is Established; ``ClusterError`` naming its conditions after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not established(api, name):
        if time.monotonic() > deadline:
            conditions = _conditions(api, name)
            seen = [f"{c.type}={c.status}: {c.message}" for c in conditions or []]
            seen = seen or (["it does not exist"] if conditions is None else ["no conditions yet"])
            raise ClusterError(f"the CRD {name} was not Established within {timeout:g} s: {'; '.join(seen)}")
        time.sleep(0.2)


def install_crd(api: Any, body: dict[str, Any], field_manager: str, timeout: float = 60.0) -> None:
    """Server-side apply ``body`` (a CustomResourceDefinition) and wait until it is served."""
    dyn = dynamic_client(api)
    resource = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    dyn.server_side_apply(resource, body=body, field_manager=field_manager, force_conflicts=True)
    wait_established(api, body["metadata"]["name"], timeout)


def install_mmfleet_crd(api: Any, field_manager: str, timeout: float = 60.0) -> None:
    """The MultimodalInference CRD generated from the pydantic models, installed and served."""
    import yaml

    from mmfleet import crd

    install_crd(api, yaml.safe_load(crd.crd_yaml()), field_manager, timeout)
