"""A fleet and its Deployment as ``mmfleet.status.compute_status`` reads them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mmfleet.api import MultimodalInference, MultimodalInferenceStatus
from tests.helpers.repo import spec_doc

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def inference(**spec: Any) -> MultimodalInference:
    doc = spec_doc(**spec)
    doc["metadata"]["generation"] = 2
    return MultimodalInference.model_validate(doc)


def deployment(
    replicas: int, ready: int, updated: int | None = None, spec_replicas: int | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"generation": 5},
        "spec": {"replicas": replicas if spec_replicas is None else spec_replicas},
        "status": {
            "observedGeneration": 5,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
        },
    }


def conditions(status: MultimodalInferenceStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}
