"""Every vLLM command line mmfleet renders is one vLLM 0.33.0's own ``serve`` parser and engine configuration accepted.

tests/data/vllm_0.33.0_flags_checked.json is what ``mmfleet_lab/gpu/check_flags.py check`` wrote with vLLM 0.33.0
installed (its docstring says how to make it again): a change to what is rendered fails here until it is checked
again, and the file records what vLLM made of the flags (the encode tier's role, the multimodal settings).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mmfleet.backends.vllm import VERSION
from mmfleet_lab.gpu import check_flags
from tests.helpers.repo import ROOT

CHECKED = ROOT / "tests" / "data" / f"vllm_{VERSION}_flags_checked.json"
AGAIN = "render and check again: see operator/mmfleet_lab/gpu/check_flags.py"


@pytest.fixture(scope="module")
def checked() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CHECKED.read_text())
    assert data["vllm"] == VERSION
    return data


def test_what_is_rendered_is_what_vllm_accepted(checked: dict[str, Any]) -> None:
    rendered = check_flags.cases(check_flags.EXAMPLES)
    assert sorted(rendered) == sorted(checked["cases"]), AGAIN
    for name, argv in rendered.items():
        case = checked["cases"][name]
        assert case["argv"] == argv, f"{name}: the rendered command line changed; {AGAIN}"
        assert (case["parsed"], case["engine_config"]) == ("ok", "ok"), name


def test_vllm_made_the_encode_tier_encoder_only_and_the_serving_tier_its_consumer(checked: dict[str, Any]) -> None:
    cache = int(2.5 * 2**30)  # the variant's cacheGiB
    encode, serving = checked["cases"]["encode-tier:encode"], checked["cases"]["encode-tier"]
    assert encode["multimodal"]["mm_encoder_only"] is True
    assert encode["ec_transfer"] == {
        "ec_connector": "ECCPUConnector",
        "ec_role": "ec_producer",
        "ec_connector_extra_config": {"ec_cpu_bytes": cache, "ec_enable_nixl": True},
        "is_encode_only": True,
    }
    assert serving["multimodal"]["mm_encoder_only"] is False
    assert serving["ec_transfer"]["ec_role"] == "ec_consumer"
    assert serving["ec_transfer"]["is_encode_only"] is False
    assert "ec_transfer" not in checked["cases"]["example:minimal.yaml"]
    # Both tiers run the V2 model runner (the connector's): nothing in their configurations is one it lacks.
    tiers = [case for case in checked["cases"].values() if "ec_transfer" in case]
    assert len(tiers) >= 8
    assert all(case["v2_model_runner_unsupported"] == [] for case in tiers)


def test_vllm_read_the_multimodal_knobs_as_meant(checked: dict[str, Any]) -> None:
    knobs = checked["cases"]["multimodal-knobs"]["multimodal"]
    assert knobs["limit_per_prompt"]["image"] == {"count": 4, "width": 1280, "height": 720}
    assert knobs["limit_per_prompt"]["video"]["num_frames"] == 32
    assert (knobs["mm_processor_cache_gb"], knobs["mm_processor_cache_type"]) == (8.0, "lru")
    assert (knobs["mm_encoder_tp_mode"], knobs["api_process_count"]) == ("data", 2)
    shm = checked["cases"]["multimodal-shm-cache"]["multimodal"]
    assert (shm["mm_processor_cache_gb"], shm["mm_processor_cache_type"]) == (2.5, "shm")
