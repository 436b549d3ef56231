"""The Kubernetes scheduling types a spec may carry (affinity, tolerations), checked as the API server checks them.

Typed here rather than passed through, so that a bad selector is refused at ``kubectl apply`` with its field path
instead of failing the Deployment the operator renders.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from mmfleet.api.base import Model
from mmfleet.api.patterns import DnsSubdomain, LabelKey, LabelMap, LabelValue, NamespaceName, cel

# How many values a requirement may list, and how many requirements and terms: bounded, so the CRD's CEL rules
# have a cost the API server accepts, no spec is deeper or wider than a person would write, and the largest spec the
# schema accepts fits in one etcd request (tests/contract/test_crd_bounds.py adds it up). Lists of scalars hold up to
# _VALUES_MAX; lists whose items hold lists (requirements, terms) up to _NESTED_MAX, since their sizes multiply.
_VALUES_MAX = 16
_NESTED_MAX = 4

_VALUES_BY_OPERATOR = cel(
    "self.operator in ['In', 'NotIn'] ? (has(self.values) && self.values.size() > 0) : "
    "self.operator in ['Gt', 'Lt'] ? (has(self.values) && self.values.size() == 1) : "
    "(!has(self.values) || self.values.size() == 0)",
    "values: In and NotIn need at least one value, Gt and Lt exactly one, Exists and DoesNotExist none",
    ".values",
)


def _check_values(operator: str, values: list[str]) -> None:
    """The API server's rule (ValidateNodeSelectorRequirement, ValidateLabelSelectorRequirement)."""
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"values: operator {operator} needs at least one value")
    if operator in ("Gt", "Lt") and len(values) != 1:
        raise ValueError(f"values: operator {operator} needs exactly one value, got {len(values)}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"values: operator {operator} takes no values, got {values}")


class NodeSelectorRequirement(Model):
    """A node label requirement of a node selector term."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_VALUES_BY_OPERATOR]})

    key: LabelKey = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=_VALUES_MAX,
        description="In/NotIn: one or more; Gt/Lt: exactly one (an integer); Exists/DoesNotExist: none.",
    )

    @model_validator(mode="after")
    def _check(self) -> NodeSelectorRequirement:
        _check_values(self.operator, self.values)
        return self


def _enum_not_const(schema: JsonDict) -> None:
    """A structural schema has no const (kube-apiserver drops it, checking nothing): the one value goes as an enum."""
    schema["enum"] = [schema.pop("const")]


class NodeFieldRequirement(Model):
    """A node field requirement: the node's name, the only field the API server accepts."""

    key: Literal["metadata.name"] = Field(
        description="metadata.name, the only node field selectable.",
        json_schema_extra=_enum_not_const,
    )
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn.")
    values: list[DnsSubdomain] = Field(min_length=1, max_length=1, description="Exactly one node name.")


class NodeSelectorTerm(Model):
    """Requirements that all hold on a node (ANDed); terms of a list are ORed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.matchExpressions) && self.matchExpressions.size() > 0) || "
                    "(has(self.matchFields) && self.matchFields.size() > 0)",
                    "a node selector term needs matchExpressions or matchFields: an empty term matches no node",
                )
            ]
        }
    )

    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=_NESTED_MAX, description="Node label requirements."
    )
    match_fields: list[NodeFieldRequirement] = Field(
        default_factory=list, max_length=1, description="Node field requirements (metadata.name)."
    )

    @model_validator(mode="after")
    def _check(self) -> NodeSelectorTerm:
        if not self.match_expressions and not self.match_fields:
            raise ValueError("matchExpressions: an empty node selector term matches no node; give a requirement")
        return self


class NodeSelector(Model):
    """Terms of which a node must match one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=_NESTED_MAX, description="At least one term; a node must match one of them."
    )


class PreferredSchedulingTerm(Model):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="1 to 100.")
    preference: NodeSelectorTerm = Field(description="The nodes preferred.")


class NodeAffinity(Model):
    """Which nodes the pods may or should run on, on top of the cloud profile's GPU selection."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on (ANDed with the GPU selection)."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=_NESTED_MAX, description="Nodes the pods should run on."
    )


class LabelSelectorRequirement(Model):
    """A label requirement of a label selector."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_VALUES_BY_OPERATOR]})

    key: LabelKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list, max_length=_VALUES_MAX, description="In/NotIn: one or more; Exists/DoesNotExist: none."
    )

    @model_validator(mode="after")
    def _check(self) -> LabelSelectorRequirement:
        _check_values(self.operator, self.values)
        return self


class LabelSelector(Model):
    """A Kubernetes label selector."""

    match_labels: LabelMap = Field(default_factory=dict, description="Labels that must be equal.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=_NESTED_MAX, description="Label requirements, ANDed."
    )


class PodAffinityTerm(Model):
    """Pods (by labels, in namespaces) near which, by a topology key, the fleet's pods run or do not run."""

    label_selector: LabelSelector | None = Field(default=None, description="The other pods.")
    namespace_selector: LabelSelector | None = Field(default=None, description="Namespaces of the other pods.")
    namespaces: list[NamespaceName] = Field(
        default_factory=list, max_length=_VALUES_MAX, description="Namespaces of the other pods, by name."
    )
    topology_key: LabelKey = Field(description="Node label that defines 'near', e.g. kubernetes.io/hostname.")


class WeightedPodAffinityTerm(Model):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term preferred.")


class PodAffinity(Model):
    """Pod affinity or anti-affinity rules."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=_NESTED_MAX, description="Terms that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=_NESTED_MAX, description="Terms that should hold."
    )


class Affinity(Model):
    """The Kubernetes Affinity fields mmfleet passes on, typed and checked as the API server checks them."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")


class Toleration(Model):
    """A Kubernetes toleration, with the API server's rules (ValidateTolerations)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                    "operator must be Exists when key is empty (which tolerates every taint)",
                    ".operator",
                ),
                cel(
                    "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    "effect must be NoExecute when tolerationSeconds is set",
                    ".effect",
                ),
                cel(
                    "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    "value must be empty when operator is Exists",
                    ".value",
                ),
            ]
        }
    )

    key: LabelKey | None = Field(default=None, description="Taint key; empty with operator Exists matches all.")
    operator: Literal["Equal", "Exists"] | None = Field(default=None, description="Equal (default) or Exists.")
    value: LabelValue | None = Field(default=None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect matched; empty matches all."
    )
    toleration_seconds: int | None = Field(
        # An upper bound the schema can state exactly (2**63 - 1 would pass through a float and come out negative).
        default=None,
        ge=0,
        le=10**9,
        description="For NoExecute: how long the pod stays, in seconds.",
    )

    @model_validator(mode="after")
    def _check(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError(
                f"operator: {self.operator or 'Equal'} needs a key; with key empty only Exists is accepted "
                "(it tolerates every taint)"
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(f"effect: {self.effect or 'empty'} with tolerationSeconds set; only NoExecute is accepted")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"value: {self.value!r} with operator Exists; the value must be empty")
        return self
