"""The collector settings of each cloud the tests render a configuration for."""

from __future__ import annotations

from typing import Any

from mmfleet.api import PROFILE_NAMES

# Every settings case the integration test validates with the real collector, shared from here.
CASES: dict[str, dict[str, Any]] = {
    **{cloud: {"cloud": cloud} for cloud in PROFILE_NAMES},
    "eks-overrides": {"cloud": "eks", "region": "eu-west-1", "resource_attributes": {"deployment.environment": "prod"}},
    "eks-endpoint": {"cloud": "eks", "endpoint": "https://xray.us-east-2.amazonaws.com/v1/traces"},
    "aks-overrides": {"cloud": "aks", "resource_attributes": {"team": "ml"}, "memory_limit_percentage": 70},
    "ack-overrides": {"cloud": "ack", "endpoint": "tracing-analysis-dc-hz.aliyuncs.com:8090", "insecure": False},
    "ack-sls": {"cloud": "ack", "ack_backend": "sls"},
    "ack-sls-overrides": {
        "cloud": "ack",
        "ack_backend": "sls",
        "endpoint": "cn-hangzhou.log.aliyuncs.com",
        "sls_project": "ml-traces",
        "sls_logstore": "spans",
    },
    "generic-overrides": {
        "cloud": "generic",
        "endpoint": "otel.example.com:4317",
        "insecure": True,
        "resource_attributes": {"k8s.cluster.name": "lab"},
    },
}
