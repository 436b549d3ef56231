"""The endpoint picker as the twin's router: a ``Router`` read from an ``EndpointPickerConfig``.

Either the configuration the operator renders (``mmfleet.routing.picker_config``) or ``PICKER_DEFAULTS``, what the
picker runs without one. Upstream: ``sigs.k8s.io/gateway-api-inference-extension`` at
``mmfleet.routing.PICKER_VERSION``; paths below are in that module. The scoring is ``twin.compiled._pick``.
"""

from __future__ import annotations

import math
from typing import Any

from mmfleet.api import seconds
from mmfleet.routing import DEFAULT_QUEUE_DEPTH, KV_CACHE_SATURATED, SCORER_WEIGHTS
from mmfleet_lab.twin.engine import Router

Manifest = dict[str, Any]

# vLLM's default --block-size: what autoTune reads from vllm:cache_config_info (approximateprefix/plugin.go:207-250).
SERVER_BLOCK_TOKENS = 16
# requestcontrol/dataproducer/approximateprefix/types.go:112 (averageCharactersPerToken) and :116-141 (the defaults).
CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_MAX_BLOCKS = 256
DEFAULT_WEIGHT = 1.0  # a profile's plugin without a weight (config/loader/defaults.go:42)
SCORERS = {
    "prefix-cache-scorer": "prefix_weight",
    "queue-scorer": "queue_weight",
    "kv-cache-utilization-scorer": "kv_weight",
}
# What the picker loads when given no configuration (config/loader/defaults.go:46-103): the three scorers at their
# default weights, every parameter at its default, the utilization-detector as saturation detector.
PICKER_DEFAULTS: Manifest = {
    "plugins": [{"type": name} for name, _ in SCORER_WEIGHTS],
    "schedulingProfiles": [
        {"name": "default", "plugins": [{"pluginRef": name, "weight": weight} for name, weight in SCORER_WEIGHTS]}
    ],
}


def router(config: Manifest, seed: int = 0) -> Router:
    """The picker ``config`` configures, as the twin's ``Router`` (its tie-breaks drawn from ``seed``).

    The prefix window: ``maxPrefixTokensToMatch`` (if > 0) or ``maxPrefixBlocksToMatch`` blocks of the block size,
    which ``autoTune`` (default on) takes from the servers, at 4 characters a token (approximateprefix/plugin.go:
    142-145). Saturation: the ``utilization-detector``'s thresholds (flowcontrol/saturationdetector/utilization/
    config.go:29-96), the defaults when the configuration names none; a filter only if the profile lists a detector,
    with that one's thresholds. Flow
    control (the ``flowControl`` feature gate, apix/config/v1alpha1/endpointpickerconfig_types.go:288-332) holds
    requests while the pool is saturated, up to ``defaultRequestTTL`` (omitted: the client's deadline).
    """
    plugins = {p.get("name", p["type"]): p for p in config.get("plugins", [])}
    weights = {SCORERS[plugins[ref["pluginRef"]]["type"]]: float(ref.get("weight", DEFAULT_WEIGHT))
               for ref in config["schedulingProfiles"][0]["plugins"]
               if plugins[ref["pluginRef"]]["type"] in SCORERS}  # fmt: skip
    prefix: Manifest = next(
        (p.get("parameters", {}) for p in plugins.values() if p["type"] == "prefix-cache-scorer"), {}
    )
    block = SERVER_BLOCK_TOKENS if prefix.get("autoTune", True) else int(prefix.get("blockSizeTokens", 16))
    tokens = int(prefix.get("maxPrefixTokensToMatch", 0))
    blocks = tokens // block if tokens > 0 else int(prefix.get("maxPrefixBlocksToMatch", DEFAULT_MAX_BLOCKS))
    detector_ref = config.get("saturationDetector", {}).get("pluginRef", "utilization-detector")
    detector = plugins.get(detector_ref, {}).get("parameters", {})
    profile = [plugins[ref["pluginRef"]] for ref in config["schedulingProfiles"][0]["plugins"]]
    screen = next((p.get("parameters", {}) for p in profile if p["type"] == "utilization-detector"), None)
    return Router(
        kind="picker",
        window_chars=blocks * block * CHARS_PER_TOKEN,
        block_chars=block * CHARS_PER_TOKEN,
        queue_depth=int(detector.get("queueDepthThreshold", DEFAULT_QUEUE_DEPTH)),
        kv_saturated=float(detector.get("kvCacheUtilThreshold", KV_CACHE_SATURATED)),
        filter_queue_depth=0 if screen is None else int(screen.get("queueDepthThreshold", DEFAULT_QUEUE_DEPTH)),
        filter_kv=1.0 if screen is None else float(screen.get("kvCacheUtilThreshold", KV_CACHE_SATURATED)),
        flow_control="flowControl" in config.get("featureGates", []),
        request_ttl=seconds(ttl) if (ttl := config.get("flowControl", {}).get("defaultRequestTTL")) else math.inf,
        seed=seed,
        **weights,
    )
