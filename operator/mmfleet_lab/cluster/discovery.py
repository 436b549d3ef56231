"""The official dynamic client with a discovery cache of its own.

``kubernetes.dynamic.DynamicClient`` caches discovery in ``/tmp/osrcp-<md5(host)>.json`` by default: a file that
never expires, keyed by the API server's address alone. Lab clusters come and go on reused random ports, so a
client for one cluster would read another's API groups (a CRD that is not there, a version that is). Each client
here gets a file in a fresh temporary directory instead, removed with the client.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def dynamic_client(api: Any) -> Any:
    """A ``kubernetes.dynamic.DynamicClient`` for ``api`` (an ApiClient) that discovers this cluster afresh."""
    from kubernetes import dynamic

    folder = tempfile.TemporaryDirectory(prefix="mmfleet-discovery-")
    client = dynamic.DynamicClient(api, cache_file=str(Path(folder.name) / "discovery.json"))
    client.mmfleet_discovery_folder = folder  # the folder's finalizer removes it when the client is collected
    return client
