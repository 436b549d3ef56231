"""TensorRT-LLM backend: the trtllm-serve line, the LLM-API options file, env, metrics and owned flags."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mmfleet import backends
from mmfleet.api import MultimodalInference
from mmfleet.backends import ServerContext, clashes, latency_quantile_promql
from mmfleet.backends.tensorrt_llm import BACKEND, CONFIG_FILE
from tests.helpers.repo import spec_doc

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
CONFIG_DIR = "/etc/mmfleet"


def context(tracing_endpoint: str | None = None, **spec: Any) -> ServerContext:
    """A server context for a tensorrt-llm spec; ``backend`` keys are merged over the backend name."""
    spec["backend"] = {"name": "tensorrt-llm", **spec.get("backend", {})}
    return ServerContext(
        inference=MultimodalInference.model_validate(spec_doc(**spec)),
        model_ref=MODEL,
        port=8000,
        config_dir=CONFIG_DIR,
        tracing_endpoint=tracing_endpoint,
        cache_dir="/cache",
        download_dir="/cache/models",
        shared_cache_dir=None,
    )


def flags(ctx: ServerContext) -> dict[str, str]:
    """Each --flag after the model with its value (bare switches map to '')."""
    args = BACKEND.command(ctx)[3:]
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[arg] = "" if nxt.startswith("--") else nxt
    return out


def env(ctx: ServerContext) -> dict[str, object]:
    return {str(e["name"]): e.get("value", e.get("valueFrom")) for e in BACKEND.env(ctx)}


def options(ctx: ServerContext) -> dict[str, Any]:
    files = BACKEND.config_files(ctx)
    assert list(files) == [CONFIG_FILE]
    doc: dict[str, Any] = yaml.safe_load(files[CONFIG_FILE])
    return doc


def test_registered_under_its_spec_name() -> None:
    assert backends.get("tensorrt-llm") is BACKEND
    assert BACKEND.name == "tensorrt-llm"


def test_pinned_image_matches_the_version() -> None:
    assert BACKEND.version == "1.3.0rc29"
    assert BACKEND.image == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc29"


def test_endpoints_and_user() -> None:
    assert (BACKEND.port, BACKEND.metrics_path, BACKEND.health_path) == (8000, "/prometheus/metrics", "/health")
    assert BACKEND.run_as_user == 1000
    assert BACKEND.drain_args(30) == []


def test_command_runs_the_serve_subcommand_with_the_model_positional() -> None:
    assert BACKEND.command(context())[:3] == ["trtllm-serve", "serve", MODEL]


def test_every_value_is_a_string_for_the_pod_spec() -> None:
    assert all(isinstance(a, str) for a in BACKEND.command(context()))


def test_server_listens_on_all_interfaces_on_pytorch_under_the_served_name() -> None:
    f = flags(context(model={"name": MODEL, "servedName": "vl"}))
    assert (f["--host"], f["--port"], f["--backend"], f["--served_model_name"]) == ("0.0.0.0", "8000", "pytorch", "vl")
    # Without servedName, clients and the model_name label use metadata.name.
    assert flags(context())["--served_model_name"] == "qwen"


def test_parallelism_defaults_to_all_gpus_in_tensor() -> None:
    f = flags(context(gpu={"count": 4}))
    assert (f["--tp_size"], f["--pp_size"]) == ("4", "1")


def test_parallelism_splits_tensor_and_pipeline() -> None:
    f = flags(context(gpu={"count": 8}, parallelism={"tensor": 4, "pipeline": 2}))
    assert (f["--tp_size"], f["--pp_size"]) == ("4", "2")


def test_engine_settings_map_to_trtllm_names() -> None:
    f = flags(
        context(
            backend={
                "maxModelLen": 32768,
                "maxNumSeqs": 64,
                "maxNumBatchedTokens": 16384,
                "gpuMemoryUtilization": 0.85,
            }
        )
    )
    assert f["--max_batch_size"] == "64"
    assert f["--max_num_tokens"] == "16384"
    assert f["--max_seq_len"] == "32768"
    assert f["--kv_cache_free_gpu_memory_fraction"] == "0.85"


def test_defaults_are_passed_explicitly() -> None:
    # trtllm-serve's own defaults moved between releases (max_batch_size 2048 on main), so every one is set.
    f = flags(context())
    assert (f["--max_batch_size"], f["--max_num_tokens"], f["--max_seq_len"]) == ("128", "4096", "8192")
    assert f["--kv_cache_free_gpu_memory_fraction"] == "0.9"


def test_chunked_prefill_is_a_bare_switch_only_when_on() -> None:
    on = BACKEND.command(context())
    assert on.count("--enable_chunked_prefill") == 1
    assert flags(context())["--enable_chunked_prefill"] == ""
    assert "--enable_chunked_prefill" not in BACKEND.command(context(backend={"chunkedPrefill": False}))


def test_config_flag_points_at_the_rendered_file() -> None:
    ctx = context()
    assert flags(ctx)["--config"] == f"{CONFIG_DIR}/{CONFIG_FILE}"
    assert set(BACKEND.config_files(ctx)) == {CONFIG_FILE}
    assert "--extra_llm_api_options" not in BACKEND.command(ctx)


def test_options_turn_on_prometheus_metrics_and_iteration_stats() -> None:
    assert options(context()) == {"return_perf_metrics": True, "enable_iter_perf_stats": True}


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_kv_cache_dtype_goes_in_the_file_with_the_memory_fraction(dtype: str) -> None:
    doc = options(context(backend={"kvCacheDtype": dtype, "gpuMemoryUtilization": 0.8}))
    # The YAML's kv_cache_config replaces the CLI's whole, so the fraction must ride along.
    assert doc["kv_cache_config"] == {"dtype": dtype, "free_gpu_memory_fraction": 0.8}
    assert doc["return_perf_metrics"] is True
    assert "--kv_cache_dtype" not in BACKEND.command(context(backend={"kvCacheDtype": dtype}))


def test_options_file_is_deterministic_sorted_yaml() -> None:
    ctx = context(backend={"kvCacheDtype": "fp8"})
    text = BACKEND.config_files(ctx)[CONFIG_FILE]
    assert text == BACKEND.config_files(context(backend={"kvCacheDtype": "fp8"}))[CONFIG_FILE]
    keys = list(yaml.safe_load(text))
    assert keys == sorted(keys)
    assert text.endswith("\n") and "{" not in text


def test_tracing_off_sends_nothing() -> None:
    ctx = context()
    assert "--otlp_traces_endpoint" not in BACKEND.command(ctx)
    assert not [name for name in env(ctx) if name.startswith("OTEL_")]


def test_tracing_on_sets_endpoint_service_and_sampler() -> None:
    ctx = context(
        tracing_endpoint="http://collector:4317",
        model={"name": MODEL, "servedName": "vl"},
        tracing={"enabled": True, "sampleRatio": 0.25},
    )
    assert flags(ctx)["--otlp_traces_endpoint"] == "http://collector:4317"
    assert env(ctx) == {
        "HF_HOME": "/cache/huggingface",
        "USER": "trtllm",
        "MMFLEET_POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "MMFLEET_POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=$(MMFLEET_POD_NAMESPACE),k8s.pod.name=$(MMFLEET_POD_NAME),"
        "mmfleet.inference=qwen,mmfleet.model=Qwen/Qwen2.5-VL-7B-Instruct,mmfleet.backend=tensorrt-llm,"
        "mmfleet.cloud=generic",
        "OTEL_SERVICE_NAME": "vl",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }


def test_hf_cache_lives_on_the_cache_volume() -> None:
    assert env(context())["HF_HOME"] == "/cache/huggingface"


def test_metric_names_are_the_trtllm_series_as_scraped() -> None:
    m = BACKEND.metrics
    assert m.histogram("e2e") == "trtllm_e2e_request_latency_seconds"
    assert m.histogram("ttft") == "trtllm_time_to_first_token_seconds"
    assert m.histogram("itl") == "trtllm_time_per_output_token_seconds"
    assert (m.requests_finished, m.running, m.waiting, m.kv_cache_usage) == (
        "trtllm_request_success_total",
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization",
    )
    assert m.model_label == "model_name"


def test_p90_e2e_promql() -> None:
    assert latency_quantile_promql(BACKEND, "e2e", 90, "60s", ("model_name",)) == (
        "histogram_quantile(0.9, sum by (le, model_name) (rate(trtllm_e2e_request_latency_seconds_bucket[60s])))"
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--tp_size", "4"], "spec.parallelism.tensor"),
        (["--tensor-parallel-size=4"], "spec.parallelism.tensor"),
        (["--tensor_parallel_size", "4"], "spec.parallelism.tensor"),
        (["--max_batch_size", "8"], "spec.backend.maxNumSeqs"),
        (["--free_gpu_memory_fraction=0.5"], "spec.backend.gpuMemoryUtilization"),
        (["--extra_llm_api_options", "/tmp/x.yaml"], "is refused: mmfleet generates the LLM-API options file"),
        (["--config=/tmp/x.yaml"], "is refused: mmfleet generates the LLM-API options file"),
        (["--kv_cache_dtype", "fp8"], "spec.backend.kvCacheDtype"),
        (["--otlp-traces-endpoint", "http://x:4317"], "spec.tracing.endpoint"),
        (["--grpc"], "is refused: it replaces the OpenAI HTTP API"),
    ],
)
def test_clashes_name_the_spec_field(extra: list[str], field: str) -> None:
    problems = clashes(BACKEND, extra)
    assert len(problems) == 1
    assert problems[0].startswith("spec.backend.extraArgs[0]: ")
    assert field in problems[0]


def test_unrelated_flags_pass() -> None:
    assert clashes(BACKEND, ["--trust_remote_code", "--media_io_kwargs", '{"video": {"num_frames": 8}}']) == []


def test_every_emitted_flag_is_owned() -> None:
    ctx = context(tracing_endpoint="http://collector:4317", tracing={"enabled": True})
    emitted = [a for a in BACKEND.command(ctx) if a.startswith("--")]
    assert emitted
    for flag in emitted:
        assert clashes(BACKEND, [flag]), f"{flag} is emitted but not in owned_flags"
