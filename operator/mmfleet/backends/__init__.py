"""Inference backends: what each pinned server version is started with and what it exports.

A backend is data plus pure functions of the resolved spec. Every flag here was read from the
upstream source of the pinned version (the module docstrings cite where); nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import quote

from mmfleet.api import MultimodalInference, SloMetric

# The fleet-level signals besides the SLO latency, as the autoscaler reads them.
Signal = Literal["request_rate", "waiting", "running", "kv_cache_usage"]
EcRole = Literal["ec_producer", "ec_consumer"]


@dataclass(frozen=True)
class MetricNames:
    """Prometheus series names as scraped (counters with their ``_total``)."""

    e2e: str
    ttft: str
    itl: str
    requests_finished: str
    running: str
    waiting: str
    kv_cache_usage: str
    # The label the backend puts the served model name in.
    model_label: str = "model_name"
    # With an encode tier (vLLM), the same latencies measured from a request's arrival at the pod, before the encode
    # tier, by the sidecar (mmfleet.encode_proxy); a fleet's SLO reads them where its pods export them.
    front_door_e2e: str | None = None
    front_door_ttft: str | None = None
    # And the sidecar's calls to the encode tier (a histogram of seconds) and the items it sent (a counter): what the
    # encode tier's autoscaling reads.
    encode_call: str | None = None
    encode_items: str | None = None
    encode_failures: str | None = None  # a counter of calls that brought no encoder outputs

    def histogram(self, metric: SloMetric) -> str:
        return {"e2e": self.e2e, "ttft": self.ttft, "itl": self.itl}[metric]

    def front_door(self, metric: SloMetric) -> str | None:
        return {"e2e": self.front_door_e2e, "ttft": self.front_door_ttft, "itl": None}[metric]

    def series(self, signal: Signal) -> str:
        return {
            "request_rate": self.requests_finished,
            "waiting": self.waiting,
            "running": self.running,
            "kv_cache_usage": self.kv_cache_usage,
        }[signal]


@dataclass(frozen=True)
class ServerContext:
    """What rendering has already decided, handed to the backend to spell as flags."""

    inference: MultimodalInference
    model_ref: str
    port: int
    config_dir: str
    tracing_endpoint: str | None
    # Where the backend keeps its download caches (HF_HOME): the replica's volume, or the shared claim.
    cache_dir: str
    download_dir: str
    # The shared claim's mount (spec.modelCache.volume shared), for caches that outlive the pod; else None.
    shared_cache_dir: str | None
    cloud: str = "generic"  # the profile the fleet is rendered for, a resource attribute of its spans
    # With spec.disaggregation.encode: which side of the encoder-output transfer this pod is (vLLM's ec_role: the
    # encode tier produces, the serving tier consumes); None without an encode tier.
    ec_role: EcRole | None = None


@dataclass(frozen=True)
class OwnedFlag:
    """A flag mmfleet generates, and the spec field a user should change instead."""

    flag: str
    field: str
    aliases: tuple[str, ...] = ()
    # Said instead of "set that field instead" when the flag is refused for another reason.
    reason: str | None = None


@dataclass(frozen=True)
class ServerStartup:
    """Where a server's own start went, seconds, from its log (None: not said): what Kubernetes sees as one phase,
    the container running to Ready. ``compile`` is part of ``engine``."""

    weights: float | None = None  # the model's weights loaded onto the GPUs
    engine: float | None = None  # the engine set up after: memory profiled, KV cache allocated, kernels warmed up
    compile: float | None = None  # of which compiling (torch.compile), short when the compile cache is warm


@dataclass(frozen=True)
class HostExtra:
    """What a fleet's settings add to a replica's default CPU and memory requests, beyond the defaults per GPU."""

    memory_gib: float = 0.0  # in the server's processes
    shm_gib: float = 0.0  # in /dev/shm (a memory-backed volume, so in the memory request too)
    cpu: float = 0.0  # cores


class Backend(Protocol):
    name: str
    version: str
    image: str
    port: int
    metrics_path: str
    health_path: str
    # The image's own non-root uid, or None when the server must run as root.
    run_as_user: int | None
    # Directories the server writes to that the image's non-root user may not own: emptyDirs are mounted there.
    writable_paths: tuple[str, ...]
    metrics: MetricNames
    owned_flags: tuple[OwnedFlag, ...]
    # Whether ``startup`` reads anything from the server's log: if not, the operator does not fetch it.
    start_in_log: bool

    def command(self, ctx: ServerContext) -> list[str]:
        """The container command and arguments, extraArgs excluded."""

    def env(self, ctx: ServerContext) -> list[dict[str, object]]:
        """Environment variables the server needs (tracing, caches)."""

    def config_files(self, ctx: ServerContext) -> dict[str, str]:
        """Files mounted at ctx.config_dir from a ConfigMap; empty when none are needed."""

    def drain_args(self, seconds: int) -> list[str]:
        """Flags that make SIGTERM finish in-flight requests for up to ``seconds``; empty if unsupported."""

    def host_extra(self, inference: MultimodalInference, ec_role: EcRole | None = None) -> HostExtra:
        """What the fleet's settings hold in CPU memory, /dev/shm and cores beyond the defaults per GPU."""

    def startup(self, log: str) -> ServerStartup:
        """Where the server's start went, from the beginning of its log (up to where it serves); nothing where the
        log does not say."""


# The pod's own namespace and name from the downward API, for OTEL_RESOURCE_ATTRIBUTES to reference as $(VAR).
POD_NAMESPACE_ENV = "MMFLEET_POD_NAMESPACE"
POD_NAME_ENV = "MMFLEET_POD_NAME"


def resource_attributes(ctx: ServerContext) -> dict[str, str]:
    """What every span of a fleet's pod says about where it comes from (the twin's spans say the same)."""
    inference = ctx.inference
    return {
        "k8s.namespace.name": f"$({POD_NAMESPACE_ENV})",
        "k8s.pod.name": f"$({POD_NAME_ENV})",
        "mmfleet.inference": inference.metadata.name,
        "mmfleet.model": inference.spec.model.name,
        "mmfleet.backend": inference.spec.backend.name,
        "mmfleet.cloud": ctx.cloud,
    }


def otel_env(ctx: ServerContext) -> list[dict[str, object]]:
    """The OpenTelemetry SDK variables both servers leave to the environment, with tracing on.

    Both build their ``TracerProvider`` through ``Resource.create`` (vLLM with its own attributes,
    TensorRT-LLM with none), which merges ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``
    (``opentelemetry/sdk/resources/__init__.py``, ``OTELResourceDetector``), and neither passes a
    sampler, so the SDK reads ``OTEL_TRACES_SAMPLER``/``_ARG``. The SDK URL-decodes each attribute value,
    so ours are percent-encoded; the kubelet expands ``$(VAR)`` from the variables listed before it.
    Parent-based: a caller's traceparent decides first, the ratio only for requests that arrive without one.
    """
    attributes = ",".join(
        f"{key}={value if value.startswith('$(') else quote(value, safe='/:._-@')}"
        for key, value in resource_attributes(ctx).items()
    )
    return [
        {"name": POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "OTEL_SERVICE_NAME", "value": ctx.inference.served_name},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": attributes},
        # Both servers read only the traces-specific variable, grpc by default, and ignore
        # OTEL_EXPORTER_OTLP_PROTOCOL (vLLM tracing/otel.py and TensorRT-LLM llmapi/tracing.py get_span_exporter).
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "grpc"},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": str(ctx.inference.spec.tracing.sample_ratio)},
    ]


def get(name: str) -> Backend:
    from mmfleet.backends import tensorrt_llm, vllm

    backends: dict[str, Backend] = {"vllm": vllm.BACKEND, "tensorrt-llm": tensorrt_llm.BACKEND}
    return backends[name]


def _flag_spellings(flag: str) -> set[str]:
    """Both CLIs treat '-' and '_' in long flags alike; vLLM adds --no-<flag> for booleans."""
    bare = flag.lstrip("-")
    forms = {bare, bare.replace("-", "_"), bare.replace("_", "-")}
    return {f"--{f}" for f in forms} | {f"--no-{f}" for f in forms} | {f"--no_{f}" for f in forms}


def clashes(backend: Backend, extra_args: list[str]) -> list[str]:
    """Messages for extraArgs that would fight a flag mmfleet sets from a spec field."""
    owned: dict[str, OwnedFlag] = {}
    for owned_flag in backend.owned_flags:
        for spelling in (owned_flag.flag, *owned_flag.aliases):
            for form in _flag_spellings(spelling) if spelling.startswith("--") else {spelling}:
                owned[form] = owned_flag
    problems = []
    for index, arg in enumerate(extra_args):
        token = arg.split("=", 1)[0]
        # Dotted sub-keys (--attention-config.backend, -ac.flash_attn_version) belong to their flag.
        head = token.split(".", 1)[0] if token.startswith("-") else token
        hit = owned.get(token) or owned.get(head) or _abbreviation(head, owned)
        if hit is None:
            continue
        if hit.reason:
            problems.append(f"spec.backend.extraArgs[{index}]: {arg} is refused: {hit.reason}")
        else:
            problems.append(
                f"spec.backend.extraArgs[{index}]: {arg} clashes with {hit.flag}, which mmfleet sets "
                f"from spec.{hit.field}; set that field instead"
            )
    return problems


def _abbreviation(token: str, owned: dict[str, OwnedFlag]) -> OwnedFlag | None:
    """argparse takes an unambiguous prefix of a long flag (allow_abbrev), so --max-model means --max-model-len."""
    if not token.startswith("--") or len(token) < 4:
        return None
    hits = {id(flag): flag for spelling, flag in owned.items() if spelling.startswith(token)}
    return next(iter(hits.values())) if len(hits) == 1 else None


# The share of a fleet's finished requests (as its servers count them) its front door must have timed in the window for
# its SLO to be read there.
FRONT_DOOR_COVERAGE = 0.8


def histogram_quantile_promql(
    histogram: str, percentile: float, window: str, by: tuple[str, ...], matchers: str
) -> str:
    """P<percentile> of a histogram summed over pods, grouped by ``by``."""
    rate = f"rate({histogram}_bucket{matchers}[{window}])"
    return f"histogram_quantile({percentile / 100:g}, sum by ({', '.join(('le', *by))}) ({rate}))"


def latency_quantile_promql(
    backend: Backend,
    metric: SloMetric,
    percentile: float,
    window: str,
    by: tuple[str, ...],
    selector: str = "",
    front_door: bool = True,
) -> str:
    """P<percentile> of one latency histogram, summed over pods, grouped by ``by``; ``selector``: label matchers.

    Where the backend's pods measure the latency at the pod's front door too (an encode tier's sidecar), that one, for
    the fleets whose front door timed most of what their servers did in the window (``FRONT_DOOR_COVERAGE``: not while
    a rollout has put the sidecar on a few pods only, nor a TTFT whose requests are mostly not streamed) and gave a
    number (no request finished gives none); the server's own for the rest. ``front_door`` False: the server's own
    only (the serving tier's part, when the encode tier is scaled on its own share)."""
    matchers = f"{{{selector}}}" if selector else ""

    def quantile(histogram: str) -> str:
        return histogram_quantile_promql(histogram, percentile, window, by, matchers)

    def count(histogram: str) -> str:
        return f"sum by ({', '.join(by)}) (rate({histogram}_count{matchers}[{window}]))"

    own = backend.metrics.histogram(metric)
    front = backend.metrics.front_door(metric)
    if front is None or not front_door:
        return quantile(own)
    covered = f"{count(front)} >= {FRONT_DOOR_COVERAGE:g} * {count(own)}"
    return f"(({quantile(front)} >= 0) and on ({', '.join(by)}) ({covered})) or {quantile(own)}"


def signal_promql(backend: Backend, signal: Signal, window: str, by: tuple[str, ...], selector: str = "") -> str:
    """One fleet-level signal from the per-pod series, grouped by ``by``; ``selector``: label matchers.

    Completions per second and the running and waiting requests add up over pods; KV-cache use is
    each pod's share of its own cache, so it is averaged. ``window`` is the rate window.
    """
    series = backend.metrics.series(signal) + (f"{{{selector}}}" if selector else "")
    labels = ", ".join(by)
    if signal == "request_rate":
        return f"sum by ({labels}) (rate({series}[{window}]))"
    return f"{'avg' if signal == 'kv_cache_usage' else 'sum'} by ({labels}) ({series})"
