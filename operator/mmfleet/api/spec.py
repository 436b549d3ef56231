"""The spec of a MultimodalInference: what the user (or Argo CD) writes.

Cross-field rules are written twice on purpose: as CEL (``x-kubernetes-validations``) so the API server rejects a bad
``kubectl apply``, and as pydantic validators so ``mmfleet render`` and the operator give the same answer without a
cluster.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from mmfleet.api.base import Model
from mmfleet.api.patterns import (
    DNS_SUBDOMAIN_PATTERN,
    DNS_SUBDOMAIN_TEXT,
    MODEL_SOURCE_PATTERN,
    PVC_SOURCE_PATTERN,
    SPEC_DURATION_MAX_LENGTH,
    SPEC_DURATION_PATTERN,
    ZERO_QUANTITY_PATTERN,
    Cidr,
    DnsSubdomain,
    LabelMap,
    NamespaceName,
    Quantity,
    cel,
    duration_check,
    duration_field,
    seconds,
)
from mmfleet.api.scheduling import Affinity, LabelSelector, Toleration


def clamp_replicas(replicas: int, low: int, high: int) -> int:
    """``replicas`` within minReplicas and maxReplicas: the one clamp status, cycle and policy share."""
    return max(low, min(high, replicas))


BackendName = Literal["vllm", "tensorrt-llm"]
Attention = Literal["auto", "flash-attn-3", "flash-attn-2", "flashinfer", "triton"]
# The one set of cloud names: the profiles in mmfleet.clouds, and auto (detect one from the nodes).
ProfileName = Literal["eks", "aks", "ack", "generic"]
CloudName = Literal["auto", ProfileName]
PROFILE_NAMES: tuple[ProfileName, ...] = get_args(ProfileName)
CLOUD_NAMES: tuple[CloudName, ...] = get_args(CloudName)
GpuType = Literal["T4", "A10", "A10G", "L4", "L40S", "A100", "H100", "H200", "H20", "GH200", "B200"]
SloMetric = Literal["e2e", "ttft", "itl"]

# Hopper (SM 9.x) is where FlashAttention 3 runs; vLLM 0.33 refuses FA3 elsewhere.
HOPPER_GPUS: tuple[str, ...] = ("H100", "H200", "H20", "GH200")

TRTLLM_KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "nvfp4")
KvCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"]


def _not_a_flag(value: str) -> str:
    """A value that lands on the server's command line (the model, its served name, the traces endpoint): vLLM's
    argparse and trtllm-serve's click take a leading '-' for an option, so it would start no server, or quietly
    set a flag."""
    if value.startswith("-"):
        raise ValueError("it starts with '-', which the server's command line takes for a flag")
    return value


NOT_A_FLAG_CEL = cel("!self.startsWith('-')", "must not start with '-' (the server would take it for a flag)")
# A model's names are printed in logs, metrics labels and the server's command line: printable ASCII with no space, so
# that no control character rewrites a log line and no look-alike letter (a Cyrillic 'а') names another model.
PLAIN_NAME_PATTERN = "^[!-~]+$"
PLAIN_NAME_TEXT = "printable ASCII with no space (letters, digits and punctuation such as / . - _ :)"
PLAIN_NAME_CEL = cel(f"self.matches('{PLAIN_NAME_PATTERN}')", f"must be {PLAIN_NAME_TEXT}")


def _plain_name(value: str) -> str:
    odd = next((c for c in value if not "!" <= c <= "~"), None)
    if odd is not None:
        raise ValueError(f"it holds {odd!r} (U+{ord(odd):04X}); a model's name must be {PLAIN_NAME_TEXT}")
    return value


class ModelSpec(Model):
    """What the server loads and where it comes from."""

    name: Annotated[str, AfterValidator(_not_a_flag), AfterValidator(_plain_name)] = Field(
        min_length=1,
        max_length=253,
        description="Model to serve, as the backend names it, e.g. Qwen/Qwen2.5-VL-7B-Instruct.",
        json_schema_extra={"x-kubernetes-validations": [NOT_A_FLAG_CEL, PLAIN_NAME_CEL]},
    )
    source: str | None = Field(
        default=None,
        max_length=2048,
        pattern=MODEL_SOURCE_PATTERN,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!self.startsWith('pvc://') || self.matches('{PVC_SOURCE_PATTERN}')",
                    f"pvc://<claim>/<path>: the claim must be {DNS_SUBDOMAIN_TEXT}",
                )
            ]
        },
        description=(
            "Where the weights come from: hf://<repo>, s3://, gs://, oss://, az://<bucket>/<path>, "
            "pvc://<claim>/<path> for a PersistentVolumeClaim in the same namespace, or oci://<image reference> "
            "for an OCI image holding the model directory at its root, mounted as an image volume (Kubernetes "
            "1.35+, or the ImageVolume feature gate; vllm only): the node pulls it once and keeps it, so a new "
            "replica on that node neither downloads nor reads the weights over the network. "
            "Default: hf://<model.name>."
        ),
    )
    served_name: Annotated[str, AfterValidator(_not_a_flag), AfterValidator(_plain_name)] | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Model name clients send in requests and the model_name metric label. Default: metadata.name.",
        json_schema_extra={"x-kubernetes-validations": [NOT_A_FLAG_CEL, PLAIN_NAME_CEL]},
    )
    credentials_secret: DnsSubdomain | None = Field(
        default=None,
        description=(
            "Secret in the same namespace whose keys become environment variables of the server "
            "(HF_TOKEN, AWS_ACCESS_KEY_ID, ...)."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.source and self.source.startswith("pvc://") and not re.fullmatch(PVC_SOURCE_PATTERN, self.source):
            raise ValueError(
                f"source: {self.source} names no valid claim; pvc://<claim>/<path> needs {DNS_SUBDOMAIN_TEXT}"
            )
        return self

    def resolved_source(self) -> str:
        return self.source or f"hf://{self.name}"


class BackendSpec(Model):
    """The inference server and its engine settings."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.name) || self.name != 'tensorrt-llm' || !has(self.kvCacheDtype) || "
                    "self.kvCacheDtype in ['auto', 'fp8', 'nvfp4']",
                    "kvCacheDtype: tensorrt-llm accepts auto, fp8 or nvfp4",
                    ".kvCacheDtype",
                ),
                cel(
                    "!has(self.name) || self.name != 'tensorrt-llm' || !has(self.attention) || "
                    "self.attention == 'auto'",
                    "attention: tensorrt-llm picks its own attention kernels; only auto is accepted",
                    ".attention",
                ),
                cel(
                    "(has(self.name) && self.name != 'vllm') || "
                    "(has(self.maxNumBatchedTokens) ? self.maxNumBatchedTokens : 4096) >= "
                    "(has(self.maxNumSeqs) ? self.maxNumSeqs : 128)",
                    "maxNumBatchedTokens must be at least maxNumSeqs (vllm refuses to start otherwise)",
                    ".maxNumBatchedTokens",
                ),
                cel(
                    "(has(self.name) && self.name != 'vllm') || !has(self.chunkedPrefill) || self.chunkedPrefill || "
                    "(has(self.maxNumBatchedTokens) ? self.maxNumBatchedTokens : 4096) >= "
                    "(has(self.maxModelLen) ? self.maxModelLen : 8192)",
                    "maxNumBatchedTokens must be at least maxModelLen when chunkedPrefill is false",
                    ".maxNumBatchedTokens",
                ),
            ]
        }
    )

    name: BackendName = Field(default="vllm", description="Inference server: vllm or tensorrt-llm.")
    image: str = Field(
        default="",
        max_length=512,
        # kube-apiserver refuses an image with leading or trailing whitespace (validateContainerOnlyForPod).
        pattern=r"^(\S(.*\S)?)?$",
        description=(
            "Container image, without surrounding whitespace. Empty: the image of the backend version mmfleet pins."
        ),
    )
    attention: Attention = Field(
        default="auto",
        description=(
            "Attention kernels. auto lets the backend choose (FlashAttention 3 on Hopper for vLLM). "
            "flash-attn-3 needs a Hopper GPU (H100, H200, H20, GH200)."
        ),
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default="auto",
        description="Data type of the KV cache. tensorrt-llm accepts auto, fp8 and nvfp4.",
    )
    max_model_len: int = Field(default=8192, ge=256, le=1_048_576, description="Longest prompt plus output, in tokens.")
    max_num_seqs: int = Field(default=128, ge=1, le=4096, description="Most sequences batched together in one step.")
    max_num_batched_tokens: int = Field(
        default=4096, ge=64, le=1_048_576, description="Most tokens processed in one step (the prefill chunk)."
    )
    chunked_prefill: bool = Field(default=True, description="Split long prefills across steps.")
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description=(
            "vllm: share of GPU memory the engine may use. tensorrt-llm: share of the memory left "
            "after weights that goes to the KV cache."
        ),
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra command-line arguments, appended last. A flag mmfleet already sets is rejected.",
    )

    @model_validator(mode="after")
    def _check(self) -> BackendSpec:
        # The same checks vLLM 0.33 makes at startup (config/scheduler.py verify_max_model_len).
        if self.name != "vllm":
            return self
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"maxNumBatchedTokens: {self.max_num_batched_tokens} is below maxNumSeqs: {self.max_num_seqs}; "
                "vllm needs at least one token per batched sequence"
            )
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"maxNumBatchedTokens: {self.max_num_batched_tokens} is below maxModelLen: {self.max_model_len} "
                "with chunkedPrefill: false; raise maxNumBatchedTokens or turn chunked prefill on"
            )
        return self


class ImageLimits(Model):
    """Most items of each modality in one prompt."""

    image: int | None = Field(default=None, ge=0, le=256, description="Most images in one prompt.")
    video: int | None = Field(default=None, ge=0, le=64, description="Most videos in one prompt.")
    audio: int | None = Field(default=None, ge=0, le=64, description="Most audio clips in one prompt.")


class ImageSize(Model):
    """An image's size in pixels."""

    width: int | None = Field(default=None, ge=1, le=65536, description="Width in pixels.")
    height: int | None = Field(default=None, ge=1, le=65536, description="Height in pixels.")


class VideoSize(ImageSize):
    """A video's frame size and length."""

    frames: int | None = Field(default=None, ge=1, le=65536, description="Frames.")


class AudioSize(Model):
    """An audio clip's length."""

    length: int | None = Field(default=None, ge=1, le=2**31 - 1, description="Length in samples.")


class LargestItem(Model):
    """The largest item of each modality vLLM plans GPU memory for (its profiling run with dummy items): below the
    model's own maximum, more memory is left for the KV cache, and a larger item is still served by memory the
    profile did not plan for. Unset fields: the model's maximum."""

    image: ImageSize | None = Field(default=None, description="The largest image.")
    video: VideoSize | None = Field(default=None, description="The largest video.")
    audio: AudioSize | None = Field(default=None, description="The longest audio clip.")


ProcessorCacheType = Literal["lru", "shm"]
EncoderTensorParallel = Literal["weights", "data"]


class ProcessorCacheSpec(Model):
    """vLLM's cache of preprocessed multimodal items, so a repeated image is not processed again."""

    size_gi_b: float | None = Field(
        default=None,
        alias="sizeGiB",
        ge=0,
        le=1024,
        description="GiB of preprocessed items kept (lru: in the engine; shm: in one shared-memory buffer; with "
        "several API servers: in each of them); 0 turns it off. Default: vLLM's, 4.",
    )
    type: ProcessorCacheType | None = Field(
        default=None,
        description="lru: the data in the engine, its index in the API server; shm: one buffer in /dev/shm that both "
        "read (one API server process only). Default: vLLM's, lru.",
    )


class MultimodalSpec(Model):
    """Multimodal input settings (vllm only)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.processorCache) || !has(self.processorCache.type) || "
                    "self.processorCache.type != 'shm' || !has(self.apiServers) || self.apiServers == 1",
                    "processorCache.type shm works with one API server process (apiServers 1): vLLM 0.33 keeps a "
                    "cache per process with more",
                    ".processorCache.type",
                ),
            ]
        }
    )

    limit_per_prompt: ImageLimits | None = Field(
        default=None,
        description="Per-prompt limits on images, videos and audio (vllm only). Unset: the backend default.",
    )
    largest_item: LargestItem | None = Field(
        default=None,
        description="The largest image, video and audio clip vLLM plans GPU memory for (vllm only). Unset: the "
        "model's maximum.",
    )
    processor_cache: ProcessorCacheSpec | None = Field(
        default=None,
        description="vLLM's preprocessed-item cache (vllm only); its memory is added to the default memory request.",
    )
    encoder_tensor_parallel: EncoderTensorParallel | None = Field(
        default=None,
        description="With tensor parallelism: weights splits each encoder layer's weights over the GPUs, data "
        "splits the images of a batch over them, each GPU holding the whole encoder (models that support it; "
        "others fall back to weights). Default: vLLM's, weights.",
    )
    api_servers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="API server processes; each decodes and preprocesses images on one CPU core. Default: vLLM's, one.",
    )
    images_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Images one replica takes per second at its busiest (from a profile, or the rate its "
        "capacityPerReplica brings); the default CPU request grows by the cores decoding and preprocessing them "
        "take, for images of largestItem.image's size (default 1280x720), or by the extra apiServers if more "
        "(vllm only; docs/rendering.md, Resources). An encode tier's replicas take the serving replicas' images at "
        "their most. Unset: 4 cores per GPU, as without images.",
    )

    @model_validator(mode="after")
    def _check(self) -> MultimodalSpec:
        cache = self.processor_cache
        if cache is not None and cache.type == "shm" and (self.api_servers or 1) > 1:
            raise ValueError(
                f"processorCache.type: shm with multimodal.apiServers: {self.api_servers}; vLLM 0.33 shares the "
                "buffer with one API server process only (with more it keeps a cache per process); use lru or one "
                "API server"
            )
        return self

    def is_set(self) -> bool:
        return self != MultimodalSpec()


class GpuSpec(Model):
    """GPUs each replica holds."""

    count: int = Field(default=1, ge=1, le=16, description="GPUs per replica.")
    type: GpuType | None = Field(
        default=None,
        description="GPU model; selects nodes through the cloud's GPU labels. Unset: any GPU node.",
    )


class ParallelismSpec(Model):
    """How one replica splits the model over its GPUs."""

    tensor: int | None = Field(
        default=None, ge=1, le=16, description="Tensor-parallel size. Default: gpu.count / pipeline."
    )
    pipeline: int = Field(default=1, ge=1, le=16, description="Pipeline-parallel size.")


_TARGET = ("spec.autoscaling.slo.target", "1ms", "1h")
_WINDOW = ("spec.autoscaling.slo.window", "5s", "1h")
_DELAY = ("spec.autoscaling.scaleDownDelay", "0s", "1h")  # the HPA's stabilization window bound, 3600 s
_IDLE = ("spec.autoscaling.scaleToZero.after", "1m", "24h")  # at least one rate window: idle is seen no sooner
SloTarget = Annotated[str, duration_field(*_TARGET), duration_check(*_TARGET)]
SloWindow = Annotated[str, duration_field(*_WINDOW), duration_check(*_WINDOW)]
ScaleDownDelay = Annotated[str, duration_field(*_DELAY), duration_check(*_DELAY)]
_IDLE_LOW, _IDLE_HIGH = seconds(_IDLE[1]), seconds(_IDLE[2])
_IDLE_TEXT = f"auto, or a duration from {_IDLE[1]} to {_IDLE[2]} such as 30m"


def _idle_after(value: str) -> str:
    if value != "auto" and not (
        re.fullmatch(SPEC_DURATION_PATTERN, value) and _IDLE_LOW <= seconds(value) <= _IDLE_HIGH
    ):
        raise ValueError(f"{_IDLE[0]}: {value!r} is not accepted; {_IDLE_TEXT} is")
    return value


IdleAfter = Annotated[
    str,
    Field(
        max_length=SPEC_DURATION_MAX_LENGTH,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self == 'auto' || (self.matches('{SPEC_DURATION_PATTERN}') && "
                    f"duration(self) >= duration('{_IDLE[1]}') && duration(self) <= duration('{_IDLE[2]}'))",
                    "message": f"{_IDLE[0]} must be {_IDLE_TEXT}",
                    "messageExpression": f"'{_IDLE[0]}: ' + self + ' is not accepted; {_IDLE_TEXT} is'",
                }
            ]
        },
    ),
    AfterValidator(_idle_after),
]


class SloSpec(Model):
    """The latency objective the autoscaler holds."""

    metric: SloMetric = Field(
        default="e2e",
        description="e2e: whole request; ttft: time to first token; itl: time between output tokens.",
    )
    percentile: float = Field(default=90, ge=50, le=99.9, description="Percentile of the latency, e.g. 90 for P90.")
    target: SloTarget = Field(description="Latency the percentile must stay under, e.g. 2s or 250ms (1ms to 1h).")
    window: SloWindow = Field(
        default="60s",
        description=(
            "Window over which the percentile is computed (5s to 1h): it must hold at least two scrapes of the "
            "pods, four or more to be steady."
        ),
    )


class ScaleToZeroSpec(Model):
    """When a fleet with minReplicas 0 lets its last replica go."""

    after: IdleAfter = Field(
        default="auto",
        description=(
            "How long the fleet must have no request (none finished, in flight or held by the endpoint picker) "
            "before its last replica goes: a duration (1m to 24h), or auto: from this fleet's own idle gaps and "
            "measured cold start, the wait that costs least when a cold start is priced at its GPU time plus ten "
            "times the time the first request waits (docs/autoscaling.md, Scale to zero)."
        ),
    )


class WarmStandbySpec(Model):
    """Replicas kept started but asleep (vLLM's sleep mode, level 1), woken in seconds instead of started cold.

    A sleeping replica still holds its GPUs: standby buys the wake time against a cold start, not GPU-hours. Level 1
    only: at level 2 vLLM 0.33 drops the weights and its wake restores buffers, not weights (``v1/worker/
    gpu_worker.py`` ``wake_up``; level 2 is for a trainer that sends new ones), so a woken replica would serve noise.
    """

    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Replicas kept asleep beside the serving ones (and beside zero, with minReplicas 0). Each holds its "
            "GPUs while asleep, and its weights in CPU memory (vLLM's sleep level 1: add their size to "
            "resources.memory); a scale-up wakes them first, and the Deployment starts their replacements."
        ),
    )


class AutoscalingSpec(Model):
    """SLO-driven autoscaling. Present means on, unless enabled is false."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.minReplicas) ? self.minReplicas : 1) <= (has(self.maxReplicas) ? self.maxReplicas : 8)",
                    "minReplicas must not exceed maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "(has(self.enabled) && !self.enabled) || has(self.slo)",
                    "slo is required when autoscaling is enabled",
                ),
                cel(
                    "!has(self.warmStandby) || !has(self.enabled) || self.enabled",
                    "warmStandby is read only with autoscaling enabled; remove it or set enabled: true",
                    ".warmStandby",
                ),
                cel(
                    "!has(self.scaleToZero) || (has(self.minReplicas) && self.minReplicas == 0)",
                    "scaleToZero is read only with minReplicas 0; set minReplicas: 0 or remove scaleToZero",
                    ".scaleToZero",
                ),
            ]
        }
    )

    enabled: bool = Field(default=True, description="Scale on the SLO. false: spec.replicas rules.")
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Fewest replicas. 0: the last replica goes while the fleet is idle (see scaleToZero) and comes back on "
            "the first request, which the endpoint picker holds meanwhile; needs spec.routing.mode inferencePool."
        ),
    )
    max_replicas: int = Field(default=8, ge=1, le=1000, description="Most replicas.")
    slo: SloSpec | None = Field(default=None, description="The latency objective; required when enabled.")
    scale_down_delay: ScaleDownDelay | None = Field(
        default=None,
        description=(
            "How long demand must stay lower before replicas are removed (like the HPA's scale-down "
            "stabilization window; 0s to 1h, the HPA's bound). Set, it alone says so: a demand that swings "
            "within a minute (DemandSwings) is followed, not held for its peak of 15m as it is by default. "
            "Default: the longer of 5m and the measured cold start."
        ),
    )
    scale_to_zero: ScaleToZeroSpec | None = Field(
        default=None, description="With minReplicas 0: how long idle before the last replica goes. Default: auto."
    )
    warm_standby: WarmStandbySpec | None = Field(
        default=None,
        description=(
            "Keep this many more replicas started and put to sleep (vLLM sleep mode): a scale-up wakes them in "
            "seconds, out of routing until awake. vllm with routing.mode inferencePool only. Sleeping replicas hold "
            "their GPUs (docs/autoscaling.md, Warm standby)."
        ),
    )
    capacity_per_replica: float | None = Field(
        default=None,
        gt=0,
        le=100000,
        description=(
            "Requests per second one replica serves within the SLO, from a profile: `mmfleet twin profile` "
            "for the calibrated replica, or your own load test at the SLO (the highest steady rate one "
            "replica holds with the SLO met, on your request mix). The autoscaler sizes from it from the "
            "first cycle instead of learning from what a young fleet serves below saturation; it still "
            "learns a higher value online, and serves on less while replicas with a standing queue do. "
            "Default: learned online."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas: {self.min_replicas} exceeds maxReplicas: {self.max_replicas}")
        if self.enabled and self.slo is None:
            raise ValueError("slo: required when autoscaling is enabled (e.g. {target: 2s})")
        if self.warm_standby is not None and not self.enabled:
            raise ValueError("warmStandby: set, but enabled is false; it is read only with autoscaling enabled")
        if self.scale_to_zero is not None and self.min_replicas != 0:
            raise ValueError(
                f"scaleToZero: set, but minReplicas is {self.min_replicas}; it is read only with minReplicas: 0"
            )
        return self

    @property
    def idle_after(self) -> str | None:
        """With minReplicas 0, scaleToZero.after ("auto" or a duration); None when the fleet never goes to zero."""
        if self.min_replicas != 0:
            return None
        return (self.scale_to_zero or ScaleToZeroSpec()).after


class TracingSpec(Model):
    """OTLP traces from the inference server."""

    enabled: bool = Field(default=False, description="Send request traces over OTLP.")
    sample_ratio: float = Field(default=0.1, ge=0.0, le=1.0, description="Share of requests traced.")
    endpoint: Annotated[str, AfterValidator(_not_a_flag)] = Field(
        default="",
        max_length=512,
        description="OTLP/gRPC endpoint, e.g. http://collector:4317. Empty: the cloud's collector.",
        json_schema_extra={"x-kubernetes-validations": [NOT_A_FLAG_CEL]},
    )


class PlacementSpec(Model):
    """Scheduling constraints, merged over the cloud profile's."""

    node_selector: LabelMap = Field(default_factory=dict, description="Extra node labels required.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32, description="Extra tolerations.")
    affinity: Affinity = Field(
        default_factory=Affinity,
        description="Node and pod (anti-)affinity; required node terms are ANDed with the cloud's GPU selection.",
    )


class ModelCacheSpec(Model):
    """Where downloaded weights (and, with shared, compiled kernels) are kept."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.volume) || self.volume != 'shared' || has(self.claimName)",
                    "claimName is required when volume is shared: the name of an existing ReadWriteMany "
                    "PersistentVolumeClaim in the same namespace",
                    ".claimName",
                ),
                cel(
                    "!has(self.claimName) || (has(self.volume) && self.volume == 'shared')",
                    "claimName is only read when volume is shared; set volume: shared or remove claimName",
                    ".claimName",
                ),
                # A claim template asking for 0 bytes is refused by kube-apiserver ("must be greater than zero").
                cel(
                    f"!has(self.size) || !string(self.size).matches('{ZERO_QUANTITY_PATTERN}')",
                    "size must be greater than zero, e.g. 200Gi",
                    ".size",
                ),
            ]
        }
    )

    size: Quantity = Field(
        default="200Gi",
        description=(
            "Size limit of each replica's own cache volume, e.g. 200Gi. With shared it bounds only the "
            "replica's scratch space (HOME); the claim has its own size."
        ),
    )
    volume: Literal["emptyDir", "ephemeral", "shared"] = Field(
        default="emptyDir",
        description=(
            "emptyDir: the node's local disk. ephemeral: a generic ephemeral volume, a PVC per pod on the "
            "cloud's disk class, for weights larger than the node's disk; it is deleted with its pod. "
            "shared: the existing ReadWriteMany claim named in claimName (EFS, Azure Files, NAS), mounted "
            "by every replica; it holds the Hugging Face download cache and vLLM's compile cache, so a "
            "new replica neither downloads nor compiles what an earlier one did."
        ),
    )
    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "With volume shared: the PersistentVolumeClaim in the same namespace, ReadWriteMany, that "
            "every replica mounts. Required then, and rejected with the other volumes."
        ),
    )
    storage_class_name: DnsSubdomain | None = Field(
        default=None, description="Storage class of the ephemeral volume. Default: the cloud profile's."
    )

    @model_validator(mode="after")
    def _check(self) -> ModelCacheSpec:
        if re.fullmatch(ZERO_QUANTITY_PATTERN, str(self.size)):
            raise ValueError(f"size: {self.size} is not accepted; a size greater than zero such as 200Gi is")
        if self.volume == "shared" and self.claim_name is None:
            raise ValueError(
                "claimName: required when spec.modelCache.volume is shared (the name of an existing "
                "ReadWriteMany PersistentVolumeClaim in the same namespace)"
            )
        if self.volume != "shared" and self.claim_name is not None:
            raise ValueError(
                f"claimName: {self.claim_name} is only read when spec.modelCache.volume is shared, "
                f"but volume is {self.volume}; set volume: shared or remove claimName"
            )
        return self


class IdentitySpec(Model):
    """Cloud workload identity the server uses to read the model store."""

    # Bounded (they become ServiceAccount annotations): a sanity limit, not the clouds' own rules.
    aws_role_arn: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/\S+$",
        description="EKS: IAM role (IRSA).",
    )
    azure_client_id: str | None = Field(
        default=None,
        max_length=36,
        pattern=r"^[0-9a-fA-F-]{36}$",
        description="AKS: client ID of the managed identity (Azure workload identity).",
    )
    alibaba_role_name: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^\S+$", description="ACK: RAM role name (RRSA)."
    )


def _secret_key(value: str) -> str:
    """The API server refuses '.' and '..' as a secretKeyRef key though they match the key pattern."""
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not a Secret key: use letters, digits, '-', '_' and '.', not '.' or '..' alone")
    return value


class SecretKeySelector(Model):
    """One key of a Secret in the fleet's namespace."""

    name: DnsSubdomain = Field(description="Secret name.")
    key: Annotated[str, AfterValidator(_secret_key)] = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key in the Secret's data.",
        json_schema_extra={"x-kubernetes-validations": [cel("self != '.' && self != '..'", "must not be '.' or '..'")]},
    )


class ServiceSpec(Model):
    """How clients reach the fleet."""

    type: Literal["ClusterIP", "LoadBalancer"] = Field(
        default="ClusterIP",
        description=(
            "ClusterIP, or LoadBalancer (internal to the VPC/VNet on eks, aks and ack; on generic, or auto, it needs "
            "loadBalancerSourceRanges or spec.apiKeySecret, so it is never public and unauthenticated)."
        ),
    )
    load_balancer_source_ranges: list[Cidr] = Field(
        default_factory=list,
        max_length=32,
        description="With LoadBalancer: the client CIDRs the load balancer admits, e.g. 10.0.0.0/8.",
    )


class NetworkPeer(Model):
    """Pods allowed in: by namespace labels, by pod labels, or both (pods with those labels in those namespaces)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.namespaceSelector) || has(self.podSelector)",
                    "give namespaceSelector, podSelector or both",
                )
            ]
        }
    )

    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces by label; {} is every namespace. Unset: the fleet's own."
    )
    pod_selector: LabelSelector | None = Field(default=None, description="Pods by label; {} is every pod.")

    @model_validator(mode="after")
    def _check(self) -> NetworkPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("namespaceSelector: give namespaceSelector, podSelector or both")
        return self


class NetworkPolicySpec(Model):
    """Who may reach the serving port (the API and /metrics share it). The fleet's NetworkPolicy admits only these."""

    # Each peer holds two label selectors: 8 peers a list keep the largest spec within one etcd request
    # (tests/contract/test_crd_bounds.py).
    ingress_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=8,
        description="Clients allowed to the API. Empty: every pod in the fleet's namespace.",
    )
    metrics_from: list[NetworkPeer] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Scrapers allowed to /metrics, besides the namespace of the operator's Prometheus (its setting "
            "prometheusUrl, when that names an in-cluster Service), which is always allowed."
        ),
    )


class MonitoringSpec(Model):
    """Prometheus Operator integration."""

    pod_monitor: bool | None = Field(
        default=None,
        description="Create a PodMonitor. Unset: when the monitoring.coreos.com CRDs exist.",
    )


class ResourcesSpec(Model):
    """CPU and memory per replica, beside the GPUs."""

    cpu: Quantity | None = Field(default=None, description="CPU request. Default: 4 per GPU.")
    memory: Quantity | None = Field(
        default=None,
        description="Memory request and limit. Default: 32Gi per GPU plus the /dev/shm size (2Gi per GPU).",
    )


class GatewayRef(Model):
    """A Gateway (gateway.networking.k8s.io/v1) that already exists: the fleet's HTTPRoute attaches to it."""

    name: DnsSubdomain = Field(description="The Gateway's name.")
    namespace: NamespaceName | None = Field(
        default=None, description="The Gateway's namespace. Default: the fleet's own."
    )
    section_name: DnsSubdomain | None = Field(
        default=None, description="One listener of the Gateway (its name). Default: every listener that admits it."
    )


class RoutingSpec(Model):
    """How requests reach a replica: a plain Service, or an InferencePool whose endpoint picker chooses the replica
    for each request (prefix and image affinity, queue and KV-cache load)."""

    mode: Literal["service", "inferencePool"] = Field(
        default="service",
        description=(
            "service: the fleet's Service spreads requests over its pods. inferencePool: also an InferencePool "
            "(inference.networking.k8s.io/v1) and its endpoint picker (the Gateway API Inference Extension's EPP), "
            "configured from this resource, for a Gateway that implements the extension."
        ),
    )
    gateway: GatewayRef | None = Field(
        default=None, description="With inferencePool: the Gateway to route through (an HTTPRoute is made)."
    )


class EncodeAutoscalingSpec(Model):
    """The encode tier scaled on its own signal: the images its serving replicas send it, and how long they wait for
    it, against its share of the SLO's target (docs/autoscaling.md, The encode tier)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.minReplicas) ? self.minReplicas : 1) <= (has(self.maxReplicas) ? self.maxReplicas : 8)",
                    "minReplicas must not exceed maxReplicas",
                    ".minReplicas",
                ),
            ]
        }
    )

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest encode replicas.")
    max_replicas: int = Field(default=8, ge=1, le=1000, description="Most encode replicas.")
    share: float = Field(
        default=0.25,
        ge=0.05,
        le=0.9,
        description=(
            "Share of spec.autoscaling.slo.target the encode tier may take at the SLO's percentile, as the serving "
            "pods time their calls to it; the serving tier is held to the rest, on its servers' own latency."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> EncodeAutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas: {self.min_replicas} exceeds maxReplicas: {self.max_replicas}")
        return self


class EncodeTierSpec(Model):
    """Vision encoding on pods of its own (vLLM 0.33's encoder disaggregation, the ECCPUConnector over NIXL): encode
    replicas turn each request's images into encoder outputs, which the serving replicas read instead of running the
    encoder between their decode steps. A sidecar in each serving pod sends a request's images through this tier first
    (docs/rendering.md, Encode tier)."""

    replicas: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Encode replicas, without autoscaling (with it, the count the tier starts from).",
    )
    autoscaling: EncodeAutoscalingSpec | None = Field(
        default=None,
        description=(
            "Scale the encode tier on its own signal, within these bounds (needs spec.autoscaling with an SLO on "
            "ttft or e2e). Unset: it keeps replicas."
        ),
    )
    gpu: GpuSpec = Field(
        default_factory=GpuSpec,
        description="GPUs per encode replica (tensor-parallel over them). type unset: spec.gpu.type.",
    )
    cache_gi_b: float = Field(
        default=4.0,
        alias="cacheGiB",
        ge=0.25,
        le=1024,
        description="GiB of encoder outputs each pod of both tiers keeps in /dev/shm (the connector's ec_cpu_bytes): "
        "the encode pods hold what they made until a serving pod reads it, the serving pods what they read, for "
        "reuse. Added to both tiers' memory and /dev/shm.",
    )


class DisaggregationSpec(Model):
    """Parts of the model's work run on pods of their own."""

    encode: EncodeTierSpec | None = Field(
        default=None,
        description="A tier of encode replicas for images, video and audio (vllm only). Unset: each replica encodes "
        "its own requests' items.",
    )


MULTIMODAL_FIELDS = tuple(
    str(info.alias) for info in MultimodalSpec.model_fields.values()
)  # on the wire: every one is a vllm setting


class MultimodalInferenceSpec(Model):
    """A fleet of inference servers for one multimodal model."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.parallelism) || (has(self.gpu) && has(self.gpu.count) ? self.gpu.count : 1) % "
                    "(has(self.parallelism.pipeline) ? self.parallelism.pipeline : 1) == 0",
                    "parallelism.pipeline must divide gpu.count",
                    ".parallelism.pipeline",
                ),
                cel(
                    "!has(self.parallelism) || !has(self.parallelism.tensor) || "
                    "self.parallelism.tensor * (has(self.parallelism.pipeline) ? self.parallelism.pipeline : 1) "
                    "== (has(self.gpu) && has(self.gpu.count) ? self.gpu.count : 1)",
                    "parallelism.tensor x parallelism.pipeline must equal gpu.count",
                    ".parallelism.tensor",
                ),
                cel(
                    "!has(self.multimodal) || !has(self.backend) || !has(self.backend.name) || "
                    "self.backend.name == 'vllm' || ("
                    + " && ".join(f"!has(self.multimodal.{f})" for f in MULTIMODAL_FIELDS)
                    + ")",
                    "multimodal is a vllm setting; tensorrt-llm takes none of its fields",
                    ".multimodal",
                ),
                cel(
                    "!has(self.backend) || !has(self.backend.attention) || self.backend.attention != 'flash-attn-3' "
                    "|| (has(self.gpu) && has(self.gpu.type) && self.gpu.type in "
                    "['H100', 'H200', 'H20', 'GH200'])",
                    "backend.attention flash-attn-3 needs a Hopper gpu.type (H100, H200, H20, GH200)",
                    ".backend.attention",
                ),
                cel(
                    "!has(self.apiKeySecret) || !has(self.backend) || !has(self.backend.name) || "
                    "self.backend.name == 'vllm'",
                    "apiKeySecret: tensorrt-llm's trtllm-serve has no API-key option; only vllm takes one",
                    ".apiKeySecret",
                ),
                cel(
                    "!has(self.service) || !has(self.service.type) || self.service.type != 'LoadBalancer' || "
                    "(has(self.cloud) && self.cloud in ['eks', 'aks', 'ack']) || has(self.apiKeySecret) || "
                    "(has(self.service.loadBalancerSourceRanges) && self.service.loadBalancerSourceRanges.size() > 0)",
                    "service.type LoadBalancer on cloud generic or auto would be public and unauthenticated: set "
                    "service.loadBalancerSourceRanges or apiKeySecret",
                    ".service.type",
                ),
                cel(
                    "!has(self.routing) || !has(self.routing.gateway) || "
                    "(has(self.routing.mode) && self.routing.mode == 'inferencePool')",
                    "routing.gateway: an HTTPRoute to the InferencePool needs routing.mode inferencePool",
                    ".routing.gateway",
                ),
                # The operator's own check names the routing.mode it got; a messageExpression doing so here costs
                # more than the API server's CEL budget allows for the whole schema.
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || "
                    "self.autoscaling.minReplicas > 0 || (has(self.autoscaling.enabled) && "
                    "!self.autoscaling.enabled) || "
                    "(has(self.routing) && has(self.routing.mode) && self.routing.mode == 'inferencePool')",
                    "autoscaling.minReplicas: 0 needs spec.routing.mode inferencePool (the default is service): with "
                    "no replica, only the endpoint picker holds a request while one starts",
                    ".autoscaling.minReplicas",
                ),
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.warmStandby) || !has(self.backend) || "
                    "!has(self.backend.name) || self.backend.name == 'vllm'",
                    "autoscaling.warmStandby needs vllm's sleep mode; tensorrt-llm has none",
                    ".autoscaling.warmStandby",
                ),
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.warmStandby) || !has(self.service) || "
                    "!has(self.service.type) || self.service.type != 'LoadBalancer'",
                    "autoscaling.warmStandby with service.type LoadBalancer would expose vllm's development endpoints "
                    "(/sleep, /collective_rpc), which no API key guards; use ClusterIP or routing.mode inferencePool",
                    ".autoscaling.warmStandby",
                ),
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.warmStandby) || "
                    "(has(self.routing) && has(self.routing.mode) && self.routing.mode == 'inferencePool')",
                    "autoscaling.warmStandby needs spec.routing.mode inferencePool: a Service balances connections, "
                    "and a kept-alive one would go on sending to a sleeping pod, whose engine queues requests",
                    ".autoscaling.warmStandby",
                ),
                cel(
                    "!has(self.disaggregation) || !has(self.disaggregation.encode) || !has(self.backend) || "
                    "!has(self.backend.name) || self.backend.name == 'vllm'",
                    "disaggregation.encode needs vllm's encoder disaggregation; tensorrt-llm has none (accepted: "
                    "backend.name vllm, or no disaggregation.encode)",
                    ".disaggregation.encode",
                ),
                cel(
                    "!has(self.disaggregation) || !has(self.disaggregation.encode) || !has(self.multimodal) || "
                    "!has(self.multimodal.limitPerPrompt) || !has(self.multimodal.limitPerPrompt.image) || "
                    "self.multimodal.limitPerPrompt.image > 0 || !has(self.multimodal.limitPerPrompt.video) || "
                    "self.multimodal.limitPerPrompt.video > 0 || !has(self.multimodal.limitPerPrompt.audio) || "
                    "self.multimodal.limitPerPrompt.audio > 0",
                    "disaggregation.encode with multimodal.limitPerPrompt 0 images, videos and audio clips: a "
                    "text-only fleet has nothing to encode (accepted: a limit above 0, or no disaggregation.encode)",
                    ".disaggregation.encode",
                ),
                cel(
                    "!has(self.disaggregation) || !has(self.disaggregation.encode) || !has(self.autoscaling) || "
                    "!has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0 || "
                    "(has(self.autoscaling.enabled) && !self.autoscaling.enabled)",
                    "disaggregation.encode with autoscaling.minReplicas 0: the encode tier keeps its replicas, and "
                    "their GPUs, while the fleet idles at zero (accepted: minReplicas 1 or more, or no "
                    "disaggregation.encode)",
                    ".disaggregation.encode",
                ),
                cel(
                    "!has(self.disaggregation) || !has(self.disaggregation.encode) || "
                    "!has(self.disaggregation.encode.autoscaling) || (has(self.autoscaling) && "
                    "(!has(self.autoscaling.enabled) || self.autoscaling.enabled) && has(self.autoscaling.slo) && "
                    "(!has(self.autoscaling.slo.metric) || self.autoscaling.slo.metric != 'itl'))",
                    "disaggregation.encode.autoscaling needs spec.autoscaling enabled with an SLO on ttft or e2e: the "
                    "encode tier takes its share of that target (accepted: slo.metric ttft or e2e, or no "
                    "disaggregation.encode.autoscaling)",
                    ".disaggregation.encode.autoscaling",
                ),
                cel(
                    "!has(self.disaggregation) || !has(self.disaggregation.encode) || "
                    "!has(self.disaggregation.encode.gpu) || !has(self.disaggregation.encode.gpu.type) || "
                    "!has(self.backend) || !has(self.backend.attention) || self.backend.attention != 'flash-attn-3' || "
                    "self.disaggregation.encode.gpu.type in ['H100', 'H200', 'H20', 'GH200']",
                    "backend.attention flash-attn-3 runs on the encode tier too: disaggregation.encode.gpu.type must "
                    "be Hopper (H100, H200, H20, GH200), or use auto or flash-attn-2",
                    ".disaggregation.encode.gpu.type",
                ),
                cel(
                    "!has(self.backend) || !has(self.backend.name) || self.backend.name != 'tensorrt-llm' || "
                    "!has(self.model.source) || self.model.source.startsWith('hf://') || "
                    "self.model.source.startsWith('pvc://')",
                    "model.source: tensorrt-llm loads hf:// or pvc:// sources",
                    ".model.source",
                ),
            ]
        }
    )

    model: ModelSpec = Field(description="The model to serve.")
    backend: BackendSpec = Field(default_factory=BackendSpec, description="Inference server and engine settings.")
    multimodal: MultimodalSpec = Field(default_factory=MultimodalSpec, description="Multimodal input settings.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPUs per replica.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Tensor and pipeline parallelism within a replica."
    )
    cloud: CloudName = Field(
        default="auto", description="Cloud profile: auto (detected from nodes), eks, aks, ack or generic."
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas when autoscaling is off.")
    autoscaling: AutoscalingSpec | None = Field(default=None, description="SLO-driven autoscaling.")
    tracing: TracingSpec = Field(default_factory=TracingSpec, description="OTLP request tracing.")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="Extra scheduling constraints.")
    model_cache: ModelCacheSpec = Field(
        default_factory=ModelCacheSpec, description="Weight cache: per replica, or one claim shared by all."
    )
    identity: IdentitySpec = Field(default_factory=IdentitySpec, description="Cloud workload identity.")
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="How clients reach the fleet.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Prometheus Operator objects.")
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec, description="How requests reach a replica: a Service, or an InferencePool."
    )
    disaggregation: DisaggregationSpec = Field(
        default_factory=DisaggregationSpec,
        description="Parts of the model's work on pods of their own: the encode tier (vllm only).",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="CPU and memory per replica.")
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        description=(
            "The fleet's NetworkPolicy: the serving port admits the fleet's namespace (or ingressFrom), the "
            "operator's Prometheus and metricsFrom; with a LoadBalancer, every source (its source ranges guard it)."
        ),
    )
    api_key_secret: SecretKeySelector | None = Field(
        default=None,
        description=(
            "The Secret key holding the API key clients must send (Authorization: Bearer <key>), handed to vllm as "
            "VLLM_API_KEY from the Secret, so the key is never in this resource or the pod spec. vllm checks it on "
            "/v1 (not on /health, /metrics or /invocations). Not supported by tensorrt-llm."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> MultimodalInferenceSpec:
        gpus, pipeline, tensor = self.gpu.count, self.parallelism.pipeline, self.parallelism.tensor
        if gpus % pipeline:
            raise ValueError(f"parallelism.pipeline: {pipeline} does not divide spec.gpu.count: {gpus}")
        if tensor is not None and tensor * pipeline != gpus:
            if gpus % tensor:
                raise ValueError(f"parallelism.tensor: {tensor} does not divide spec.gpu.count: {gpus}")
            raise ValueError(
                f"parallelism.tensor: {tensor} x spec.parallelism.pipeline: {pipeline} "
                f"must equal spec.gpu.count: {gpus}"
            )
        if self.multimodal.is_set() and self.backend.name != "vllm":
            first, *others = self.multimodal.model_dump(by_alias=True, exclude_none=True)
            also = f" (nor {', '.join(f'multimodal.{name}' for name in others)})" if others else ""
            raise ValueError(
                f"multimodal.{first}: set, but spec.backend.name: {self.backend.name} takes no multimodal setting"
                f"{also}; they are vllm's"
            )
        if self.api_key_secret is not None and self.backend.name != "vllm":
            raise ValueError(
                f"apiKeySecret: set, but spec.backend.name: {self.backend.name} has no API-key option "
                "(trtllm-serve, tensorrt_llm/commands/serve.py); only vllm takes one, or put an authenticating "
                "gateway in front"
            )
        if (
            self.service.type == "LoadBalancer"
            and self.cloud not in ("eks", "aks", "ack")
            and self.api_key_secret is None
            and not self.service.load_balancer_source_ranges
        ):
            raise ValueError(
                f"service.type: LoadBalancer on cloud {self.cloud} would be public and unauthenticated; set "
                "spec.service.loadBalancerSourceRanges (the client CIDRs) or spec.apiKeySecret, or use cloud eks, "
                "aks or ack (internal load balancers)"
            )
        if self.routing.gateway is not None and self.routing.mode != "inferencePool":
            raise ValueError(
                f"routing.gateway: set, but spec.routing.mode is {self.routing.mode}; an HTTPRoute to the "
                "InferencePool needs routing.mode inferencePool (accepted: inferencePool, or no gateway)"
            )
        autoscaling = self.autoscaling
        zero = autoscaling is not None and autoscaling.enabled and autoscaling.min_replicas == 0
        if zero and self.routing.mode != "inferencePool":
            raise ValueError(
                f"autoscaling.minReplicas: 0 needs spec.routing.mode inferencePool, but it is {self.routing.mode}: "
                "with no replica, only the endpoint picker's flow control holds a request while one starts "
                "(accepted: minReplicas 1 or more, or routing.mode: inferencePool)"
            )
        if autoscaling is not None and autoscaling.warm_standby is not None:
            if self.backend.name != "vllm":
                raise ValueError(
                    f"autoscaling.warmStandby: set, but spec.backend.name is {self.backend.name}, which has no sleep "
                    "mode (accepted: backend.name vllm, or no warmStandby)"
                )
            if self.routing.mode != "inferencePool":
                raise ValueError(
                    f"autoscaling.warmStandby: set, but spec.routing.mode is {self.routing.mode}: a Service balances "
                    "connections, and a kept-alive one would go on sending requests to a pod put to sleep, where "
                    "vllm queues them until it wakes; the endpoint picker chooses a pod per request (accepted: "
                    "routing.mode inferencePool, or no warmStandby)"
                )
            if self.service.type == "LoadBalancer":
                raise ValueError(
                    "autoscaling.warmStandby: set, but spec.service.type is LoadBalancer, which would expose vllm's "
                    "development endpoints (/sleep, /collective_rpc; no API key guards them) to every client "
                    "(accepted: service.type ClusterIP, with routing.mode inferencePool for a gateway)"
                )
        if self.disaggregation.encode is not None:
            self._check_encode_tier()
        if self.backend.attention == "flash-attn-3" and self.gpu.type not in HOPPER_GPUS:
            raise ValueError(
                f"backend.attention: flash-attn-3 needs a Hopper GPU, but spec.gpu.type is {self.gpu.type or 'unset'} "
                f"(accepted: {', '.join(HOPPER_GPUS)}); use auto or flash-attn-2"
            )
        if self.backend.name == "tensorrt-llm":
            if self.backend.kv_cache_dtype not in TRTLLM_KV_CACHE_DTYPES:
                raise ValueError(
                    f"backend.kvCacheDtype: {self.backend.kv_cache_dtype} is not accepted by tensorrt-llm "
                    f"(accepted: {', '.join(TRTLLM_KV_CACHE_DTYPES)})"
                )
            if self.backend.attention != "auto":
                raise ValueError(
                    f"backend.attention: {self.backend.attention} is not accepted by tensorrt-llm "
                    "(accepted: auto; it picks its own kernels)"
                )
            scheme = self.model.resolved_source().split("://", 1)[0]
            if scheme not in ("hf", "pvc"):
                raise ValueError(
                    f"model.source: {self.model.source} is not loadable by tensorrt-llm (accepted: hf://, pvc://)"
                )
        return self

    def _check_encode_tier(self) -> None:
        if self.backend.name != "vllm":
            raise ValueError(
                f"disaggregation.encode: set, but spec.backend.name is {self.backend.name}, which has no encoder "
                "disaggregation (accepted: backend.name vllm, or no disaggregation.encode)"
            )
        limits = self.multimodal.limit_per_prompt
        if limits is not None and limits.image == 0 and limits.video == 0 and limits.audio == 0:
            raise ValueError(
                "disaggregation.encode: set, but spec.multimodal.limitPerPrompt allows 0 images, videos and audio "
                "clips: a text-only fleet has nothing to encode (accepted: a limit above 0, or no "
                "disaggregation.encode)"
            )
        if self.autoscaled and self.autoscaling is not None and self.autoscaling.min_replicas == 0:
            raise ValueError(
                "disaggregation.encode: set with spec.autoscaling.minReplicas: 0; the encode tier keeps its replicas, "
                "and their GPUs, while the fleet idles at zero (accepted: minReplicas 1 or more, or no "
                "disaggregation.encode)"
            )
        encode = self.disaggregation.encode
        assert encode is not None
        if encode.autoscaling is not None:
            slo = self.autoscaling.slo if self.autoscaled and self.autoscaling is not None else None
            if slo is None or slo.metric == "itl":
                found = "autoscaling off" if slo is None else "slo.metric itl"
                raise ValueError(
                    f"disaggregation.encode.autoscaling: set, but spec has {found}; the encode tier takes its share of "
                    "an SLO on ttft or e2e (accepted: spec.autoscaling enabled with slo.metric ttft or e2e, or no "
                    "disaggregation.encode.autoscaling)"
                )
        encode_gpu = encode.gpu.type
        if self.backend.attention == "flash-attn-3" and encode_gpu is not None and encode_gpu not in HOPPER_GPUS:
            raise ValueError(
                f"disaggregation.encode.gpu.type: {encode_gpu} with spec.backend.attention: flash-attn-3, which runs "
                f"on the encode tier too and needs a Hopper GPU (accepted: {', '.join(HOPPER_GPUS)}; or attention auto "
                "or flash-attn-2)"
            )

    @property
    def tensor_parallel(self) -> int:
        return self.parallelism.tensor or self.gpu.count // self.parallelism.pipeline

    @property
    def autoscaled(self) -> bool:
        return self.autoscaling is not None and self.autoscaling.enabled

    @property
    def encode_autoscaling(self) -> EncodeAutoscalingSpec | None:
        """The encode tier's own autoscaling, when it is on (it is read only with the fleet's)."""
        encode = self.disaggregation.encode
        return encode.autoscaling if encode is not None and self.autoscaled else None

    @property
    def serving_slo_target(self) -> float | None:
        """Seconds the serving tier's SLO percentile may take: the SLO's target, less the encode tier's share when that
        tier scales on its own (mmfleet.autoscaler.encode); None without an SLO."""
        slo = self.autoscaling.slo if self.autoscaling is not None else None
        if slo is None:
            return None
        encode = self.encode_autoscaling
        return seconds(slo.target) * (1.0 if encode is None else 1.0 - encode.share)

    @property
    def standby(self) -> WarmStandbySpec | None:
        """The warm standby the autoscaler keeps, when it is on."""
        return self.autoscaling.warm_standby if self.autoscaling is not None and self.autoscaling.enabled else None
