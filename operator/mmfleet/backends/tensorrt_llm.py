"""TensorRT-LLM 1.3.0rc29: how mmfleet starts ``trtllm-serve`` on the PyTorch backend and what it reads back.

Why this pin. The newest stable release, 1.2.1, cannot feed the autoscaler, as far as merge dates tell
(its tag could not be read): its Prometheus collector has no ``trtllm_num_requests_running``/``_waiting``
(added by NVIDIA/TensorRT-LLM#12545, spring 2026, which also stopped hard-coding the ``model_name`` label to
``"undefined"``), no ``trtllm_kv_cache_utilization`` (#11243, Feb 2026), and no ``--served_model_name``
(#11711, Feb 2026). All three landed on ``main`` after ``release/1.2`` was cut, and the 1.3.0rcN
pre-releases are cut from ``main``. 1.3.0rc29 is the newest release with both a PyPI version
(``pip index versions tensorrt-llm --pre``) and an NGC image seen in use.
PyPI also lists 1.4.0rc0/rc1, but no ``release:1.4.0rc*`` image turned up anywhere, so we stay on 1.3.
Neither tag's own files could be read here (``docs/backends.md``, "Not re-pinned", lists every way that was
tried), so each fact below was read in the upstream file named, in the older copy cited and/or in a
mid-2026 ``main`` copy (the index gave no commit for some of those). A feature merged before rc29 was cut
and still present on that ``main`` is taken to be in the pin.

- Image ``nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc29``. The ``release:x.y.z`` naming comes from
  ``docs/source/installation/containers.md`` (@20c5f48b). That page's ``make`` targets offer
  ``LOCAL_USER=1`` "to switch to the local user account instead of root inside the container", so the
  image runs as root and ships no user of its own. Pods run it as UID 1000 anyway (``RUN_AS_USER``), so they pass
  Pod Security "restricted": HOME is the cache volume, ``/tmp`` (where MPI, which multi-GPU runs go through, keeps
  its session files) is an emptyDir, and ``USER`` is set because the UID is not in the image's ``/etc/passwd``.
- CLI (click), read in NVIDIA's own ``tensorrt_llm/commands/serve.py`` @00209af1 (NVIDIA/TensorRT-LLM, read by
  commit; the older @4c05a748 has only the short parallel names and no ``--config`` or ``--otlp_traces_endpoint``).
  The group resolves any first argument that is not a subcommand to ``serve``. We still write ``serve``, so
  that a model called ``grpc`` or ``disaggregated`` is never taken for a subcommand. The options, as rendered, all
  spelled so in @00209af1:
  ``--host`` (default localhost, so we bind 0.0.0.0), ``--port``, ``--backend {pytorch,...}``,
  ``--tensor_parallel_size/--tp_size``, ``--pipeline_parallel_size/--pp_size``, ``--max_batch_size``,
  ``--max_num_tokens``, ``--max_seq_len``, ``--free_gpu_memory_fraction/--kv_cache_free_gpu_memory_fraction``
  (the share of memory left *after* weights that goes to the KV cache), ``--config/--extra_llm_api_options``
  (a YAML file of LLM-API args), ``--otlp_traces_endpoint`` ("Target URL to which OpenTelemetry traces will be
  sent") and ``--enable_chunked_prefill`` (a flag that defaults to False). Newer than @00209af1:
  ``--served_model_name``, added by NVIDIA/TensorRT-LLM#11711 (Feb 2026) and listed with that spelling in NVIDIA's
  1.3.0rc7 docs (``commands/trtllm-serve/trtllm-serve.html``, Syntax), which ``launch_server`` passes as
  ``OpenAIServer(model=served_model_name or model)`` (read in ``main``, no commit given); and ``--kv_cache_dtype``
  (``main`` only).
- The YAML is merged with ``llm_args | llm_args_dict`` (``llmapi/llm_utils.py``
  ``update_llm_args_with_extra_dict``). The merge is shallow, so a ``kv_cache_config`` in the file
  replaces the one the CLI built from ``--kv_cache_free_gpu_memory_fraction``. That is why the fraction is
  repeated inside the file whenever the file sets ``kv_cache_config.dtype``. The fields come from
  ``llmapi/llm_args.py``: ``KvCacheConfig.dtype: str = "auto"`` ("only for the Pytorch backend"),
  ``return_perf_metrics: bool = False`` and ``enable_iter_perf_stats: bool = False``.
- Metrics (``serve/openai_server.py`` @00057725). ``register_routes`` calls ``mount_metrics``, which mounts the
  prometheus_client app at ``/prometheus/metrics``, only ``if self.generator.args.return_perf_metrics``, and the
  ``MetricsCollector`` exists only under the same condition. ``/metrics`` is JSON iteration stats, not Prometheus.
  The iteration gauges (running, waiting, KV utilization) are fed by a loop that starts only when
  ``enable_iter_perf_stats`` is also set. In @00057725 the collector's labels are still hard-coded
  ``"undefined"``; #12545 made them ``{"model_name": self.model, "engine_type": args.backend}`` (``main``), so
  ``model_name`` carries the served name. ``GET /health`` returns 200 once the app is up, which is after the
  model has loaded. Names come from ``metrics/collector.py`` (@050f80de, ``metric_prefix = "trtllm_"``, which also
  defines ``trtllm_num_requests_running``/``_waiting`` and ``trtllm_kv_cache_utilization``).
  ``trtllm_request_success_total`` is a Counter. ``trtllm_time_per_output_token_seconds`` is each request's
  mean TPOT, so our "itl" here is a per-request average, unlike vLLM's per-token inter-token latency.
- Shared cache: the LLM API downloads HF checkpoints through huggingface_hub, so ``HF_HOME`` on the shared
  claim is all a new replica needs to skip the download. There is no compile cache to share: mmfleet sets no
  ``torch_compile_config``, and its default is None (``llmapi/llm_args.py``, read in the code index, whose
  hit did not report the commit), so nothing is torch.compiled at startup.
- Tracing: ``llmapi/tracing.py`` (@0fb7f758) builds ``TracerProvider()`` with no sampler or resource. The
  OTel SDK then reads ``OTEL_TRACES_SAMPLER``/``_ARG``, and its default ``Resource.create({})`` reads
  ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. ``init_tracer`` runs once, in the OpenAI server's
  process, where the request spans (``trace_span``) are made. The exporter protocol comes
  from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (grpc by default), and the exporter gets only ``endpoint=``,
  so unlike vLLM it is not forced insecure. ``OTEL_EXPORTER_OTLP_TRACES_INSECURE=true`` keeps a scheme-less
  collector address in plaintext. An ``https://`` endpoint stays TLS either way, because the SDK's gRPC
  exporter resets ``insecure`` for that scheme. ``requirements.txt`` (@000867d9) does not list
  opentelemetry, and ``init_tracer`` raises when it is missing, so the image must carry the OTel SDK before
  tracing is turned on.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import yaml

from mmfleet.api import MultimodalInference
from mmfleet.backends import EcRole, HostExtra, MetricNames, OwnedFlag, ServerContext, ServerStartup, otel_env

VERSION = "1.3.0rc29"
IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{VERSION}"
# The LLM-API options file handed to --config, mounted at ctx.config_dir.
CONFIG_FILE = "llm-api-options.yaml"
# The pods' UID: the image has none of its own; any non-zero one does, and 1000 is the first a distribution hands out.
RUN_AS_USER = 1000


class TensorRtLlmBackend:
    """TensorRT-LLM 1.3.0rc29, ``trtllm-serve`` on the PyTorch backend (HF checkpoints, no engine build)."""

    name = "tensorrt-llm"
    version = VERSION
    image = IMAGE
    port = 8000
    metrics_path = "/prometheus/metrics"
    health_path = "/health"
    # The NGC image has no non-root user of its own (containers.md); see the module docstring.
    run_as_user: int | None = RUN_AS_USER
    writable_paths: tuple[str, ...] = ("/tmp",)
    start_in_log = False
    metrics = MetricNames(
        e2e="trtllm_e2e_request_latency_seconds",
        ttft="trtllm_time_to_first_token_seconds",
        itl="trtllm_time_per_output_token_seconds",
        requests_finished="trtllm_request_success_total",
        running="trtllm_num_requests_running",
        waiting="trtllm_num_requests_waiting",
        kv_cache_usage="trtllm_kv_cache_utilization",
        model_label="model_name",
    )
    owned_flags: tuple[OwnedFlag, ...] = (
        OwnedFlag("--host", "service"),
        OwnedFlag("--port", "service"),
        OwnedFlag("--backend", "backend.name", reason="mmfleet runs trtllm-serve on its PyTorch backend only"),
        OwnedFlag("--served_model_name", "model.servedName"),
        OwnedFlag("--tp_size", "parallelism.tensor", aliases=("--tensor_parallel_size",)),
        OwnedFlag("--pp_size", "parallelism.pipeline", aliases=("--pipeline_parallel_size",)),
        OwnedFlag("--max_batch_size", "backend.maxNumSeqs"),
        OwnedFlag("--max_num_tokens", "backend.maxNumBatchedTokens"),
        OwnedFlag("--max_seq_len", "backend.maxModelLen"),
        OwnedFlag(
            "--kv_cache_free_gpu_memory_fraction",
            "backend.gpuMemoryUtilization",
            aliases=("--free_gpu_memory_fraction",),
        ),
        # Not emitted: the dtype goes in the options file, and with kvCacheDtype auto this would bypass it.
        OwnedFlag(
            "--kv_cache_dtype",
            "backend.kvCacheDtype",
            reason="the KV cache dtype goes in the generated options file; set spec.backend.kvCacheDtype",
        ),
        OwnedFlag("--enable_chunked_prefill", "backend.chunkedPrefill"),
        OwnedFlag(
            "--config",
            "backend",
            aliases=("--extra_llm_api_options",),
            reason="mmfleet generates the LLM-API options file from spec.backend; a second one would replace it",
        ),
        OwnedFlag("--otlp_traces_endpoint", "tracing.endpoint"),
        # Not emitted, but it would swap the OpenAI HTTP API for a gRPC server.
        OwnedFlag(
            "--grpc",
            "service",
            reason="it replaces the OpenAI HTTP API, /health and /prometheus/metrics with a gRPC server",
        ),
    )

    def command(self, ctx: ServerContext) -> list[str]:
        spec = ctx.inference.spec
        engine = spec.backend
        args = [
            "trtllm-serve", "serve", ctx.model_ref,
            "--host", "0.0.0.0",
            "--port", str(ctx.port),
            "--backend", "pytorch",
            "--served_model_name", ctx.inference.served_name,
            "--tp_size", str(spec.tensor_parallel),
            "--pp_size", str(spec.parallelism.pipeline),
            "--max_batch_size", str(engine.max_num_seqs),
            "--max_num_tokens", str(engine.max_num_batched_tokens),
            "--max_seq_len", str(engine.max_model_len),
            "--kv_cache_free_gpu_memory_fraction", str(engine.gpu_memory_utilization),
            "--config", str(PurePosixPath(ctx.config_dir) / CONFIG_FILE),
        ]  # fmt: skip
        if engine.chunked_prefill:
            args.append("--enable_chunked_prefill")
        if ctx.tracing_endpoint:
            args += ["--otlp_traces_endpoint", ctx.tracing_endpoint]
        return args

    def env(self, ctx: ServerContext) -> list[dict[str, object]]:
        # The LLM API downloads HF checkpoints through huggingface_hub, so weights land under HF_HOME too.
        env: list[dict[str, object]] = [
            {"name": "HF_HOME", "value": f"{ctx.cache_dir}/huggingface"},
            # getpass.getuser() falls back to a passwd lookup that fails for a UID the image does not list.
            {"name": "USER", "value": "trtllm"},
        ]
        if ctx.tracing_endpoint:
            # TensorRT-LLM passes no sampler, resource or TLS choice to the SDK (llmapi/tracing.py), so
            # these decide them.
            env += otel_env(ctx)
            env.append({"name": "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "value": "true"})
        return env

    def llm_api_options(self, ctx: ServerContext) -> dict[str, Any]:
        """The LLM-API args the --config file sets, as data."""
        engine = ctx.inference.spec.backend
        options: dict[str, Any] = {
            # Without it no MetricsCollector exists and /prometheus/metrics is never mounted.
            "return_perf_metrics": True,
            # Feeds the running/waiting/KV-utilization gauges the autoscaler and the drain hook read.
            "enable_iter_perf_stats": True,
        }
        if engine.kv_cache_dtype != "auto":
            # The shallow merge replaces the CLI's kv_cache_config, so the fraction must be repeated here.
            options["kv_cache_config"] = {
                "dtype": engine.kv_cache_dtype,
                "free_gpu_memory_fraction": engine.gpu_memory_utilization,
            }
        return options

    def config_files(self, ctx: ServerContext) -> dict[str, str]:
        # Sorted keys: the same spec always renders the same ConfigMap, so applying it is a no-op.
        return {CONFIG_FILE: yaml.safe_dump(self.llm_api_options(ctx), sort_keys=True, default_flow_style=False)}

    def drain_args(self, seconds: int) -> list[str]:
        """None: trtllm-serve has no drain-on-SIGTERM flag; the preStop hook waits on the metrics instead."""
        return []

    def host_extra(self, inference: MultimodalInference, ec_role: EcRole | None = None) -> HostExtra:
        """Nothing: no setting of this backend holds host memory beyond the defaults."""
        return HostExtra()

    def startup(self, log: str) -> ServerStartup:
        """Not read (``start_in_log``): the container's time to Ready stays one phase."""
        return ServerStartup()


BACKEND = TensorRtLlmBackend()
