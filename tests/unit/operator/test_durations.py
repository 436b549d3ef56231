"""Spec durations are bounded: what Prometheus, CEL's duration() and the policy can serve, named when refused."""

from __future__ import annotations

import pytest

from mmfleet.render import SpecError
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc


def problems(slo: dict[str, str], **autoscaling: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(autoscaling={"slo": slo, **autoscaling}))
    return "\n".join(caught.value.problems)


@pytest.mark.parametrize(
    ("slo", "field", "value"),
    [
        ({"target": "0s"}, "spec.autoscaling.slo.target", "0s"),  # divided by zero in the policy
        ({"target": "0.5ms"}, "spec.autoscaling.slo.target", "0.5ms"),
        ({"target": "2h"}, "spec.autoscaling.slo.target", "2h"),
        ({"target": "2s", "window": "0s"}, "spec.autoscaling.slo.window", "0s"),  # Prometheus: must be > 0
        ({"target": "2s", "window": "500ms"}, "spec.autoscaling.slo.window", "500ms"),  # under any scrape interval
        ({"target": "2s", "window": "99999h"}, "spec.autoscaling.slo.window", "99999h"),
    ],
)
def test_out_of_range_durations_are_refused_naming_field_value_and_range(
    slo: dict[str, str], field: str, value: str
) -> None:
    text = problems(slo)
    assert field in text
    assert repr(value) in text
    assert "is accepted" in text and " to 1h" in text


def test_four_hundred_digits_are_refused_before_any_arithmetic() -> None:
    text = problems({"target": "2s", "window": "9" * 400 + "s"})
    assert "slo.window" in text and "at most 64 characters" in text


def test_scale_down_delay_is_bounded_like_the_hpa_stabilization_window() -> None:
    assert "spec.autoscaling.scaleDownDelay" in problems({"target": "2s"}, scaleDownDelay="61m")
    spec = parse(spec_doc(autoscaling={"slo": {"target": "2s"}, "scaleDownDelay": "0s"})).spec
    assert spec.autoscaling is not None and spec.autoscaling.scale_down_delay == "0s"


@pytest.mark.parametrize(("target", "window"), [("1ms", "5s"), ("250ms", "60s"), ("1h", "1h"), ("1.5s", "1m30s")])
def test_durations_within_range_are_kept_as_written(target: str, window: str) -> None:
    spec = parse(spec_doc(autoscaling={"slo": {"target": target, "window": window}})).spec
    assert spec.autoscaling is not None and spec.autoscaling.slo is not None
    assert (spec.autoscaling.slo.target, spec.autoscaling.slo.window) == (target, window)
