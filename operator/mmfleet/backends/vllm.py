"""vLLM 0.33.0: how mmfleet starts ``vllm serve`` and what it reads back.

Flags, metrics and engine behaviour were read in the released 0.33.0 wheel (``vllm/_version.py``:
0.33.0, commit g4ba787ec9); their paths are inside its ``vllm/`` package. Image facts (``docker/``,
``docs/``, ``.buildkite/``) come from the vllm-project/vllm repository at a later, unpinned commit.

- Image ``vllm/vllm-openai:v0.33.0``: the release script tags ``vllm/vllm-openai:v${RELEASE_VERSION}``,
  a multi-arch manifest (``.buildkite/scripts/annotate-release.sh``). The image's entrypoint is
  ``vllm serve``; we set ``command`` to the whole line, so the entrypoint does not matter.
- Non-root: ``docs/deployment/docker.md`` says the CUDA image runs as root by default, yet is
  prepared to run as a non-root user (its built-in ``vllm`` user is UID 2000, GID 0). Every cache
  defaults to ``$HOME/.cache``, so HOME must be writable (rendering points it at the cache volume).
  With a UID that is not in the image's ``/etc/passwd``, ``getpass.getuser()`` raises, which is why
  upstream's non-root entrypoint sets ``USER`` (``docker/entrypoints/vllm-nonroot-entrypoint.sh``);
  ``env()`` does the same.
- Flags (``engine/arg_utils.py`` ``add_cli_args``, types from ``config/*.py``): ``--tensor-parallel-size``
  (``-tp``), ``--pipeline-parallel-size`` (``-pp``) from ``config/parallel.py``; ``--max-model-len``
  (``config/model.py``); ``--max-num-seqs``, ``--max-num-batched-tokens`` and
  ``--enable-chunked-prefill`` (a bool field, so argparse's BooleanOptionalAction also makes
  ``--no-enable-chunked-prefill``) from ``config/scheduler.py``; ``--gpu-memory-utilization`` (alias
  ``--device-memory-utilization``) and ``--kv-cache-dtype`` from ``config/cache.py``; ``--download-dir``
  and ``--load-format`` from ``config/load.py``; ``--limit-mm-per-prompt`` (JSON or dotted keys) from
  ``config/multimodal.py``; ``--otlp-traces-endpoint`` from ``config/observability.py``;
  ``--served-model-name`` (its first name is the ``model_name`` metric label) from ``config/model.py``;
  ``--host``/``--port`` from ``entrypoints/common/cli_args.py``; the model is the positional
  ``model_tag``, which wins over ``--model`` (``entrypoints/cli/serve.py``).
- Attention: ``--attention-backend`` takes an ``AttentionBackendEnum`` name (``FLASH_ATTN``,
  ``FLASHINFER``, ``TRITON_ATTN`` in ``v1/attention/backends/registry.py``); ``--attention-config``
  (``-ac``) has ``flash_attn_version: Literal[2, 3, 4]`` (``config/attention.py``). We spell the
  version as vLLM's own warning does, ``--attention-config.flash_attn_version N``; the dotted form is
  expanded to JSON by ``FlexibleArgumentParser`` (``utils/argparse_utils.py``). The backend flag and
  ``attention_config.backend`` are mutually exclusive, so only the version goes in the config.
  The ``VLLM_ATTENTION_BACKEND`` env var is gone in 0.33.
- Metrics (``v1/metrics/loggers.py`` ``PrometheusStatLogger``, labels ``model_name`` and ``engine``):
  ``vllm:request_success`` is a Counter, scraped as ``vllm:request_success_total``.
  ``--disable-log-stats`` stops ``AsyncLLM`` from building any stat logger (``v1/engine/async_llm.py``),
  so every ``vllm:*`` series vanishes; it is never emitted and is rejected in extraArgs.
- API key: ``--api-key`` (``entrypoints/common/cli_args.py``, a list) wins; only without it does
  ``entrypoints/serve/middleware/register.py`` read ``envs.VLLM_API_KEY`` and add ``AuthenticationMiddleware``,
  which guards paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` only
  (``serve/middleware/authenticate.py`` ``GUARDED_PREFIX``): ``/health`` and ``/metrics`` stay open for the
  probes and Prometheus. ``spec.apiKeySecret`` is passed as ``VLLM_API_KEY`` from the Secret; ``--api-key`` and
  ``--hf-token`` (``engine/arg_utils.py``) are refused in extraArgs, which would store them in plain text.
- Object stores: a model URL starting with ``s3://``, ``gs://`` or ``az://`` (``SUPPORTED_SCHEMES`` in
  ``transformers_utils/runai_utils.py``) is pulled by the Run:ai Model Streamer; with
  ``--load-format auto`` vLLM switches to ``runai_streamer`` itself and refuses other formats
  (``config/vllm.py``). We pass ``--load-format runai_streamer`` anyway so the pod spec says what
  happens. The image installs ``runai-model-streamer`` in its vllm-openai-base stage (``docker/Dockerfile``;
  ``RUNAI_MODEL_STREAMER_VERSION`` >=0.15.7 in ``docker/versions.json``; the ``[s3,gcs,azure]`` extras were
  read in a 2026 derivative of that Dockerfile, not at the 0.33 tag). ``az://`` needs
  ``AZURE_STORAGE_ACCOUNT_NAME`` and uses DefaultAzureCredential (docs ``models/extensions/runai_model_streamer.md``).
- ``oss://`` is not a scheme vLLM knows. Alibaba OSS speaks the S3 protocol, so ``command()`` rewrites
  ``oss://bucket/path`` to ``s3://bucket/path``; the pod must then point the streamer at the OSS
  endpoint with ``RUNAI_STREAMER_S3_ENDPOINT`` (read by the streamer's S3 client) and, for the
  config/tokenizer pull, ``AWS_ENDPOINT_URL``, e.g. ``https://oss-<region>-internal.aliyuncs.com``,
  with AccessKey credentials as ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``. vLLM copies
  AWS_ENDPOINT_URL into RUNAI_STREAMER_S3_ENDPOINT only when ``--model-loader-extra-config`` is given
  (``model_executor/model_loader/runai_streamer_loader.py``), so set both; the credentials Secret
  (spec.model.credentialsSecret) carries them.
- Tracing: ``tracing/otel.py`` (read @40eeb0c5, and unchanged in substance where a later ``main``
  moved it to ``foundation/observability/tracing/otel.py`` @055e47c2) has ``init_tracer`` build
  ``TracerProvider(resource=Resource.create({vllm.instrumenting_module_name, vllm.process_id}))`` with no
  sampler, so the OTel SDK reads ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``
  (``opentelemetry/sdk/trace/sampling.py`` ``_get_from_env_or_default``), and ``Resource.create`` merges
  ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``. ``init_tracer`` writes the flag's value to
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` for child processes (``init_otel_worker`` reads it back). The
  exporter protocol comes from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` only (grpc by default;
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` is ignored), and the gRPC exporter is built ``insecure=True`` (the SDK
  still uses TLS for an ``https://`` endpoint). Known defect, open upstream as vllm-project/vllm#56719:
  ``init_tracer`` runs in ``AsyncLLM.__init__`` before the engine core is started, and when it is
  forked (``VLLM_WORKER_MULTIPROC_METHOD`` defaults to ``fork`` in ``envs.py``) the child's own
  ``set_tracer_provider`` is refused (the "already set" flag is inherited) and its spans go to the
  parent's batch processor, whose thread did not survive the fork: engine, worker and loading spans
  are lost. The request spans are made in the API server process and are not affected. ``env()`` sets
  ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` with tracing on (``envs.py``: "Both spawn and fork work").
  vllm-project/vllm#56696 ("--otlp-traces-endpoint ... never sends spans") was closed by its reporter
  as a collector-side problem, not a vLLM defect.
- Shared cache (spec.modelCache.volume shared). ``VLLM_CACHE_ROOT`` (``envs.py``; default
  ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``) roots every vLLM cache. The torch.compile cache is
  ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_<dp>/`` where the hash covers the env factors
  (``envs.compile_factors``, which leaves ``VLLM_CACHE_ROOT`` itself out), ``vllm_config.compute_hash()``,
  the traced source files and the compiler's hash (``compilation/backends.py`` ``VllmBackend.__call__``);
  with torch >= 2.10 (the wheel pins 2.14) the AOT artifact goes to
  ``torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/model`` (``compilation/decorators.py``), and
  Inductor's and Triton's caches are pointed inside the same directory (``compiler_interface.py``
  ``initialize_inductor_cache``). Concurrent writers: there is no lock. The AOT artifact is written to
  ``model.<pid>.tmp`` and ``os.replace``d (``save_aot_compiled_function``), and a load that fails falls
  back to compiling (``_try_load_aot_compiled_fn`` returns None); ``vllm_compile_cache.py`` is written in
  place (``CompilerManager.save_to_file``). Downloads: with a ``--download-dir``, vLLM holds a
  ``filelock.FileLock`` in that directory around every ``snapshot_download``
  (``model_executor/model_loader/weight_utils.py`` ``get_lock``), so replicas take turns downloading.
- Drain: ``--shutdown-timeout N`` (``engine/arg_utils.py``; ``VllmConfig.shutdown_timeout`` in
  ``config/vllm.py``): on SIGTERM the engine stops taking requests and lets running ones finish for up
  to N seconds (``v1/engine/core.py`` mode "drain"; 0, the default, aborts them). ``drain_args()`` spells
  it; rendering appends it, since it owns the pod's grace period.
- Sleep mode (spec.autoscaling.warmStandby): ``--enable-sleep-mode`` (``ModelConfig.enable_sleep_mode`` in
  ``config/model.py``, a bool, so argparse also has ``--no-enable-sleep-mode``; on CUDA it switches on the cumem
  allocator). ``POST /sleep?level=0|1|2&mode=abort|wait|keep``, ``POST /wake_up`` and ``GET /is_sleeping``
  (``entrypoints/serve/dev/sleep/api_router.py``) are mounted only with ``VLLM_SERVER_DEV_MODE=1``
  (``entrypoints/launchers/api_server/routers.py``), which also mounts the other development routers
  (``entrypoints/serve/__init__.py`` ``register_vllm_dev_api_routers``: cache reset, ``/collective_rpc``,
  ``/server_info``, the RL routes) with a "SECURITY WARNING" in the log; ``--api-key`` guards none of them
  (``serve/middleware/authenticate.py`` guards ``/v1`` and the like). Level 1 copies the weights to CPU memory and drops
  the KV cache; level 2 drops both (``v1/engine/core.py`` ``sleep``); ``/wake_up`` restores the weights only after level
  1 (after level 2, buffers: ``v1/worker/gpu_worker.py`` ``wake_up``), so mmfleet sleeps at level 1. ``mode=wait`` lets
  running requests finish before the engine pauses (``pause_scheduler``); a request sent to a sleeping engine waits in
  its queue until the wake (only ``pause_generation`` refuses new ones), so a sleeping pod is taken out of routing
  first. ``/wake_up`` answers ``{"status": "awake"}`` once every tag is back; ``vllm:engine_sleep_state{sleep_state}``
  and ``vllm:sleep_mode_operation_duration_seconds{operation}`` (``entrypoints/serve/dev/sleep/metrics.py``) report it.
  The API server refuses a LoadBalancer with warm standby and an HTTPRoute passes ``/v1`` only, since ``--api-key``
  guards none of the development routes; the fleet's NetworkPolicy keeps them within the namespace and the operator's.
- Encoder disaggregation (spec.disaggregation.encode): ``--ec-transfer-config`` (``config/ec_transfer.py``
  ``ECTransferConfig``: ``ec_connector``, ``ec_role`` ec_producer or ec_consumer, ``ec_connector_extra_config``). The
  connector is ``ECCPUConnector`` (registered in ``distributed/ec_transfer/ec_connector/factory.py``): it needs
  ``ec_cpu_bytes`` in the extra config (``cpu/common.py`` ``create_ec_shared_region`` refuses to start without it), a
  region mapped from ``/dev/shm/vllm_ec_<engine>.mmap`` (``cpu/ec_shared_region.py``), and the V2 model runner
  (``cpu/connector.py`` raises without it; ``VLLM_USE_V2_MODEL_RUNNER=1``). Between pods it moves the outputs over
  NIXL, switched on by ``ec_enable_nixl`` in the extra config (``cpu/scheduler/__init__.py``; without it each
  instance's region is its own). NIXL is not a dependency of the vllm wheel (no ``Requires-Dist``, no extra); the
  image must carry the ``nixl`` package, which the encode pod imports at start. The producer binds its side channel
  on ``VLLM_EC_SIDE_CHANNEL_HOST``:``VLLM_EC_SIDE_CHANNEL_PORT`` (``envs.py``, defaults localhost:5601) and announces
  the same host to consumers as ``peer_host`` (``request_finished``), so it is the pod's IP. A producer that is
  not also a consumer is encoder-only: ``config/vllm.py`` ``_resolve_mm_encoder_only`` sets ``--mm-encoder-only``
  itself and refuses a model that is not multimodal, and prefix caching is switched off for it. Each served
  image request's encoder outputs are announced in the response's top-level ``ec_transfer_params`` (non-streaming
  only, ``entrypoints/openai/chat_completion/serving.py``), keyed by the item's hash, and a consumer fetches them
  when the request carries them back in its own ``ec_transfer_params`` (``chat_completion/protocol.py``, passed on in
  ``SamplingParams.extra_args``); without them, or when a fetch fails and the request still holds its images, the
  consumer encodes locally (``cpu/scheduler/__init__.py`` ``_admit_item``, ``_fail_or_fallback``). Encoder-only skips
  the parts a model class marks as its language model (``SupportsMultiModal._mark_language_model`` or
  ``_mark_composite_model``, ``model_executor/models/interfaces.py``); a few multimodal classes mark none
  (``llava_onevision2.py``, ``funasr.py``, ``diffusion_gemma.py``, ``jina_vl.py``, ``colmodernvbert.py``), and an
  encode replica of theirs loads the whole model. The operator cannot tell a model's class from its name, so it does
  not refuse them (docs/backends.md).
- Startup in the log (``startup()``): each GPU worker logs "Model loading took %s GiB memory and %.6f seconds"
  (``v1/worker/gpu_model_runner.py`` ``load_model``, ``v1/worker/gpu/model_runner.py``), and each engine core "init
  engine (profile, create kv cache, warmup model) took %.2f s", with " (compilation: %.2f s" after it when anything was
  compiled, the encoder's share spelled out after a dash when it compiled too (``v1/engine/core.py``
  ``_initialize_kv_caches``), each line as the logger writes it, ``[file.py:line] message``. Workers and engines
  start side by side, so the slowest counts. Only the log before the API server's "Starting vLLM server on"
  (``entrypoints/launchers/api_server/entry.py``, logged once the engine is up, whatever uvicorn's log level) is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from mmfleet.api import Attention, EncodeTierSpec, MultimodalInference, MultimodalSpec, ProcessorCacheSpec
from mmfleet.backends import EcRole, HostExtra, MetricNames, OwnedFlag, ServerContext, ServerStartup, otel_env

VERSION = "0.33.0"
IMAGE = f"vllm/vllm-openai:v{VERSION}"

# Schemes vLLM 0.33 streams with Run:ai (transformers_utils/runai_utils.py SUPPORTED_SCHEMES).
STREAMED_SCHEMES: tuple[str, ...] = ("s3://", "gs://", "az://")
# Object stores reached through their S3-compatible API; rewritten to s3:// for vLLM.
S3_COMPATIBLE_SCHEMES: tuple[str, ...] = ("oss://",)
# The image's built-in non-root user: vllm-project/vllm docker/entrypoints/vllm-nonroot-entrypoint.sh
# (@2cfa5c32): "The image also ships a `vllm` user (UID 2000, GID 0) with HOME /home/vllm" (also
# docs/deployment/docker.md). Pods run the upstream image as that user; mmfleet builds no vLLM image.
IMAGE_UID = 2000
# An encode tier's sidecar measures the latency clients see, from a request's arrival at the pod (the server's own
# histograms start after the encode tier), and exports these histograms beside the server's (mmfleet.encode_proxy,
# which names them too: it imports nothing of the operator).
FRONT_DOOR_E2E = "mmfleet_front_door_e2e_request_latency_seconds"
FRONT_DOOR_TTFT = "mmfleet_front_door_time_to_first_token_seconds"
# And it times what a request with items waits for the encode tier, counts the items sent and the calls that failed:
# that tier's autoscaling signals.
ENCODE_CALL = "mmfleet_encode_call_seconds"
ENCODE_ITEMS = "mmfleet_encode_items_total"
ENCODE_FAILURES = "mmfleet_encode_failures_total"

# Flags per backend.attention. auto lets vLLM pick (FA3 on Hopper, v1/attention/backends/fa_utils.py).
_ATTENTION: dict[Attention, tuple[str, ...]] = {
    "auto": (),
    "flash-attn-3": ("--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version", "3"),
    "flash-attn-2": ("--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version", "2"),
    "flashinfer": ("--attention-backend", "FLASHINFER"),
    "triton": ("--attention-backend", "TRITON_ATTN"),
}


def vllm_model_ref(model_ref: str) -> str:
    """The model argument vLLM understands: S3-compatible stores become s3://."""
    for scheme in S3_COMPATIBLE_SCHEMES:
        if model_ref.startswith(scheme):
            return "s3://" + model_ref[len(scheme) :]
    return model_ref


# Histograms from each request's arrival in the API server (before its images are loaded and processed) to its first
# token, and of its engine phases before it, WAITING and the prefill (v1/metrics/loggers.py, timed in
# v1/metrics/stats.py): what is left is time outside the engine.
TTFT = "vllm:time_to_first_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
# Histograms of each request's prompt and output tokens, observed as it finishes (v1/metrics/loggers.py, from
# FinishedRequestStats): their _sum over their _count over a window is the mix of the requests that finished in it.
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"


class VllmBackend:
    """vLLM 0.33.0 (the OpenAI-compatible server)."""

    name = "vllm"
    version = VERSION
    image = IMAGE
    port = 8000
    metrics_path = "/metrics"
    health_path = "/health"  # 503 once the engine is dead (entrypoints/serve/instrumentator/health.py)
    run_as_user: int | None = IMAGE_UID
    writable_paths: tuple[str, ...] = ()
    start_in_log = True
    metrics = MetricNames(
        e2e="vllm:e2e_request_latency_seconds",
        ttft=TTFT,
        itl="vllm:inter_token_latency_seconds",
        requests_finished="vllm:request_success_total",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_cache_usage="vllm:kv_cache_usage_perc",
        model_label="model_name",
        front_door_e2e=FRONT_DOOR_E2E,
        front_door_ttft=FRONT_DOOR_TTFT,
        encode_call=ENCODE_CALL,
        encode_items=ENCODE_ITEMS,
        encode_failures=ENCODE_FAILURES,
    )
    owned_flags: tuple[OwnedFlag, ...] = (
        OwnedFlag("--model", "model.source"),
        OwnedFlag("--host", "service"),
        OwnedFlag("--port", "service"),
        OwnedFlag("--served-model-name", "model.servedName"),
        OwnedFlag("--tensor-parallel-size", "parallelism.tensor", aliases=("-tp",)),
        OwnedFlag("--pipeline-parallel-size", "parallelism.pipeline", aliases=("-pp",)),
        OwnedFlag("--max-model-len", "backend.maxModelLen"),
        OwnedFlag("--max-num-seqs", "backend.maxNumSeqs"),
        OwnedFlag("--max-num-batched-tokens", "backend.maxNumBatchedTokens"),
        OwnedFlag("--enable-chunked-prefill", "backend.chunkedPrefill"),
        OwnedFlag("--gpu-memory-utilization", "backend.gpuMemoryUtilization", aliases=("--device-memory-utilization",)),
        OwnedFlag("--kv-cache-dtype", "backend.kvCacheDtype"),
        OwnedFlag("--download-dir", "modelCache"),
        OwnedFlag("--load-format", "model.source"),
        OwnedFlag("--limit-mm-per-prompt", "multimodal.limitPerPrompt"),
        OwnedFlag("--mm-processor-cache-gb", "multimodal.processorCache.sizeGiB"),
        OwnedFlag("--mm-processor-cache-type", "multimodal.processorCache.type"),
        OwnedFlag("--mm-encoder-tp-mode", "multimodal.encoderTensorParallel"),
        OwnedFlag("--api-server-count", "multimodal.apiServers", aliases=("-asc",)),
        OwnedFlag("--attention-backend", "backend.attention"),
        OwnedFlag("--attention-config", "backend.attention", aliases=("-ac",)),
        OwnedFlag("--otlp-traces-endpoint", "tracing.endpoint"),
        # Not a flag mmfleet sets, but one that would switch off every vllm:* series the
        # autoscaler and the drain hook read (v1/engine/async_llm.py).
        OwnedFlag(
            "--disable-log-stats",
            "autoscaling",
            reason="it removes every vllm:* metric, which autoscaling and the drain hook read",
        ),
        OwnedFlag("--shutdown-timeout", "(drain)", reason="mmfleet sets it to match the pod's grace period"),
        # Each replica holds tensor x pipeline GPUs (spec.gpu.count): a data-parallel rank more would find no GPU of
        # its own, and it would start one API server per rank (entrypoints/cli/serve.py), which the processor cache's
        # accounting and the shm rule do not count.
        OwnedFlag(
            "--data-parallel-size",
            "replicas",
            aliases=("-dp",),
            reason="each replica is one data-parallel rank of tensor x pipeline GPUs (spec.gpu.count); scale with "
            "spec.replicas or autoscaling instead",
        ),
        OwnedFlag("--enable-sleep-mode", "autoscaling.warmStandby"),
        OwnedFlag("--ec-transfer-config", "disaggregation.encode"),
        OwnedFlag("--mm-encoder-only", "disaggregation.encode"),
        # Secrets: an argument is stored in plain text in this resource, the pod spec and kopf's annotations.
        # --api-key (entrypoints/common/cli_args.py) yields to nothing; VLLM_API_KEY is read only without it
        # (entrypoints/serve/middleware/register.py). --hf-token is the model's (engine/arg_utils.py).
        OwnedFlag(
            "--api-key",
            "apiKeySecret",
            reason="a key on the command line is stored in plain text in this resource, the pod spec and kopf's "
            "annotations; put it in a Secret and set spec.apiKeySecret",
        ),
        OwnedFlag(
            "--hf-token",
            "model.credentialsSecret",
            reason="a token on the command line is stored in plain text in this resource, the pod spec and kopf's "
            "annotations; put HF_TOKEN in the Secret named by spec.model.credentialsSecret",
        ),
    )

    def command(self, ctx: ServerContext) -> list[str]:
        spec = ctx.inference.spec
        engine = spec.backend
        model = vllm_model_ref(ctx.model_ref)
        encode = spec.disaggregation.encode
        # An encode replica runs the encoder alone, split over its own GPUs.
        producer = ctx.ec_role == "ec_producer" and encode is not None
        tensor, pipeline = (
            (encode.gpu.count, 1) if producer and encode else (spec.tensor_parallel, spec.parallelism.pipeline)
        )
        args = [
            "vllm", "serve", model,
            "--host", "0.0.0.0",
            "--port", str(ctx.port),
            "--served-model-name", ctx.inference.served_name,
            "--tensor-parallel-size", str(tensor),
            "--pipeline-parallel-size", str(pipeline),
            "--max-model-len", str(engine.max_model_len),
            "--max-num-seqs", str(engine.max_num_seqs),
            "--max-num-batched-tokens", str(engine.max_num_batched_tokens),
            "--enable-chunked-prefill" if engine.chunked_prefill else "--no-enable-chunked-prefill",
            "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
            "--kv-cache-dtype", engine.kv_cache_dtype,
            "--download-dir", ctx.download_dir,
        ]  # fmt: skip
        if model.startswith(STREAMED_SCHEMES):
            args += ["--load-format", "runai_streamer"]
        args += _multimodal_args(spec.multimodal)
        args += _ATTENTION[engine.attention]
        if ctx.tracing_endpoint:
            args += ["--otlp-traces-endpoint", ctx.tracing_endpoint]
        if spec.standby is not None and not producer:
            args.append("--enable-sleep-mode")
        if ctx.ec_role is not None and encode is not None:
            args += ["--ec-transfer-config", ec_transfer_config(ctx.ec_role, encode)]
            return [*EC_FRESH_REGION, *args]
        return args

    def env(self, ctx: ServerContext) -> list[dict[str, object]]:
        env: list[dict[str, object]] = [
            # Tokenizer, processor and config files land here; the weights go to --download-dir.
            {"name": "HF_HOME", "value": f"{ctx.cache_dir}/huggingface"},
            # getpass.getuser() reads USER before the passwd lookup that fails for a UID the image
            # does not list (docker/entrypoints/vllm-nonroot-entrypoint.sh does the same).
            {"name": "USER", "value": "vllm"},
        ]
        if ctx.inference.spec.standby is not None and ctx.ec_role != "ec_producer":
            # /sleep and /wake_up are mounted only in development mode (see the module docstring, "Sleep mode").
            env.append({"name": "VLLM_SERVER_DEV_MODE", "value": "1"})
        if ctx.ec_role is not None:
            # The ECCPUConnector runs on the V2 model runner only (module docstring, "Encoder disaggregation").
            env.append({"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"})
        if ctx.ec_role == "ec_producer":
            # Bound and announced to the serving pods as peer_host: the pod's own address.
            env.append({"name": "VLLM_EC_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
            env.append({"name": "VLLM_EC_SIDE_CHANNEL_PORT", "value": str(EC_SIDE_CHANNEL_PORT)})
        key = ctx.inference.spec.api_key_secret
        if key is not None:
            # Read by the server only when no --api-key is given (entrypoints/serve/middleware/register.py).
            env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": key.name, "key": key.key}}})
        if ctx.shared_cache_dir:
            # torch.compile artifacts go to $VLLM_CACHE_ROOT/torch_compile_cache/<hash of config, env,
            # traced source and compiler> (compilation/backends.py, decorators.py), so replicas of one
            # spec share them and a changed spec gets a new directory.
            env.append({"name": "VLLM_CACHE_ROOT", "value": f"{ctx.shared_cache_dir}/vllm"})
        if ctx.tracing_endpoint:
            # vLLM passes no sampler to TracerProvider, so the SDK takes it from these
            # (tracing/otel.py; opentelemetry/sdk/trace/sampling.py).
            env += otel_env(ctx)
            # The engine core started by fork keeps the parent's tracer provider, whose export thread
            # died in the fork, and its spans are lost (see the module docstring, "Tracing"); spawned,
            # it builds its own from OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, which init_tracer exported.
            env.append({"name": "VLLM_WORKER_MULTIPROC_METHOD", "value": "spawn"})
        return env

    def config_files(self, ctx: ServerContext) -> dict[str, str]:
        return {}

    def drain_args(self, seconds: int) -> list[str]:
        """Let in-flight requests finish for up to ``seconds`` after SIGTERM (0 aborts them)."""
        return ["--shutdown-timeout", str(seconds)]

    def host_extra(self, inference: MultimodalInference, ec_role: EcRole | None = None) -> HostExtra:
        spec = inference.spec
        multimodal = spec.multimodal
        servers = multimodal.api_servers or 1
        in_processes, in_shm = processor_cache_gib(multimodal)
        encode = spec.disaggregation.encode
        outputs = encode.cache_gi_b if encode is not None else 0.0  # the connector's region, in /dev/shm on both tiers
        # An encode replica preprocesses for as many serving replicas as there can be, shared by the encode tier.
        share = 1.0
        if ec_role == "ec_producer" and encode is not None:
            serving = spec.autoscaling.max_replicas if spec.autoscaled and spec.autoscaling else spec.replicas
            share = max(1, serving) / encode.replicas
        # The extra API server processes' cores are there to preprocess too: counted once.
        cpu = max(servers - 1, preprocessing_cores(multimodal) * share)
        return HostExtra(max(0.0, in_processes - DEFAULT_CACHE_GIB), in_shm + outputs, cpu)

    def startup(self, log: str) -> ServerStartup:
        start = log.split(_SERVING, 1)[0]  # what clients sent afterwards (a logged prompt, say) is not read
        engines = _ENGINE_READY.findall(start)
        return ServerStartup(
            weights=_slowest(_WEIGHTS_LOADED.findall(start)),
            engine=_slowest(engine for engine, _ in engines),
            compile=_slowest(compiled for _, compiled in engines if compiled),
        )


# The producer's side channel (envs.py VLLM_EC_SIDE_CHANNEL_PORT's default), which consumers connect to.
EC_SIDE_CHANNEL_PORT = 5601
EC_CONNECTOR = "ECCPUConnector"
# The connector maps /dev/shm/vllm_ec_<instance>.mmap, its instance id random per start (config/vllm.py instance_id,
# cpu/common.py, cpu/ec_shared_region.py), and only a clean shutdown unlinks it. The pod's /dev/shm outlives a
# container restart, so a server killed (OOM, a crash) and restarted would map a second region beside the dead one's,
# twice cacheGiB in a volume and a memory limit sized for one: the container removes them before vLLM starts (only
# its own server maps regions there).
EC_FRESH_REGION = ("/bin/sh", "-c", 'rm -f /dev/shm/vllm_ec_*.mmap; exec "$0" "$@"')


def serve_argv(command: list[str]) -> list[str]:
    """vLLM's own command line in a container's command: without the removal of stale regions in front."""
    fresh = list(EC_FRESH_REGION)
    return command[len(fresh) :] if command[: len(fresh)] == fresh else command


def ec_transfer_config(role: EcRole, encode: EncodeTierSpec) -> str:
    """``--ec-transfer-config``: the CPU connector, its region's size and NIXL between pods (module docstring)."""
    extra = {"ec_cpu_bytes": int(encode.cache_gi_b * 2**30), "ec_enable_nixl": True}
    config = {"ec_connector": EC_CONNECTOR, "ec_role": role, "ec_connector_extra_config": extra}
    return json.dumps(config, separators=(",", ":"))


def _multimodal_args(multimodal: MultimodalSpec) -> list[str]:
    args: list[str] = []
    limits = _limits(multimodal)
    if limits:
        args += ["--limit-mm-per-prompt", json.dumps(limits, separators=(",", ":"))]
    cache = multimodal.processor_cache
    if cache is not None and cache.size_gi_b is not None:
        args += ["--mm-processor-cache-gb", repr(cache.size_gi_b)]
    if cache is not None and cache.type is not None:
        args += ["--mm-processor-cache-type", cache.type]
    if multimodal.encoder_tensor_parallel is not None:
        args += ["--mm-encoder-tp-mode", multimodal.encoder_tensor_parallel]
    if multimodal.api_servers is not None:
        args += ["--api-server-count", str(multimodal.api_servers)]
    return args


def _limits(multimodal: MultimodalSpec) -> dict[str, int | dict[str, int]]:
    """--limit-mm-per-prompt's mixed form: a modality's count alone, or its count (if set) with the largest item's
    size under vLLM's names (config/multimodal.py ``ImageDummyOptions``, ``VideoDummyOptions``,
    ``AudioDummyOptions``)."""
    counts: dict[str, int] = (
        multimodal.limit_per_prompt.model_dump(exclude_none=True) if multimodal.limit_per_prompt else {}
    )
    largest = multimodal.largest_item
    sizes: dict[str, dict[str, int]] = largest.model_dump(exclude_none=True) if largest else {}
    limits: dict[str, int | dict[str, int]] = dict(counts)
    for modality, size in sizes.items():
        options = {_SIZE_NAMES.get(name, name): value for name, value in size.items()}
        if options:
            limits[modality] = {"count": counts[modality], **options} if modality in counts else options
    return limits


_SIZE_NAMES = {"frames": "num_frames"}
# vLLM's default processor cache, 4 GiB (config/multimodal.py mm_processor_cache_gb), lru, its data in the engine:
# the default memory per GPU (render.MEMORY_GI_PER_GPU) already holds it.
DEFAULT_CACHE_GIB = 4.0


def processor_cache_gib(multimodal: MultimodalSpec) -> tuple[float, float]:
    """GiB the processor cache's data takes in the server's processes and in /dev/shm (multimodal/cache/factories.py,
    lru.py, shm.py): with one API server process, lru keeps the data in the engine (the API server only the items'
    metadata) and shm in one shared buffer in /dev/shm; with more, each API server process keeps a whole cache of its
    own and the engine none ("processor_only")."""
    cache = multimodal.processor_cache or ProcessorCacheSpec()
    size = DEFAULT_CACHE_GIB if cache.size_gi_b is None else cache.size_gi_b
    servers = multimodal.api_servers or 1
    if servers > 1:
        return size * servers, 0.0
    if cache.type == "shm":
        return 0.0, size
    return size, 0.0


# One image's decoding (base64, PIL open and RGB) and preprocessing (the Hugging Face processor with the prompt), on one
# core of the calibration's H200 host, p50, for PNG, the dearer of the two formats measured
# (../shared/calibration/real-vllm-h200-mm/preprocess_cpu.csv, copied to tests/data): 10.7 ms at 448x448 (0.20
# megapixels), 40.5 ms at 1280x720 (0.92): a line through both. Both tiers of an encode tier pay it (the serving
# replicas still build each prompt's placeholders from the image).
PREPROCESS_MS = 2.4
PREPROCESS_MS_PER_MEGAPIXEL = 41.4
DEFAULT_IMAGE = (1280, 720)  # width, height: without largestItem.image
# The cores are sized to be at most half busy, so an image seldom waits for one.
PREPROCESS_BUSY = 0.5


def preprocessing_ms(pixels: int) -> float:
    return PREPROCESS_MS + PREPROCESS_MS_PER_MEGAPIXEL * pixels / 1e6


def preprocessing_cores(multimodal: MultimodalSpec) -> float:
    """The cores decoding and preprocessing ``images_per_second`` images of the largest image's size take, at most
    half busy; 0 without a rate."""
    if multimodal.images_per_second is None:
        return 0.0
    image = multimodal.largest_item.image if multimodal.largest_item is not None else None
    width = image.width if image is not None and image.width is not None else DEFAULT_IMAGE[0]
    height = image.height if image is not None and image.height is not None else DEFAULT_IMAGE[1]
    return multimodal.images_per_second * preprocessing_ms(width * height) / 1000 / PREPROCESS_BUSY


# The lines as vLLM's logger writes them, "[file.py:line] message", so that only its own lines match.
_WEIGHTS_LOADED = re.compile(
    r"\[(?:gpu_)?model_runner\.py:\d+\] Model loading took \S+ GiB memory and (\d+\.\d+) seconds"
)
_ENGINE_READY = re.compile(
    r"\[core\.py:\d+\] init engine \(profile, create kv cache, warmup model\) took (\d+\.\d+) s"
    r"(?: \(compilation: (\d+\.\d+) s)?"
)
_SERVING = "Starting vLLM server on"  # the API server's, once the engine is up and before it serves


def _slowest(seconds: Iterable[str]) -> float | None:
    return max((float(s) for s in seconds), default=None)


BACKEND = VllmBackend()
