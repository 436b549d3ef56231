"""The autoscaler's PromQL: a fixed number of queries per cycle, and each fleet's values picked out of them.

The same code against a real Prometheus: tests/integration/test_autoscaler_prometheus.py.
"""

from __future__ import annotations

import math

import pytest

from mmfleet.autoscaler.metrics import (
    SIGNALS,
    MalformedAnswerError,
    Preprocessing,
    Signals,
    Slo,
    Target,
    build_queries,
    parse_result,
    promql_duration,
    signals_for,
)
from mmfleet.backends import get, latency_quantile_promql
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc

E2E_P90 = Slo("e2e", 90, "60s")
TTFT_P99 = Slo("ttft", 99, "1m30s")


def test_fleets_whose_slo_windows_are_spelled_differently_share_one_query() -> None:
    def fleet(name: str, window: str) -> Target:
        doc = spec_doc(autoscaling={"maxReplicas": 4, "slo": {"target": "2s", "window": window}})
        doc["metadata"]["name"] = name
        return Target.of(parse(doc))

    one, other = fleet("a", "1m"), fleet("b", "60s")
    assert one.slo == other.slo == Slo("e2e", 90, "60s")
    # four signals, the pods reporting, one latency query, vllm's request mix (two) and PreprocessingBound's four
    assert len(build_queries([one, other])) == 12


def test_one_query_per_signal_and_per_distinct_slo_whatever_the_number_of_fleets() -> None:
    many = [Target("ml", f"fleet-{i}", "vllm", E2E_P90) for i in range(500)]
    queries = build_queries([*many, Target("ml", "trt", "tensorrt-llm", TTFT_P99)])
    # request rate, waiting, running, KV-cache use, pods reporting, two SLOs, and for vllm the request mix (two) and
    # PreprocessingBound's four
    assert len(queries) == 13
    latency = latency_quantile_promql(get("vllm"), "e2e", 90, "60s", ("namespace", "mmfleet_io_inference"))
    assert queries[E2E_P90] == f'label_replace({latency}, "mmfleet_backend", "vllm", "", "")'
    assert "[60s]" in latency
    rate = "sum by (namespace, mmfleet_io_inference) (rate(vllm:{}[1m]))".format

    def mean(histogram: str) -> str:
        return f"{rate(histogram + '_sum')} / {rate(histogram + '_count')}"

    assert queries["outside"] == (
        f"label_replace({mean('time_to_first_token_seconds')} - {mean('request_queue_time_seconds')} - "
        f'{mean("request_prefill_time_seconds")}, "mmfleet_backend", "vllm", "", "")'
    )
    assert list(queries)[-6:] == ["prompt_mix", "output_mix", "outside", "ttft_mean", "waiting_most", "api_cpu"], (
        "sent last: advisory"
    )
    assert queries["prompt_mix"] == f'label_replace({mean("request_prompt_tokens")}, "mmfleet_backend", "vllm", "", "")'
    assert "vllm:request_generation_tokens_sum" in queries["output_mix"]
    assert "trtllm_time_to_first_token_seconds_bucket[90s]" in queries[TTFT_P99]
    assert "vllm" not in queries[TTFT_P99], "only the backends of the fleets with that SLO"
    assert queries["waiting"] == (
        "label_replace(sum by (namespace, mmfleet_io_inference) (trtllm_num_requests_waiting), "
        '"mmfleet_backend", "tensorrt-llm", "", "") or '
        "label_replace(sum by (namespace, mmfleet_io_inference) (vllm:num_requests_waiting), "
        '"mmfleet_backend", "vllm", "", "")'
    )
    assert "rate(vllm:request_success_total[1m])" in queries["request_rate"]
    assert "avg by (namespace, mmfleet_io_inference) (vllm:kv_cache_usage_perc)" in queries["kv_cache_usage"]
    assert build_queries([]) == {}


@pytest.mark.parametrize(("duration", "promql"), [("60s", "60s"), ("1m30s", "90s"), ("1.5s", "1500ms"), ("2m", "120s")])
def test_spec_durations_become_durations_every_prometheus_parses(duration: str, promql: str) -> None:
    assert promql_duration(duration) == promql


def sample(namespace: str, fleet: str, backend: str, value: str) -> dict[str, object]:
    labels = {"namespace": namespace, "mmfleet_io_inference": fleet, "mmfleet_backend": backend}
    return {"metric": labels, "value": [1795953365.0, value]}


def test_each_fleet_gets_its_own_backend_values_and_the_names_of_what_is_missing() -> None:
    target = Target("ml", "qwen", "vllm", E2E_P90)
    answers = {
        E2E_P90: parse_result([sample("ml", "qwen", "vllm", "1.25"), sample("ml", "other", "vllm", "9")]),
        "request_rate": parse_result([sample("ml", "qwen", "vllm", "12.5")]),
        # The same fleet name seen on another backend (a backend switch still in the window) is not ours.
        "waiting": parse_result([sample("ml", "qwen", "tensorrt-llm", "40")]),
        "running": parse_result([sample("ml", "qwen", "vllm", "7")]),
        "kv_cache_usage": parse_result([sample("ml", "other", "vllm", "0.5")]),
        "reporting": parse_result([sample("ml", "qwen", "vllm", "2")]),
    }
    assert signals_for(target, answers) == Signals(
        latency=1.25,
        request_rate=12.5,
        running=7.0,
        missing=("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
        reporting=2,
    )


def test_a_series_that_holds_nan_is_kept_as_nan_for_the_cycle_to_reject_not_read_as_missing() -> None:
    target = Target("ml", "qwen", "vllm", E2E_P90)
    answers = {q: parse_result([sample("ml", "qwen", "vllm", "1")]) for q in (E2E_P90, *SIGNALS, "reporting")}
    answers["waiting"] = parse_result([sample("ml", "qwen", "vllm", "NaN")])
    signals = signals_for(target, answers)
    assert signals.missing == ()
    assert signals.waiting is not None and math.isnan(signals.waiting)


def test_a_value_that_is_not_a_number_fails_only_its_fleet() -> None:
    mine, other = Target("ml", "qwen", "vllm", E2E_P90), Target("ml", "other", "vllm", E2E_P90)
    answers = {
        q: parse_result([sample("ml", "qwen", "vllm", "1"), sample("ml", "other", "vllm", "1")])
        for q in (E2E_P90, *SIGNALS, "reporting")
    }
    answers["waiting"] = parse_result([sample("ml", "qwen", "vllm", "lots"), sample("ml", "other", "vllm", "3")])
    assert signals_for(mine, answers).failed == (
        "Prometheus answered a value that is not a number: vllm:num_requests_waiting = 'lots'"
    )
    assert signals_for(other, answers) == Signals(1.0, 1.0, 3.0, 1.0, 1.0, reporting=1)


def test_an_answer_that_is_not_an_instant_vector_is_malformed() -> None:
    with pytest.raises(MalformedAnswerError):
        parse_result({"resultType": "matrix"})
    with pytest.raises(MalformedAnswerError):
        parse_result(["not a sample"])


def test_a_query_prometheus_refused_fails_the_fleets_that_needed_it_and_no_other() -> None:
    short, long = Slo("e2e", 90, "60s"), Slo("e2e", 90, "600s")
    answers = {q: parse_result([sample("ml", "a", "vllm", "1")]) for q in (short, *SIGNALS, "reporting")}
    errors = {long: "http://prometheus refused the query '...[600s]': HTTP Status Code 422"}
    assert signals_for(Target("ml", "b", "vllm", long), answers, errors).failed == errors[long]
    assert signals_for(Target("ml", "a", "vllm", short), answers, errors).failed is None


def test_a_latency_of_nothing_finished_is_none_but_not_missing() -> None:
    target = Target("ml", "qwen", "vllm", E2E_P90)
    answers = {
        E2E_P90: parse_result([sample("ml", "qwen", "vllm", "NaN")]),
        **{s: parse_result([sample("ml", "qwen", "vllm", "0")]) for s in ("request_rate", "waiting", "running")},
        "kv_cache_usage": parse_result([sample("ml", "qwen", "vllm", "0")]),
    }
    signals = signals_for(target, answers)
    assert signals.latency is None and signals.missing == ()
    assert signals.request_rate == 0.0
    nothing = signals_for(target, {k: {} for k in answers})
    assert nothing.missing[0] == "vllm:e2e_request_latency_seconds_bucket"
    assert len(nothing.missing) == 5


@pytest.mark.parametrize(
    ("values", "errors", "read"),
    [
        (("2.5", "3", "0", "0.97"), None, Preprocessing(2.5, 3.0, 0.0, 0.97)),
        # 0/0 (no first token over the window) and no process series (several API servers): not known, no problem
        (("NaN", "NaN", "0", None), None, Preprocessing(None, None, 0.0, None)),
        (("lots", "3", "0", "1"), None, Preprocessing(problem="Prometheus answered time to first token outside")),
        (("2.5", "3", "0", "1"), {"api_cpu": "refused: bad_data"}, Preprocessing(problem="refused: bad_data")),
    ],
)
def test_the_preprocessing_signals_are_read_or_say_why_not(
    values: tuple[str | None, ...], errors: dict[str, str] | None, read: Preprocessing
) -> None:
    target = Target("ml", "qwen", "vllm", E2E_P90)
    answers = {q: parse_result([sample("ml", "qwen", "vllm", "1")]) for q in (E2E_P90, *SIGNALS, "reporting")}
    for query, value in zip(("outside", "ttft_mean", "waiting_most", "api_cpu"), values, strict=True):
        answers[query] = parse_result([sample("ml", "qwen", "vllm", value)] if value is not None else [])
    signals = signals_for(target, answers, errors)  # type: ignore[arg-type]
    assert signals.preprocessing is not None
    got = signals.preprocessing
    assert (got.outside, got.ttft_mean, got.waiting_most, got.api_cpu) == (
        read.outside,
        read.ttft_mean,
        read.waiting_most,
        read.api_cpu,
    )
    assert (got.problem or "").startswith(read.problem or ""), got.problem
    assert (got.problem is None) == (read.problem is None)
    assert signals.failed is None, "an advisory query never fails the fleet's scaling"


@pytest.mark.parametrize(
    ("prompt", "output", "read"),
    [
        ("1409.5", "211", (1409.5, 211.0)),
        ("NaN", "NaN", None),  # 0/0: no request finished over the window
        ("1409.5", None, None),  # one of the two not answered
        ("-3", "211", None),
        ("lots", "211", None),
    ],
)
def test_the_request_mix_is_read_when_prometheus_has_it_and_never_fails_the_fleet(
    prompt: str, output: str | None, read: tuple[float, float] | None
) -> None:
    target = Target("ml", "qwen", "vllm", E2E_P90)
    answers = {q: parse_result([sample("ml", "qwen", "vllm", "1")]) for q in (E2E_P90, *SIGNALS, "reporting")}
    answers["prompt_mix"] = parse_result([sample("ml", "qwen", "vllm", prompt)])
    answers["output_mix"] = parse_result([sample("ml", "qwen", "vllm", output)] if output is not None else [])
    signals = signals_for(target, answers, {"output_mix": "refused: bad_data"} if output is None else None)
    assert signals.mix == read
    assert signals.failed is None and signals.request_rate == 1.0
