"""An oci:// model source on an API server that does not serve image volumes: the Deployment is accepted with the
volume dropped (Kubernetes before 1.35 without the ImageVolume gate), and the fleet says so instead of crash-looping
in silence."""

from __future__ import annotations

from typing import Any

import pytest

from mmfleet.api import DegradedReason
from mmfleet.handlers import records
from tests.helpers.operator_state import RecordingKube, fleet_body, operator, reconcile_once

Body = dict[str, Any]


class WithoutImageVolumes(RecordingKube):
    """The API server of Kubernetes 1.34 with ImageVolume off: ``dropImageVolumes`` (``pkg/api/pod/util.go``)."""

    def apply(self, manifest: Body, manager: str = "mmfleet") -> Body:
        applied = super().apply(manifest, manager)
        if manifest["kind"] != "Deployment":
            return applied
        pod = applied["spec"]["template"]["spec"]
        kept = [v for v in pod.get("volumes", []) if "image" not in v]
        names = {v["name"] for v in kept}
        containers = [
            {**c, "volumeMounts": [m for m in c.get("volumeMounts", []) if m["name"] in names]}
            for c in pod["containers"]
        ]
        template = {**applied["spec"]["template"], "spec": {**pod, "volumes": kept, "containers": containers}}
        return {**applied, "spec": {**applied["spec"], "template": template}}


@pytest.fixture(autouse=True)
def _no_kopf_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *args: None)  # kopf's posting needs its own context


ALLOWED = {"modelImages": ["registry.example.com/*"]}


def imaged() -> Body:
    body = fleet_body()
    body["spec"]["model"]["source"] = "oci://registry.example.com/models/qwen:v1"
    return body


def test_a_dropped_image_volume_is_said_on_the_fleet_naming_the_source_and_what_would_serve() -> None:
    kube = WithoutImageVolumes()
    assert reconcile_once(operator(kube, policy=ALLOWED), imaged()).outcome == "refused"
    ready = next(c for c in kube.written[-1]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", DegradedReason.APPLY_REFUSED)
    assert "dropped volume(s) model" in ready["message"]
    assert "spec.model.source oci://registry.example.com/models/qwen:v1" in ready["message"]
    assert "ImageVolume" in ready["message"]


def test_an_api_server_that_keeps_the_volume_serves_the_fleet() -> None:
    assert reconcile_once(operator(RecordingKube(), policy=ALLOWED), imaged()).outcome == "ok"
