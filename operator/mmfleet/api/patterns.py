"""What a single field may hold: patterns, the CEL rules beside them, and the duration and quantity parsers.

Patterns without a backslash are also CEL string literals, so the API server and the models check the same text.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic.config import JsonDict

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Longer than any quantity a pod can hold (2^63 bytes is 19 digits), short enough to bound the spec.
QUANTITY_MAX_LENGTH = 64
# The first segment after the scheme may not start with '-': for hf:// it becomes the server's model argument,
# which a leading '-' would turn into a flag (and no bucket, container, claim or HF owner starts with one).
MODEL_SOURCE_PATTERN = r"^(hf|s3|gs|oss|az|pvc|oci)://[^-/\s][^/\s]*(/\S*)?$"
# A pvc:// source's claim becomes a volume's claimName, a DNS-1123 subdomain. (No backslash: also a CEL literal.)
PVC_SOURCE_PATTERN = "^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*(/.*)?$"

# The name becomes a Service name, so it must be a DNS-1035 label.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# PersistentVolumeClaim names are DNS-1123 subdomains.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Label keys and values as kube-apiserver checks them (k8s.io/apimachinery pkg/util/validation IsQualifiedName,
# IsValidLabelValue): an optional DNS-subdomain prefix of at most 253 characters and '/', then a name of at most 63.
# (No backslash: the pattern is also a CEL string literal.)
LABEL_KEY_PATTERN = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_KEY_MAX = 253 + 1 + 63
# What a user is told a label key or value may be.
LABEL_KEY_TEXT = (
    "an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of 1 to 63 letters, digits, "
    "'-', '_' or '.' starting and ending with a letter or digit, e.g. example.com/gpu-pool"
)
LABEL_VALUE_TEXT = "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (or empty)"
DNS_SUBDOMAIN_TEXT = (
    "a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
)
# The prefix's own length limit, which no RE2 pattern states; the CEL a label key passes besides its pattern.
LABEL_KEY_PREFIX_CEL = "!self.contains('/') || self.indexOf('/') <= 253"


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# A spec duration: at most four parts of at most five digits, so that no value overflows the int64 nanoseconds of
# Go's time.ParseDuration (CEL's duration(), Prometheus' ranges): 4 x 99999h is under its 2562047h.
# (No backslash: the pattern is also a CEL string literal.)
SPEC_DURATION_PATTERN = "^([0-9]{1,5}([.][0-9]{1,9})?(ms|s|m|h)){1,4}$"
SPEC_DURATION_MAX_LENGTH = 64


def _accepted(low: str, high: str) -> str:
    return f"a duration from {low} to {high} such as 1m30s"


def duration_field(field: str, low: str, high: str) -> Any:
    """The schema of a spec duration between ``low`` and ``high``: the pattern, and a CEL rule for the API server.

    The rule holds whenever the pattern does not, so a malformed value gets the pattern's message alone and
    ``duration()`` is never handed what it cannot parse.
    """
    accepted = _accepted(low, high)
    rule: JsonDict = {
        "rule": f"!self.matches('{SPEC_DURATION_PATTERN}') || "
        f"(duration(self) >= duration('{low}') && duration(self) <= duration('{high}'))",
        "message": f"{field} must be {accepted}",
        "messageExpression": f"'{field}: ' + self + ' is out of range; {accepted} is accepted'",
    }
    return Field(
        pattern=SPEC_DURATION_PATTERN,
        max_length=SPEC_DURATION_MAX_LENGTH,
        json_schema_extra={"x-mmfleet-duration": True, "x-kubernetes-validations": [rule]},
    )


def duration_check(field: str, low: str, high: str) -> AfterValidator:
    """The same bounds as ``duration_field``'s CEL rule, for ``mmfleet render`` and the operator."""
    low_s, high_s = seconds(low), seconds(high)

    def check(value: str) -> str:
        if not low_s <= seconds(value) <= high_s:
            raise ValueError(f"{field}: {value!r} is out of range; {_accepted(low, high)} is accepted")
        return value

    return AfterValidator(check)


def _quantity(value: str | int) -> str | int:
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a quantity such as 200Gi or 4 is expected")
        return value
    if len(value) > QUANTITY_MAX_LENGTH:
        raise ValueError(f"it is {len(value)} characters long; a quantity of at most {QUANTITY_MAX_LENGTH} is accepted")
    if not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a quantity such as 200Gi, 500m or 4")
    return value


Quantity = Annotated[
    str | int,
    AfterValidator(_quantity),
    Field(json_schema_extra={"x-mmfleet-quantity": True, "maxLength": QUANTITY_MAX_LENGTH}),
]
# A quantity that is zero, whatever its unit. (No backslash: also a CEL literal.)
ZERO_QUANTITY_PATTERN = "^0+([.]0+)?[a-zA-Z]*$"


def seconds(duration: str) -> float:
    """Parse a Go-style duration ("2s", "500ms", "1m30s"), the form CEL's duration() takes.

    The one duration parser: spec fields, operator settings and the lab's flags all go through it.
    """
    if not re.fullmatch(DURATION_PATTERN, duration):
        raise ValueError(f"{duration!r} is not a duration such as 500ms, 2s, 1m30s")
    return sum(float(n) * _DURATION_UNIT[u] for n, u in _DURATION_PART.findall(duration))


def duration_text(value: float) -> str:
    """Seconds as status and events show them, e.g. 2.35s or 2460s (whole seconds from 1000 on, never 2.46e+03s): the
    one formatter, the inverse of ``seconds``."""
    return f"{value:.0f}s" if abs(value) >= 1000 else f"{value:.3g}s"


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One x-kubernetes-validations entry; fieldPath makes kubectl name the offending field."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _label_key(value: str) -> str:
    prefix, _, _name = value.rpartition("/")
    if len(value) > LABEL_KEY_MAX or len(prefix) > 253 or not re.fullmatch(LABEL_KEY_PATTERN, value):
        raise ValueError(f"{value!r} is not a label key; accepted: {LABEL_KEY_TEXT}")
    return value


def _label_value(value: str) -> str:
    if not re.fullmatch(LABEL_VALUE_PATTERN, value):
        raise ValueError(f"{value!r} is not a label value; accepted: {LABEL_VALUE_TEXT}")
    return value


def _label_keys(labels: dict[str, str]) -> dict[str, str]:
    for key in labels:
        _label_key(key)
    return labels


def _dns_subdomain(value: str) -> str:
    if len(value) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, value):
        raise ValueError(f"{value!r} is not {DNS_SUBDOMAIN_TEXT}, at most 253 characters")
    return value


# The pattern goes in the schema (so the API server checks it) but not into pydantic's own check, so that the
# operator's message says what is accepted in words rather than as a regular expression.
LabelKey = Annotated[
    str,
    AfterValidator(_label_key),
    Field(
        json_schema_extra={
            "pattern": LABEL_KEY_PATTERN,
            "maxLength": LABEL_KEY_MAX,
            "x-kubernetes-validations": [cel(LABEL_KEY_PREFIX_CEL, "the prefix before '/' is at most 253 characters")],
        }
    ),
]
LabelValue = Annotated[
    str, AfterValidator(_label_value), Field(json_schema_extra={"pattern": LABEL_VALUE_PATTERN, "maxLength": 63})
]
# Label maps (nodeSelector, matchLabels): values are checked by the schema, keys' pattern by the models, so a bad key
# becomes an InvalidSpec condition naming it. A pattern rule on map keys costs more than the API server allows (it
# estimates every key at the largest request: 1.3x the per-rule budget even for nodeSelector alone, measured on
# kube-apiserver 1.34); a length rule costs the same for any key, so the API server bounds keys by their length.
_LABEL_MAP_MAX = 16
LabelMap = Annotated[
    dict[str, LabelValue],
    # Field before the validator, so that pydantic's schema says maxProperties (after it, maxLength, which bounds
    # nothing on an object).
    Field(
        max_length=_LABEL_MAP_MAX,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(f"self.all(k, k.size() <= {LABEL_KEY_MAX})", f"a label key is at most {LABEL_KEY_MAX} characters")
            ]
        },
    ),
    AfterValidator(_label_keys),
]
# Object names the API server checks as DNS-1123 subdomains (Secret, StorageClass, PersistentVolumeClaim, Node).
DnsSubdomain = Annotated[
    str,
    AfterValidator(_dns_subdomain),
    Field(json_schema_extra={"pattern": DNS_SUBDOMAIN_PATTERN, "maxLength": 253, "minLength": 1}),
]
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


def _cidr(value: str) -> str:
    """What CEL's isCIDR accepts (netip.ParsePrefix, no IPv4-mapped IPv6): the Service's own check admits it too."""
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        network = None
    if network is None or "/" not in value or getattr(network.network_address, "ipv4_mapped", None) is not None:
        raise ValueError(f"{value!r} is not a CIDR such as 10.0.0.0/8 or fd00::/8")
    return value


Cidr = Annotated[
    str,
    AfterValidator(_cidr),
    Field(
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [cel("isCIDR(self)", "must be a CIDR such as 10.0.0.0/8 or fd00::/8")]
        },
    ),
]
