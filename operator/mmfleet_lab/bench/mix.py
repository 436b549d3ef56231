"""``mmfleet bench mix``: in which unit a replica's capacity at the SLO stays put when the request mix changes
(issue 25: "demand measured in work, not requests ... so a change in the image or token mix does not read as a
change in capacity").

μ_SLO, the highest steady rate one replica serves within the SLO (``sim.capacity_at_slo``), is measured on the
twin's H200 Qwen2.5-VL-7B replica for each mix, and predicted from the training trace's mix three ways, as a policy
that learned its capacity there would carry it to a new mix:

- ``requests``: the same req/s (what the shipped policy learns);
- ``tokens``: the same prompt + output tokens/s (prompt tokens include each image's placeholder tokens, as vLLM's
  ``vllm:prompt_tokens`` counts them);
- ``work``: the same replica-seconds per second under a linear cost per request, per prompt token, per output token
  and per image, fitted (least squares on the relative error, non-negative) to μ_SLO of the training trace's mix and
  six variants of it (output tokens x0.5 and x2, text tokens x0.5 and x2, images x0 and x2).

Only the training trace (azure-conv) and its variants are fitted on; the validation and test traces (their own mixes,
drawn per seed) are only predicted. Nothing here changes the shipped policy: it says which unit would.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mmfleet.api import SloSpec
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.traces import ROLES
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.scenarios import REFERENCE_SLO, base_requests, traces_dir
from mmfleet_lab.twin.sim import capacity_at_slo

SEEDS = (0, 1, 2)
TRAIN = "azure-conv"
HELD_OUT = tuple(name for name, part in ROLES.items() if part != "train" and name != "trace")
SLOS = (REFERENCE_SLO, SloSpec(metric="ttft", percentile=90, target="2s", window="60s"))
FEATURES = ("request", "prompt token", "output token", "image")
UNITS = ("requests", "tokens", "work")


def _scaled(values: np.ndarray, factor: float) -> np.ndarray:
    return np.maximum(1.0, np.round(values * factor))


VARIANTS: tuple[tuple[str, Callable[[Requests], Requests]], ...] = (
    ("as traced", lambda r: r),
    ("output x0.5", lambda r: replace(r, output_tokens=_scaled(r.output_tokens, 0.5))),
    ("output x2", lambda r: replace(r, output_tokens=_scaled(r.output_tokens, 2.0))),
    ("text x0.5", lambda r: replace(r, input_tokens=_scaled(r.input_tokens, 0.5))),
    ("text x2", lambda r: replace(r, input_tokens=_scaled(r.input_tokens, 2.0))),
    ("images x0", lambda r: replace(r, images=r.images * 0)),
    ("images x2", lambda r: replace(r, images=r.images * 2)),
)


@dataclass(frozen=True)
class Mix:
    """One request mix and the capacity the twin measured for it."""

    name: str
    mu: float  # req/s at the SLO
    features: tuple[float, float, float, float]  # per request: 1, prompt tokens, output tokens, images

    @property
    def tokens(self) -> float:
        return self.features[1] + self.features[2]


def features(req: Requests) -> tuple[float, float, float, float]:
    return 1.0, float(np.mean(req.prompt_tokens)), float(np.mean(req.output_tokens)), float(np.mean(req.images))


def measure(name: str, req: Requests, params: ReplicaParams, slo: SloSpec) -> Mix:
    return Mix(name, capacity_at_slo(params, req, slo), features(req))


def fit_costs(mixes: Sequence[Mix]) -> np.ndarray:
    """Non-negative replica-seconds per request, prompt token, output token and image: least squares on 1/μ_SLO's
    relative error (the report is in ratios), over every non-empty subset of the costs left free (fifteen small
    solves; the best non-negative one is the non-negative least-squares optimum)."""
    y = np.array([1.0 / m.mu for m in mixes])
    x = np.array([m.features for m in mixes]) / y[:, None]
    y = np.ones_like(y)
    best, best_err = np.zeros(x.shape[1]), float("inf")
    for k in range(1, x.shape[1] + 1):
        for free in itertools.combinations(range(x.shape[1]), k):
            sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
            if np.any(sol < 0):
                continue
            w = np.zeros(x.shape[1])
            w[list(free)] = sol
            err = float(np.sum((x @ w - y) ** 2))
            if err < best_err:
                best, best_err = w, err
    return best


def predict(unit: str, base: Mix, costs: np.ndarray, mix: Mix) -> float:
    """μ_SLO of ``mix`` as a capacity learned on ``base`` in ``unit`` says it: the same requests, tokens, or work
    (the fitted costs) per second."""
    if unit == "requests":
        return base.mu
    if unit == "tokens":
        return base.mu * base.tokens / mix.tokens
    if unit == "work":
        return base.mu * float(np.dot(costs, base.features)) / float(np.dot(costs, mix.features))
    raise ValueError(f"unit {unit!r}: one of {', '.join(UNITS)}")


@dataclass(frozen=True)
class SeedResult:
    seed: int
    slo: SloSpec
    costs: np.ndarray
    train: tuple[Mix, ...]  # the training trace's mix first, then its variants
    held_out: tuple[Mix, ...]


def run_seed(seed: int, slo: SloSpec, params: ReplicaParams = H200_QWEN25VL7B) -> SeedResult:
    d = traces_dir(None)
    rng = np.random.default_rng(seed)
    base, _ = base_requests(TRAIN, d, rng)
    train = tuple(measure(name, change(base), params, slo) for name, change in VARIANTS)
    held = tuple(measure(n, base_requests(n, d, np.random.default_rng(seed))[0], params, slo) for n in HELD_OUT)
    return SeedResult(seed, slo, fit_costs(train), train, held)


def _ratio_text(values: Sequence[float]) -> str:
    mean = float(np.mean(values))
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ({min(values):.2f}–{max(values):.2f})"


def _slo_text(slo: SloSpec) -> str:
    return f"P{slo.percentile:g} {slo.metric} ≤ {slo.target}"


def render(results: Sequence[SeedResult], command: str, wall: float) -> str:
    seeds = sorted({r.seed for r in results})
    body = [
        f"Command: `{command}` ({wall:.0f} s on {os.cpu_count()} shared cores), seeds "
        f"{', '.join(map(str, seeds))}. Twin: {H200_QWEN25VL7B.name}, one replica, Poisson arrivals from each mix "
        "(`sim.capacity_at_slo`, to 3 % on the rate). Each cell is the capacity measured on the training trace's mix, "
        "carried to the row's mix in the column's unit, over the one the twin measured for the row's mix (1.00: the "
        "unit carried it exactly; above 1 it promises more than the replica serves, and a fleet sized on it misses "
        "the SLO): mean and range over the seeds. The work unit's costs are fitted on azure-conv (train) and its "
        "variants only; servegen-mm is validation, the others test, never fitted on.",
        "",
    ]
    for slo in SLOS:
        group = [r for r in results if r.slo == slo]
        if not group:
            continue
        body += [f"### {_slo_text(slo)}", ""]
        rows = []
        names = [m.name for m in group[0].train] + [m.name for m in group[0].held_out]
        for i, name in enumerate(names):
            mixes = [(r.train + r.held_out)[i] for r in group]
            part = "train" if i < len(group[0].train) else ROLES[name]
            label = f"{TRAIN}, {name}" if i < len(group[0].train) else name
            f = np.mean([m.features for m in mixes], axis=0)
            ratios = [
                _ratio_text([predict(u, r.train[0], r.costs, m) / m.mu for r, m in zip(group, mixes, strict=True)])
                for u in UNITS
            ]
            rows.append([label, part, f"{np.mean([m.mu for m in mixes]):.2f}", f"{f[1]:.0f}", f"{f[2]:.0f}",
                         f"{f[3]:.2f}", *ratios])  # fmt: skip
        body += [
            table(["mix", "part", "μ_SLO req/s", "prompt tok", "output tok", "images", *UNITS], rows),
            "",
        ]
        costs = np.mean([r.costs for r in group], axis=0)
        body += [
            "Fitted costs (mean over seeds), replica-ms: "
            + ", ".join(f"{1000 * c:.3g} per {n}" for c, n in zip(costs, FEATURES, strict=True))
            + ".",
            "",
        ]
    return "\n".join(body)


def main(docs: Path, seeds: Sequence[int], progress: Callable[[str], None], command: str) -> int:
    start = time.monotonic()
    results = []
    for slo in SLOS:
        for seed in seeds:
            progress(f"{_slo_text(slo)}, seed {seed}")
            results.append(run_seed(seed, slo))
    text = render(results, command, time.monotonic() - start)
    print(text)
    write_section(docs, "mix", "Which unit a replica's capacity holds in when the mix changes (digital twin)", text)
    return 0
