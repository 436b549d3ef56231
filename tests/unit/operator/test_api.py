"""The models: defaults a user relies on and the cross-field rules, with the messages they print."""

from __future__ import annotations

import pytest

from mmfleet.api import MultimodalInference, seconds
from mmfleet.render import SpecError
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc


def problems_of(doc: dict[str, object]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(doc)
    return caught.value.problems


def test_minimal_spec_gets_working_defaults() -> None:
    inference = parse(spec_doc())
    spec = inference.spec
    assert spec.backend.name == "vllm"
    assert spec.gpu.count == 1
    assert spec.tensor_parallel == 1
    assert not spec.autoscaled
    assert spec.model.resolved_source() == "hf://Qwen/Qwen2.5-VL-7B-Instruct"
    assert inference.served_name == "qwen"


def test_tensor_parallel_defaults_to_gpus_over_pipeline() -> None:
    spec = parse(spec_doc(gpu={"count": 4}, parallelism={"pipeline": 2})).spec
    assert spec.tensor_parallel == 2


def test_autoscaling_block_turns_autoscaling_on() -> None:
    spec = parse(spec_doc(autoscaling={"slo": {"target": "2s"}})).spec
    assert spec.autoscaled
    assert spec.autoscaling is not None
    assert spec.autoscaling.slo is not None
    assert spec.autoscaling.slo.percentile == 90
    assert spec.autoscaling.slo.window == "60s"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2s", 2.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0), ("250ms", 0.25)],
)
def test_durations_parse_like_go(text: str, expected: float) -> None:
    assert seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["2", "2 s", "-1s", "1d", ""])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        seconds(text)


def test_tensor_that_does_not_divide_gpus_names_both_fields() -> None:
    assert problems_of(spec_doc(gpu={"count": 2}, parallelism={"tensor": 3})) == [
        "spec.parallelism.tensor: 3 does not divide spec.gpu.count: 2"
    ]


def test_tensor_times_pipeline_must_equal_gpus() -> None:
    lines = problems_of(spec_doc(gpu={"count": 4}, parallelism={"tensor": 2, "pipeline": 1}))
    assert lines == ["spec.parallelism.tensor: 2 x spec.parallelism.pipeline: 1 must equal spec.gpu.count: 4"]


def test_min_above_max_is_rejected_with_both_values() -> None:
    lines = problems_of(spec_doc(autoscaling={"minReplicas": 5, "maxReplicas": 2, "slo": {"target": "1s"}}))
    assert lines == ["spec.autoscaling.minReplicas: 5 exceeds maxReplicas: 2"]


def test_enabled_autoscaling_needs_an_slo() -> None:
    lines = problems_of(spec_doc(autoscaling={"maxReplicas": 4}))
    assert len(lines) == 1
    assert lines[0].startswith("spec.autoscaling.slo: required")


def test_disabled_autoscaling_needs_no_slo() -> None:
    assert not parse(spec_doc(autoscaling={"enabled": False})).spec.autoscaled


def test_flash_attention_3_needs_hopper() -> None:
    lines = problems_of(spec_doc(backend={"attention": "flash-attn-3"}, gpu={"type": "A100"}))
    assert len(lines) == 1
    assert "spec.backend.attention: flash-attn-3 needs a Hopper GPU, but spec.gpu.type is A100" in lines[0]
    assert "H100" in lines[0]
    parse(spec_doc(backend={"attention": "flash-attn-3"}, gpu={"type": "H100"}))


def test_multimodal_settings_only_for_vllm() -> None:
    lines = problems_of(spec_doc(backend={"name": "tensorrt-llm"}, multimodal={"limitPerPrompt": {"image": 2}}))
    assert lines == [
        "spec.multimodal.limitPerPrompt: set, but spec.backend.name: tensorrt-llm takes no multimodal setting; "
        "they are vllm's"
    ]
    several = {"largestItem": {"image": {"width": 640}}, "apiServers": 2}
    lines = problems_of(spec_doc(backend={"name": "tensorrt-llm"}, multimodal=several))
    assert lines == [
        "spec.multimodal.largestItem: set, but spec.backend.name: tensorrt-llm takes no multimodal setting (nor "
        "multimodal.apiServers); they are vllm's"
    ]


def test_tensorrt_llm_kv_dtype_subset() -> None:
    lines = problems_of(spec_doc(backend={"name": "tensorrt-llm", "kvCacheDtype": "fp8_e5m2"}))
    assert lines == ["spec.backend.kvCacheDtype: fp8_e5m2 is not accepted by tensorrt-llm (accepted: auto, fp8, nvfp4)"]


def test_tensorrt_llm_rejects_object_store_sources() -> None:
    lines = problems_of(spec_doc(backend={"name": "tensorrt-llm"}, model={"name": "m", "source": "s3://b/m"}))
    assert lines == ["spec.model.source: s3://b/m is not loadable by tensorrt-llm (accepted: hf://, pvc://)"]


def test_field_errors_name_path_value_and_accepted() -> None:
    lines = problems_of(spec_doc(backend={"name": "sglang"}, gpu={"count": 32}))
    assert "spec.backend.name: 'sglang' is not accepted: input should be 'vllm' or 'tensorrt-llm'" in lines
    assert "spec.gpu.count: 32 is not accepted: input should be less than or equal to 16" in lines


def test_unknown_field_lists_the_accepted_ones() -> None:
    lines = problems_of(spec_doc(gpu={"count": 1, "kind": "H100"}))
    assert lines == ["spec.gpu.kind: unknown field (accepted: count, type)"]


def test_missing_model_is_reported() -> None:
    doc = spec_doc()
    del doc["spec"]["model"]  # type: ignore[attr-defined]
    assert problems_of(doc) == ["spec.model: required field is missing"]


def test_bad_source_scheme_is_rejected() -> None:
    lines = problems_of(spec_doc(model={"name": "m", "source": "http://example/m"}))
    assert lines[0].startswith("spec.model.source: 'http://example/m' is not accepted: string should match pattern")


@pytest.mark.parametrize("name", ["--trust-remote-code", "-Qwen/Qwen2.5-VL-7B-Instruct"])
def test_model_name_that_the_server_would_read_as_a_flag_is_refused(name: str) -> None:
    lines = problems_of(spec_doc(model={"name": name}))
    assert lines == [
        f"spec.model.name: {name!r} is not accepted: it starts with '-', which the server's command line takes "
        "for a flag"
    ]


def test_hf_source_whose_repo_starts_with_a_dash_is_refused() -> None:
    lines = problems_of(spec_doc(model={"name": "m", "source": "hf://-x/y"}))
    assert lines[0].startswith("spec.model.source: 'hf://-x/y' is not accepted: string should match pattern")


def test_dashes_inside_model_names_and_sources_are_fine() -> None:
    model = parse(spec_doc(model={"name": "Qwen/Qwen2.5-VL-7B-Instruct", "source": "pvc://models/-weights"})).spec.model
    assert model.name == "Qwen/Qwen2.5-VL-7B-Instruct"


def test_wire_round_trip_keeps_camel_case() -> None:
    inference = MultimodalInference.model_validate(spec_doc(backend={"maxNumSeqs": 64}))
    assert inference.spec.wire()["backend"]["maxNumSeqs"] == 64


def test_shared_cache_needs_a_claim_name() -> None:
    assert problems_of(spec_doc(modelCache={"volume": "shared"})) == [
        "spec.modelCache.claimName: required when spec.modelCache.volume is shared (the name of an existing "
        "ReadWriteMany PersistentVolumeClaim in the same namespace)"
    ]


def test_claim_name_without_shared_volume_is_rejected() -> None:
    assert problems_of(spec_doc(modelCache={"claimName": "models"})) == [
        "spec.modelCache.claimName: models is only read when spec.modelCache.volume is shared, but volume is "
        "emptyDir; set volume: shared or remove claimName"
    ]


def test_claim_name_must_be_a_kubernetes_name() -> None:
    lines = problems_of(spec_doc(modelCache={"volume": "shared", "claimName": "Models_RWX"}))
    assert len(lines) == 1
    assert lines[0].startswith("spec.modelCache.claimName: 'Models_RWX' is not accepted: string should match pattern")


def test_shared_cache_with_claim_parses() -> None:
    cache = parse(spec_doc(modelCache={"volume": "shared", "claimName": "models-rwx"})).spec.model_cache
    assert (cache.volume, cache.claim_name) == ("shared", "models-rwx")
