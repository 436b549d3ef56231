"""The vLLM 0.33 backend: the command line, env and metric names a user's pod ends up with."""

from __future__ import annotations

import csv
import json
from typing import Any

import pytest

from mmfleet import clouds, encode_proxy, render
from mmfleet.api import MultimodalInference
from mmfleet.backends import ServerContext, clashes, latency_quantile_promql
from mmfleet.backends.vllm import BACKEND, preprocessing_ms
from mmfleet.render import SpecError
from mmfleet.validation import parse
from tests.helpers.repo import ROOT, spec_doc

DOWNLOAD_DIR = "/cache/models"
EKS = clouds.get("eks")


def context(
    model_ref: str = "Qwen/Qwen2.5-VL-7B-Instruct", tracing_endpoint: str | None = None, **spec: Any
) -> ServerContext:
    return ServerContext(
        inference=MultimodalInference.model_validate(spec_doc(**spec)),
        model_ref=model_ref,
        port=8000,
        config_dir="/etc/mmfleet",
        tracing_endpoint=tracing_endpoint,
        cache_dir="/cache",
        download_dir=DOWNLOAD_DIR,
        shared_cache_dir=None,
    )


def flags(ctx: ServerContext) -> dict[str, str]:
    """Each --flag followed by a value, as a dict (bare switches map to '')."""
    args = BACKEND.command(ctx)[3:]
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[arg] = "" if nxt.startswith("-") else nxt
    return out


def env(ctx: ServerContext) -> dict[str, object]:
    return {str(e["name"]): e.get("value", e.get("valueFrom")) for e in BACKEND.env(ctx)}


def test_command_starts_vllm_serve_with_the_model_positional() -> None:
    assert BACKEND.command(context())[:3] == ["vllm", "serve", "Qwen/Qwen2.5-VL-7B-Instruct"]


def test_every_value_is_a_string_for_the_pod_spec() -> None:
    assert all(isinstance(a, str) for a in BACKEND.command(context()))


def test_server_listens_on_all_interfaces_under_the_served_name() -> None:
    f = flags(context(model={"name": "Qwen/Qwen2.5-VL-7B-Instruct", "servedName": "vl"}))
    assert (f["--host"], f["--port"], f["--served-model-name"]) == ("0.0.0.0", "8000", "vl")
    # Without servedName, clients (and the model_name metric label) use metadata.name.
    assert flags(context())["--served-model-name"] == "qwen"


def test_parallelism_defaults_to_all_gpus_in_tensor() -> None:
    f = flags(context(gpu={"count": 4}))
    assert (f["--tensor-parallel-size"], f["--pipeline-parallel-size"]) == ("4", "1")


def test_parallelism_splits_tensor_and_pipeline() -> None:
    f = flags(context(gpu={"count": 8}, parallelism={"tensor": 4, "pipeline": 2}))
    assert (f["--tensor-parallel-size"], f["--pipeline-parallel-size"]) == ("4", "2")


def test_engine_settings_pass_through() -> None:
    f = flags(
        context(
            backend={
                "maxModelLen": 32768,
                "maxNumSeqs": 64,
                "maxNumBatchedTokens": 16384,
                "gpuMemoryUtilization": 0.85,
                "kvCacheDtype": "fp8",
            }
        )
    )
    assert f["--max-model-len"] == "32768"
    assert f["--max-num-seqs"] == "64"
    assert f["--max-num-batched-tokens"] == "16384"
    assert f["--gpu-memory-utilization"] == "0.85"
    assert f["--kv-cache-dtype"] == "fp8"
    assert f["--download-dir"] == DOWNLOAD_DIR


def test_engine_defaults_are_spelled_explicitly() -> None:
    # vLLM's own defaults (0.92 memory, hardware-dependent batch sizes) differ from the API's.
    f = flags(context())
    assert (f["--gpu-memory-utilization"], f["--max-num-seqs"], f["--max-num-batched-tokens"]) == ("0.9", "128", "4096")


@pytest.mark.parametrize(("chunked", "present", "absent"), [
    (True, "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
    (False, "--no-enable-chunked-prefill", "--enable-chunked-prefill"),
])  # fmt: skip
def test_chunked_prefill_switch(chunked: bool, present: str, absent: str) -> None:
    args = BACKEND.command(context(backend={"chunkedPrefill": chunked, "maxNumBatchedTokens": 8192}))
    assert present in args
    assert absent not in args


def test_limit_per_prompt_is_compact_json_of_the_set_modalities() -> None:
    f = flags(context(multimodal={"limitPerPrompt": {"image": 4, "video": 0}}))
    assert f["--limit-mm-per-prompt"] == '{"image":4,"video":0}'
    assert json.loads(f["--limit-mm-per-prompt"]) == {"image": 4, "video": 0}


def test_the_largest_item_joins_its_modalitys_count_under_vllms_names() -> None:
    mm = {
        "limitPerPrompt": {"image": 4, "video": 1},
        "largestItem": {"image": {"width": 1280, "height": 720}, "video": {"frames": 32}, "audio": {"length": 16000}},
    }
    limits = json.loads(flags(context(multimodal=mm))["--limit-mm-per-prompt"])
    # config/multimodal.py: {"image": {"count": 5, "width": 512, "height": 512}}; num_frames for video; a modality
    # with no count keeps vLLM's (999).
    assert limits == {
        "image": {"count": 4, "width": 1280, "height": 720},
        "video": {"count": 1, "num_frames": 32},
        "audio": {"length": 16000},
    }


def test_the_processor_cache_encoder_split_and_api_servers_are_vllms_flags() -> None:
    mm = {"processorCache": {"sizeGiB": 0.5, "type": "lru"}, "encoderTensorParallel": "data", "apiServers": 3}
    f = flags(context(multimodal=mm))
    assert (f["--mm-processor-cache-gb"], f["--mm-processor-cache-type"]) == ("0.5", "lru")
    assert (f["--mm-encoder-tp-mode"], f["--api-server-count"]) == ("data", "3")
    unset = flags(context())
    assert not {
        "--mm-processor-cache-gb",
        "--mm-processor-cache-type",
        "--mm-encoder-tp-mode",
        "--api-server-count",
    } & set(unset)


@pytest.mark.parametrize(
    ("multimodal", "memory", "shm", "cpu"),
    [
        ({}, "34Gi", "2Gi", "4"),  # vLLM's default cache (4 GiB of data in the engine) is in the default
        ({"processorCache": {"sizeGiB": 16}}, "46Gi", "2Gi", "4"),  # lru: 16 in the engine, 4 of it in the default
        ({"processorCache": {"sizeGiB": 6, "type": "shm"}}, "40Gi", "8Gi", "4"),  # one buffer in /dev/shm
        ({"processorCache": {"sizeGiB": 2.5, "type": "shm"}}, "37376Mi", "4608Mi", "4"),  # not whole GiB: MiB
        ({"apiServers": 4}, "46Gi", "2Gi", "7"),  # 4 API processes, a whole cache each, none in the engine; a core each
        ({"processorCache": {"sizeGiB": 0.5}}, "34Gi", "2Gi", "4"),
        ({"processorCache": {"sizeGiB": 5}}, "35Gi", "2Gi", "4"),
    ],
)
def test_the_processor_cache_and_api_servers_are_added_to_the_default_requests(
    multimodal: dict[str, Any], memory: str, shm: str, cpu: str
) -> None:
    deployment = render.build_deployment(MultimodalInference.model_validate(spec_doc(multimodal=multimodal)), EKS)
    pod = deployment["spec"]["template"]["spec"]
    requests = pod["containers"][0]["resources"]["requests"]
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert (requests["memory"], dshm["emptyDir"]["sizeLimit"], requests["cpu"]) == (memory, shm, cpu)


def test_shm_with_several_api_servers_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(multimodal={"processorCache": {"type": "shm"}, "apiServers": 2}))
    assert caught.value.problems == [
        "spec.multimodal.processorCache.type: shm with multimodal.apiServers: 2; vLLM 0.33 shares the buffer with one "
        "API server process only (with more it keeps a cache per process); use lru or one API server"
    ]


def test_limit_per_prompt_unset_leaves_vllm_default() -> None:
    assert "--limit-mm-per-prompt" not in BACKEND.command(context())
    assert "--limit-mm-per-prompt" not in BACKEND.command(context(multimodal={"limitPerPrompt": {}}))


@pytest.mark.parametrize(("attention", "gpu", "expected"), [
    ("flash-attn-3", "H100", ["--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version", "3"]),
    ("flash-attn-2", "A100", ["--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version", "2"]),
    ("flashinfer", "L40S", ["--attention-backend", "FLASHINFER"]),
    ("triton", "L4", ["--attention-backend", "TRITON_ATTN"]),
])  # fmt: skip
def test_attention_choice(attention: str, gpu: str, expected: list[str]) -> None:
    args = BACKEND.command(context(backend={"attention": attention}, gpu={"type": gpu}))
    start = args.index("--attention-backend")
    assert args[start : start + len(expected)] == expected
    assert args.count("--attention-backend") == 1


def test_attention_auto_lets_vllm_choose() -> None:
    args = BACKEND.command(context(gpu={"type": "H100"}))
    assert not [a for a in args if a.startswith(("--attention-backend", "--attention-config"))]


def test_tracing_on_adds_endpoint_and_otel_sampler_env() -> None:
    ctx = context(tracing_endpoint="http://collector:4317", tracing={"enabled": True, "sampleRatio": 0.25})
    assert flags(ctx)["--otlp-traces-endpoint"] == "http://collector:4317"
    e = env(ctx)
    assert e["OTEL_SERVICE_NAME"] == "qwen"
    assert e["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
    assert e["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert e["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert float(str(e["OTEL_TRACES_SAMPLER_ARG"])) == 0.25


def test_tracing_off_adds_neither_flag_nor_otel_env() -> None:
    ctx = context(tracing_endpoint=None)
    assert "--otlp-traces-endpoint" not in BACKEND.command(ctx)
    assert not [name for name in env(ctx) if name.startswith("OTEL_")]


def test_caches_go_to_the_cache_volume_and_env_names_are_unique() -> None:
    ctx = context(tracing_endpoint="http://collector:4317", tracing={"enabled": True})
    e = env(ctx)
    assert e["HF_HOME"] == "/cache/huggingface"
    # Server-side apply keys env by name: a duplicate would fail the whole apply.
    names = [item["name"] for item in BACKEND.env(ctx)]
    assert len(names) == len(set(names))
    assert all(
        isinstance(item.get("value"), str) or "fieldRef" in item.get("valueFrom", {}) for item in BACKEND.env(ctx)
    )


def test_disable_log_stats_never_appears() -> None:
    for ctx in (
        context(),
        context(tracing_endpoint="http://c:4317", tracing={"enabled": True}, autoscaling={"slo": {"target": "2s"}}),
    ):
        assert not [a for a in BACKEND.command(ctx) if "disable-log-stats" in a or "disable_log_stats" in a]


@pytest.mark.parametrize(("model_ref", "expected"), [
    ("s3://bucket/qwen", "s3://bucket/qwen"),
    ("gs://bucket/qwen", "gs://bucket/qwen"),
    ("az://container/qwen", "az://container/qwen"),
    ("oss://bucket/qwen", "s3://bucket/qwen"),
])  # fmt: skip
def test_object_store_models_stream_with_runai(model_ref: str, expected: str) -> None:
    args = BACKEND.command(context(model_ref=model_ref, model={"name": "qwen", "source": model_ref}))
    assert args[2] == expected
    assert flags(context(model_ref=model_ref))["--load-format"] == "runai_streamer"


@pytest.mark.parametrize("model_ref", ["Qwen/Qwen2.5-VL-7B-Instruct", "/models/qwen"])
def test_hub_and_volume_models_use_the_default_loader(model_ref: str) -> None:
    assert "--load-format" not in BACKEND.command(context(model_ref=model_ref))


def test_every_emitted_flag_is_owned() -> None:
    ctx = context(
        gpu={"type": "H100"},
        backend={"attention": "flash-attn-3", "chunkedPrefill": False, "maxNumBatchedTokens": 8192},
        multimodal={"limitPerPrompt": {"image": 2}},
        tracing={"enabled": True},
        tracing_endpoint="http://c:4317",
        model_ref="s3://b/m",
    )
    emitted = [a for a in BACKEND.command(ctx)[3:] if a.startswith("--")]
    assert len(emitted) >= 15
    assert len(clashes(BACKEND, emitted)) == len(emitted)


@pytest.mark.parametrize("arg", [
    "--tensor-parallel-size=4",
    "--tensor_parallel_size",
    "-tp",
    "--no-enable-chunked-prefill",
    "--limit-mm-per-prompt.image",
    "--attention-config.flash_attn_version=4",
    "-ac",
    "--device-memory-utilization=0.5",
    "--served-model-name",
    "-ac.flash_attn_version=4",
    "--max-model=4096",
])  # fmt: skip
def test_clashes_reject_flags_mmfleet_sets(arg: str) -> None:
    problems = clashes(BACKEND, ["--enforce-eager", arg])
    assert len(problems) == 1
    assert problems[0].startswith(f"spec.backend.extraArgs[1]: {arg} clashes with ")


def test_clash_message_names_the_field_to_change() -> None:
    (problem,) = clashes(BACKEND, ["-tp", "2"])
    assert "--tensor-parallel-size" in problem
    assert "spec.parallelism.tensor" in problem


@pytest.mark.parametrize("arg", ["--disable-log-stats", "--shutdown-timeout=5"])
def test_refused_flags_say_why(arg: str) -> None:
    (problem,) = clashes(BACKEND, [arg])
    assert problem.startswith(f"spec.backend.extraArgs[0]: {arg} is refused: ")


def test_disable_log_stats_names_what_it_breaks() -> None:
    (problem,) = clashes(BACKEND, ["--disable-log-stats"])
    assert "vllm:*" in problem
    assert "autoscaling" in problem


def test_unrelated_flags_pass() -> None:
    assert clashes(BACKEND, ["--enforce-eager", "--trust-remote-code", "--max-logprobs", "8"]) == []


def test_e2e_p90_promql() -> None:
    """The server's P90 (the fallback of the front door's: tests/integration/test_autoscaler_prometheus.py reads
    both through a real Prometheus)."""
    query = latency_quantile_promql(BACKEND, "e2e", 90, "60s", ("namespace", "mmfleet_io_inference"))
    assert query.endswith(
        " or histogram_quantile(0.9, sum by (le, namespace, mmfleet_io_inference) "
        "(rate(vllm:e2e_request_latency_seconds_bucket[60s])))"
    )
    itl = latency_quantile_promql(BACKEND, "itl", 90, "60s", ("namespace",))
    assert itl == (
        "histogram_quantile(0.9, sum by (le, namespace) (rate(vllm:inter_token_latency_seconds_bucket[60s])))"
    )


def test_the_sidecar_exports_the_histograms_the_autoscaler_reads() -> None:
    assert (
        BACKEND.metrics.front_door("e2e"),
        BACKEND.metrics.front_door("ttft"),
    ) == (encode_proxy.FRONT_DOOR_E2E, encode_proxy.FRONT_DOOR_TTFT)
    assert (BACKEND.metrics.encode_call, BACKEND.metrics.encode_items, BACKEND.metrics.encode_failures) == (
        encode_proxy.ENCODE_CALL,
        encode_proxy.ENCODE_ITEMS,
        encode_proxy.ENCODE_FAILURES,
    )


def test_metric_names_as_scraped() -> None:
    m = BACKEND.metrics
    assert (m.ttft, m.itl) == ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")
    # Counters carry _total in the exposition; gauges do not.
    assert m.requests_finished == "vllm:request_success_total"
    assert (m.running, m.waiting) == ("vllm:num_requests_running", "vllm:num_requests_waiting")
    assert m.kv_cache_usage == "vllm:kv_cache_usage_perc"
    assert m.model_label == "model_name"


def test_identity_and_endpoints() -> None:
    assert (BACKEND.name, BACKEND.version, BACKEND.image) == ("vllm", "0.33.0", "vllm/vllm-openai:v0.33.0")
    assert (BACKEND.port, BACKEND.metrics_path, BACKEND.health_path) == (8000, "/metrics", "/health")
    assert BACKEND.run_as_user == 2000
    assert BACKEND.config_files(context()) == {}


def test_drain_args() -> None:
    assert BACKEND.drain_args(90) == ["--shutdown-timeout", "90"]


def test_the_cpu_request_grows_with_the_images_a_replica_preprocesses() -> None:
    """multimodal.imagesPerSecond: cores for decoding and preprocessing, at most half busy, from the calibration's
    per-image times (PNG, the dearer format), for the largest image's size."""

    def cpu(**multimodal: Any) -> str:
        deployment = render.build_deployment(MultimodalInference.model_validate(spec_doc(multimodal=multimodal)), EKS)
        server = deployment["spec"]["template"]["spec"]["containers"][0]
        return str(server["resources"]["requests"]["cpu"])

    assert cpu() == "4"
    # 20 images a second of 1280x720, 40.5 ms each: 0.81 cores busy, 1.62 half busy.
    assert cpu(imagesPerSecond=20) == "5623m"
    assert cpu(imagesPerSecond=20, largestItem={"image": {"width": 448, "height": 448}}) == "4429m"
    # An extra API server process is there to preprocess too: the larger of the two, not both.
    assert cpu(imagesPerSecond=20, apiServers=2) == "5623m"
    assert cpu(imagesPerSecond=20, apiServers=3) == "6"


def test_the_preprocessing_cost_is_the_calibrations() -> None:
    """The line through the measured points stays within 3% of each PNG measurement, and above each JPEG one."""
    rows = list(csv.DictReader((ROOT / "tests" / "data" / "vllm_h200_preprocess_cpu.csv").open()))
    assert len(rows) == 4
    for row in rows:
        measured = float(row["decode_ms_p50"]) + float(row["processor_with_text_ms_p50"])
        model = preprocessing_ms(int(row["w"]) * int(row["h"]))
        if row["fmt"] == "png":
            assert model == pytest.approx(measured, rel=0.03), row
        else:
            assert model > measured, row
