"""``mmfleet bench tune``: each baseline tuned the way its users would, on the training traces only.

For every baseline family, every setting of ``baselines.grid`` runs on the training scenarios
(``traces.TRAIN``) for each seed; the pick is fixed in advance (``pick``): the cheapest in GPU-hours
among the settings that meet at least 99% of windows on every training run, else the best attainment.
The picks are frozen in ``tuned.json`` beside this module with the command that made them; the benchmark
reads them back (``frozen``) and never tunes on what it scores. ``score`` is the same harness for any
policy (the shipped ``SloPolicy`` under new constants, say) on the training and validation scenarios.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.autoscale import Progress, Row
from mmfleet_lab.bench.baselines import FAMILIES, Profile, Setting, build, grid
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.bench.traces import TRAIN, VALIDATION, tuning_scenarios
from mmfleet_lab.twin import H200_QWEN25VL7B, ReplicaParams, Scenario, Shipped, simulate
from mmfleet_lab.twin.policy import Policy
from mmfleet_lab.twin.scenarios import REFERENCE_SLO

TUNED = Path(__file__).resolve().parent / "tuned.json"
MEETS = 0.99  # the rule's attainment bar, on every training run
COLD_START = 90.0
SWEEP_SEEDS = (0, 1)
RULE = (
    f"the cheapest setting (mean GPU-hours over the training runs) whose every training run met ≥ {MEETS:.0%} of "
    "windows; if none did, the one with the best worst-run attainment"
)


@dataclass(frozen=True)
class Trial:
    """One setting of one baseline over the tuning runs."""

    family: str
    setting: Mapping[str, float | str]
    attainment: float  # mean over the runs
    worst_attainment: float
    gpu_hours: float  # mean over the runs
    violation_minutes: float  # mean over the runs
    fewest_actions_per_hour: float  # over the runs: 0 for a scaling policy means it never acted in one


def pick(trials: Sequence[Trial]) -> Trial:
    """The rule fixed before any sweep ran (``RULE``), among the settings that acted in every run (a static
    fleet never acts); an inert setting is a broken model, never a pick."""
    acting = [t for t in trials if t.family == "static" or t.fewest_actions_per_hour > 0]
    if not acting:
        raise ValueError(f"{trials[0].family}: no setting scaled in every training run")
    meeting = [t for t in acting if t.worst_attainment >= MEETS]
    if meeting:
        return min(meeting, key=lambda t: (t.gpu_hours, -t.attainment))
    return max(acting, key=lambda t: (t.worst_attainment, t.attainment, -t.gpu_hours))


PROFILE_SECONDS = 900.0  # the one-replica run that measures the mean latency at μ_SLO


def measure_profile(params: ReplicaParams = H200_QWEN25VL7B, name: str = TRAIN[0], seed: int = 0) -> Profile:
    """What a user reads off the training trace: μ_SLO, and the mean latency of one replica fed Poisson
    arrivals at μ_SLO from the trace's mix (as a profiler does), so Little's law gives the in-flight count per
    replica at capacity; the mean tokens per request; the replica's vLLM limits."""
    capacity, demand, _ = autoscale.cell(name, COLD_START, params, REFERENCE_SLO, seed=seed)
    req = autoscale.scenario_of(name, params, REFERENCE_SLO, None, seed).requests
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / capacity, size=int(capacity * PROFILE_SECONDS)))
    probe = Scenario(f"{name}-profile", req.take(rng.integers(0, len(req), arrival.size), arrival), PROFILE_SECONDS)
    one = simulate(probe, StaticPolicy(1), params=params, cold_start=COLD_START, slo=REFERENCE_SLO,
                   min_replicas=1, max_replicas=1, initial_replicas=1, seed=seed)  # fmt: skip
    steady = (one.arrival >= PROFILE_SECONDS / 5) & np.isfinite(one.e2e)
    return Profile(
        capacity=capacity,
        mean_latency=float(np.mean(one.e2e[steady])),
        isl=float(np.mean(req.input_tokens + req.images * np.asarray(req.tokens_per_image))),
        osl=float(np.mean(req.output_tokens)),
        max_num_seqs=params.max_num_seqs,
        kv_capacity_tokens=float(params.kv_capacity_tokens),
        mean_replicas=float(np.mean(demand)),
    )


def _jobs(scenarios: Sequence[str], seeds: Sequence[int], cold_start: float) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        (n, s): autoscale.cell(n, cold_start, H200_QWEN25VL7B, REFERENCE_SLO, seed=s)[2]
        for n in scenarios
        for s in seeds
    }


def run_many(
    policies: Sequence[Policy | Shipped],
    scenarios: Sequence[str],
    seeds: Sequence[int],
    cold_start: float,
    progress: Progress,
    workers: int,
    check: bool = True,
) -> list[tuple[int, Row]]:
    """Every policy on every (scenario, seed): (index of the policy, row), in no particular order; ``check``
    as in ``autoscale._run_policy``."""
    commons = _jobs(scenarios, seeds, cold_start)
    out: list[tuple[int, Row]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(autoscale._run_policy, n, cold_start, p, commons[(n, s)], None, check, False): i
            for i, p in enumerate(policies)
            for n in scenarios
            for s in seeds
        }
        for k, f in enumerate(as_completed(futures), 1):
            row = f.result()[0][0]
            out.append((futures[f], row))
            progress(f"   [{k}/{len(futures)}] {row.scenario} seed {row.seed} {row.policy}: "
                     f"{row.attainment:.1%} windows, {row.gpu_hours:.1f} GPU-h")  # fmt: skip
    return out


def sweep(
    families: Sequence[str],
    profile: Profile,
    scenarios: Sequence[str],
    seeds: Sequence[int],
    progress: Progress,
    workers: int = os.cpu_count() or 1,
    cold_start: float = COLD_START,
) -> dict[str, list[Trial]]:
    """Every ``grid`` setting of each family on ``scenarios`` × ``seeds``. It does not check the split:
    ``tune`` does, and the test-tuned report calls this on purpose."""
    settings = [(f, s) for f in families for s in grid(f, profile)]
    policies = [build(f, s, profile) for f, s in settings]
    rows: dict[int, list[Row]] = {}
    for i, row in run_many(policies, scenarios, seeds, cold_start, progress, workers, check=False):
        rows.setdefault(i, []).append(row)
    trials: dict[str, list[Trial]] = {}
    for i, (family, setting) in enumerate(settings):
        r = rows[i]
        trials.setdefault(family, []).append(
            Trial(
                family,
                dict(setting),
                float(np.mean([x.attainment for x in r])),
                float(min(x.attainment for x in r)),
                float(np.mean([x.gpu_hours for x in r])),
                float(np.mean([x.violation_minutes for x in r])),
                float(min(x.actions_per_hour for x in r)),
            )
        )
    return trials


def tune(
    families: Sequence[str],
    scenarios: Sequence[str],
    seeds: Sequence[int],
    progress: Progress,
    command: str,
    workers: int = os.cpu_count() or 1,
    path: Path = TUNED,
) -> dict[str, Any]:
    """Sweep on training scenarios (a test scenario raises ``traces.HeldOutError``), pick, and freeze."""
    scenarios = tuning_scenarios(scenarios)
    profile = measure_profile()
    trials = sweep(families, profile, scenarios, seeds, progress, workers)
    frozen = {
        "command": command,
        "rule": RULE,
        "scenarios": list(scenarios),
        "seeds": list(seeds),
        "cold_start": COLD_START,
        "profile": asdict(profile),
        "picked": {f: pick(t).setting for f, t in trials.items()},
        "sweeps": {f: [asdict(x) for x in t] for f, t in trials.items()},
    }
    path.write_text(json.dumps(frozen, indent=1, ensure_ascii=False) + "\n")
    return frozen


def frozen(path: Path = TUNED) -> tuple[list[Policy], dict[str, Any]]:
    """The frozen baselines, in ``FAMILIES`` order, and the file's record."""
    record: dict[str, Any] = json.loads(path.read_text())
    profile = Profile(**record["profile"])
    picked: dict[str, Setting] = record["picked"]
    return [build(f, picked[f], profile) for f in FAMILIES if f in picked], record


def score(
    policy: Policy | Shipped,
    scenarios: Sequence[str] = (*TRAIN, *VALIDATION),
    seeds: Sequence[int] = autoscale.SEEDS,
    cold_start: float = COLD_START,
    progress: Progress = lambda _: None,
    workers: int = os.cpu_count() or 1,
) -> list[Row]:
    """``policy`` on training and validation scenarios (never a test one: raises ``HeldOutError``), one row
    per (scenario, seed), for whoever tunes a policy with this harness."""
    return [row for _, row in run_many([policy], tuning_scenarios(scenarios), seeds, cold_start, progress, workers)]


def plot_sweeps(trials: Mapping[str, Sequence[Trial]], picked: Mapping[str, Setting], title: str, path: Path) -> None:
    """One panel per baseline: every setting's mean GPU-hours against its mean attainment, the pick starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(trials)
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(families) / cols), cols, figsize=(16, 4 * math.ceil(len(families) / cols)))
    for ax, family in zip(np.ravel(axes), families, strict=False):
        points = trials[family]
        ax.scatter([t.gpu_hours for t in points], [100 * t.attainment for t in points], s=20)
        best = [t for t in points if dict(t.setting) == dict(picked[family])]
        ax.scatter([t.gpu_hours for t in best], [100 * t.attainment for t in best], marker="*", s=200, color="red")
        ax.axhline(100 * MEETS, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(family, fontsize=10)
        ax.set_xlabel("GPU-h (mean)")
        ax.set_ylabel("windows met % (mean)")
        ax.grid(alpha=0.3)
    for ax in np.ravel(axes)[len(families) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def describe(setting: Mapping[str, float | str]) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float | int) else f"{k}={v}" for k, v in setting.items())


def trials_of(record: Mapping[str, Any]) -> dict[str, list[Trial]]:
    return {f: [Trial(**t) for t in ts] for f, ts in record["sweeps"].items()}


def _picks_table(trials: Mapping[str, Sequence[Trial]], picked: Mapping[str, Setting]) -> str:
    from mmfleet_lab.bench.report import table

    body = []
    for family, points in trials.items():
        best = next(t for t in points if dict(t.setting) == dict(picked[family]))
        body.append([family, describe(best.setting), f"{100 * best.attainment:.1f}",
                     f"{100 * best.worst_attainment:.1f}", f"{best.gpu_hours:.1f}", f"{best.violation_minutes:.1f}",
                     str(len(points))])  # fmt: skip
    headers = ["baseline", "setting picked", "windows met % (mean)", "worst run %", "GPU-h (mean)", "violation-min",
               "settings tried"]  # fmt: skip
    return table(headers, body)


def write_docs(record: Mapping[str, Any], docs: Path, plots: Path) -> None:
    """The frozen picks and each baseline's sweep (a Pareto panel per baseline) in the autoscale part of the docs."""
    from mmfleet_lab.bench.report import write_section

    trials = trials_of(record)
    plot_sweeps(trials, record["picked"], "each baseline's settings on the training traces (★ frozen)",
                plots / "autoscale-sweeps.png")  # fmt: skip
    p = record["profile"]
    body = (
        f"Command: `{record['command']}`, frozen in `operator/mmfleet_lab/bench/tuned.json`. Scenarios "
        f"{', '.join(record['scenarios'])} (training), seeds {', '.join(map(str, record['seeds']))}, cold start "
        f"{record['cold_start']:g} s. Rule, fixed before the sweep: {record['rule']}. In-flight targets are absolute, "
        f"stepped around Little's law on the training trace: μ_SLO {p['capacity']:.1f} req/s × mean latency "
        f"{p['mean_latency']:.2f} s = {p['capacity'] * p['mean_latency']:.1f} in flight per replica (the mean "
        f"latency of a static fleet at the trace's mean need, {p['mean_replicas']:.1f} replicas). Dynamo's profile "
        f"is its profiler's method on this replica: the highest rate meeting the SLO on one replica (μ_SLO) times "
        f"the training trace's mean tokens ({p['isl']:.0f} in, {p['osl']:.0f} out).\n\n"
        + _picks_table(trials, record["picked"])
        + "\n\n![each baseline's sweep](img/autoscale-sweeps.png)\n"
    )
    write_section(docs, "autoscale-tune", "Baselines tuned on the training traces", body)


def report_test_tuned(
    name: str,
    families: Sequence[str],
    seeds: Sequence[int],
    docs: Path,
    plots: Path,
    progress: Progress,
    command: str,
    path: Path = TUNED,
) -> int:
    """Each baseline's best setting on ``name`` itself, by the same rule: the best it could ever do there.
    Reporting only: nothing is frozen, and the frozen profile (training) is reused for the grid."""
    from mmfleet_lab.bench.report import write_section

    profile = Profile(**json.loads(path.read_text())["profile"])
    trials = sweep(families, profile, [name], seeds, progress)
    picked = {f: pick(t).setting for f, t in trials.items()}
    stem = f"autoscale-test-tuned-{name.replace('@', '-')}"
    title = f"each baseline's settings on {name} (test trace; ★ best there)"
    plot_sweeps(trials, picked, title, plots / f"{stem}.png")
    body = (
        f"Command: `{command}`. **Tuned on the test scenario {name} itself**, seeds {', '.join(map(str, seeds))}, "
        f"cold start {COLD_START:g} s, same grid and rule: the best each baseline could ever do there, for "
        "reporting; nothing here is frozen or used by the held-out tables.\n\n"
        + _picks_table(trials, picked)
        + f"\n\n![each baseline's sweep on {name}](img/{stem}.png)\n"
    )
    write_section(docs, stem, f"Baselines tuned on the test scenario {name} (the best they could do)", body)
    return 0
