"""``mmfleet bench tune``: each baseline tuned the way its users would, on the training traces only.

For every baseline family, every setting of ``baselines.grid`` runs on the training scenarios
(``traces.TRAIN``) for each seed; the pick is fixed in advance (``pick``): the cheapest in GPU-hours
among the settings that meet at least 99% of windows on every training run, else the best attainment.
The picks are frozen in ``tuned.json`` beside this module with the command that made them; the benchmark
reads them back (``frozen``) and never tunes on what it scores. ``score`` is the same harness for any
policy (the shipped ``SloPolicy`` under new constants, say) on the training and validation scenarios.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.autoscale import Profiled, Progress, Row
from mmfleet_lab.bench.baselines import FAMILIES, Profile, Setting, build, grid
from mmfleet_lab.bench.traces import TRAIN, VALIDATION, tuning_scenarios
from mmfleet_lab.twin import H200_QWEN25VL7B, Shipped
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
RELATIVE = (
    "settings are relative to a one-replica profile of the workload (autoscale.profile_of): target_per_inflight × "
    "μ_SLO × mean latency at μ_SLO (Little's law per replica), running_per_inflight likewise, slo_per_profile × one "
    "replica's P90 TTFT and TPOT at μ_SLO, tokens_per_capacity × μ_SLO × mean input and output tokens; baselines.build "
    "makes them absolute for the profile of the scenario being scored (in a sweep, of each training scenario). "
    "target, running_target, ttft_slo and tpot_slo are published defaults, absolute as shipped; a static fleet's "
    "replicas are absolute, sized on the training traces. profile below is the training profile (of "
    f"{TRAIN[0]}) that steps the static fleet's sweep"
)


def training_profile() -> Profile:
    """The profile of the first training trace: where a static fleet's sweep starts."""
    profile = autoscale.profile_of(TRAIN[0], H200_QWEN25VL7B, REFERENCE_SLO)
    _, demand, _ = autoscale.cell(TRAIN[0], COLD_START, H200_QWEN25VL7B, REFERENCE_SLO)
    return replace(profile, mean_replicas=float(np.mean(demand)))


def configured(family: str, setting: Setting) -> Profiled:
    """``family`` at ``setting``, to be built for the profile of whatever workload runs it."""
    return Profiled(family, functools.partial(build, family, setting))


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


def _jobs(scenarios: Sequence[str], seeds: Sequence[int], cold_start: float) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        (n, s): autoscale.cell(n, cold_start, H200_QWEN25VL7B, REFERENCE_SLO, seed=s)[2]
        for n in scenarios
        for s in seeds
    }


def run_many(
    policies: Sequence[Policy | Shipped | Profiled],
    scenarios: Sequence[str],
    seeds: Sequence[int],
    cold_start: float,
    progress: Progress,
    workers: int,
    check: bool = True,
) -> list[tuple[int, Row]]:
    """Every policy on every (scenario, seed): (index of the policy, row), in no particular order; a ``Profiled``
    one built for each scenario's ``autoscale.profile_of``; ``check`` as in ``autoscale._run_policy``."""
    commons = _jobs(scenarios, seeds, cold_start)
    built = {n: autoscale.resolve(policies, autoscale.profile_of(n, H200_QWEN25VL7B, REFERENCE_SLO)) for n in scenarios}
    out: list[tuple[int, Row]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(autoscale._run_policy, n, cold_start, built[n][i], commons[(n, s)], None, check, False): i
            for i in range(len(policies))
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
    """Every ``grid`` setting of each family on ``scenarios`` × ``seeds``, each built for the profile of the
    scenario it runs on (``profile`` steps only the static fleet's grid). It does not check the split:
    ``tune`` does, and the test-tuned report calls this on purpose."""
    settings = [(f, s) for f in families for s in grid(f, profile)]
    policies = [configured(f, s) for f, s in settings]
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
    """Sweep on training scenarios (a test scenario raises ``traces.HeldOutError``), pick, and freeze. Sweeping some
    families only merges them into ``path``, keeping the others' records (each with the command that made it)."""
    scenarios = tuning_scenarios(scenarios)
    profile = training_profile()
    trials = sweep(families, profile, scenarios, seeds, progress, workers)
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() and set(families) != set(FAMILIES) else {}
    if old and (old["scenarios"] != list(scenarios) or old["seeds"] != list(seeds)):
        raise ValueError(f"{path} was tuned on {old['scenarios']}, seeds {old['seeds']}: sweep every family to change")
    if old and old.get("scored_from") != autoscale.SCORED_FROM:
        raise ValueError(f"{path} was scored from {old.get('scored_from', autoscale.WARMUP)} s, this benchmark scores "
                         f"from {autoscale.SCORED_FROM:g} s: sweep every family to change")  # fmt: skip
    commands = {**{f: old.get("commands", {}).get(f, old["command"]) for f in old.get("picked", {})},
                **dict.fromkeys(trials, command)}  # fmt: skip
    picked = {**old.get("picked", {}), **{f: pick(t).setting for f, t in trials.items()}}
    sweeps = {**old.get("sweeps", {}), **{f: [asdict(x) for x in t] for f, t in trials.items()}}
    frozen = {
        "command": old.get("command", command),  # what made the whole file; "commands": each family's sweep
        "commands": {f: commands[f] for f in FAMILIES if f in picked},
        "rule": RULE,
        "relative": RELATIVE,
        "scenarios": list(scenarios),
        "seeds": list(seeds),
        "cold_start": COLD_START,
        "scored_from": autoscale.SCORED_FROM,
        "profile": asdict(profile),
        "picked": {f: picked[f] for f in FAMILIES if f in picked},
        "sweeps": {f: sweeps[f] for f in FAMILIES if f in sweeps},
    }
    path.write_text(json.dumps(frozen, indent=1, ensure_ascii=False) + "\n")
    return frozen


def malformed(record: object) -> str | None:
    """What in a tuned file ``frozen`` and ``bench cache`` could not use as ``tune`` writes it, or None: each pick must
    be one of the settings its family's sweep tries (``grid`` for the file's profile) and be in its sweep's trials, so a
    hand-edited value is named rather than run as a baseline nobody tuned."""
    if not isinstance(record, dict):
        return f"expected a JSON object as `mmfleet bench tune` writes it, not {json.dumps(record)[:40]}"
    for key, kind in (("command", str), ("picked", dict), ("profile", dict), ("sweeps", dict)):
        if not isinstance(record.get(key), kind):
            return f"{key}: {json.dumps(record.get(key))[:40]}; expected a JSON {'string' if kind is str else 'object'}"
    fields = [f.name for f in dataclasses.fields(Profile)]
    profile = record["profile"]
    if sorted(profile) != sorted(fields):
        return f"profile: keys {', '.join(sorted(profile))}; expected {', '.join(fields)}"
    for key, value in profile.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            return f"profile.{key}: {json.dumps(value)}; expected a number above 0"
    if not record["picked"]:
        return f"picked: no baseline; expected settings for some of {', '.join(FAMILIES)}"
    for family, setting in record["picked"].items():
        if family not in FAMILIES:
            return f"picked.{family}: not a baseline; accepted: {', '.join(FAMILIES)}"
        swept = grid(family, Profile(**profile))
        if setting not in swept:
            return (
                f"picked.{family}: {json.dumps(setting)[:120]}; expected one of the {len(swept)} settings "
                f"`mmfleet bench tune` sweeps for {family} (baselines.grid), e.g. {json.dumps(swept[0])}"
            )
        trials = record["sweeps"].get(family)
        if not isinstance(trials, list) or not any(isinstance(t, dict) and t.get("setting") == setting for t in trials):
            return f"sweeps.{family}: no trial of the picked setting; expected the sweep `mmfleet bench tune` wrote"
    return None


def frozen(path: Path = TUNED) -> tuple[list[Profiled], dict[str, Any]]:
    """The frozen baselines, in ``FAMILIES`` order, each to be built for the profile of the workload it runs on,
    and the file's record."""
    record = json.loads(path.read_text())
    problem = malformed(record)
    if problem:
        raise ValueError(problem)
    picked: dict[str, Setting] = record["picked"]
    policies = [configured(f, picked[f]) for f in FAMILIES if f in picked]
    training = Profile(**record["profile"])
    for p in policies:  # a malformed setting fails here, before any run, not in a worker
        p.make(training)
    return policies, record


def score(
    policy: Policy | Shipped | Profiled,
    scenarios: Sequence[str] = (*TRAIN, *VALIDATION),
    seeds: Sequence[int] = autoscale.SEEDS,
    cold_start: float = COLD_START,
    progress: Progress = lambda _: None,
    workers: int = os.cpu_count() or 1,
) -> list[Row]:
    """``policy`` on training and validation scenarios (never a test one: raises ``HeldOutError``), one row
    per (scenario, seed), for whoever tunes a policy with this harness; a ``Profiled`` one is built for each
    scenario's one-replica profile."""
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
        f"{record['cold_start']:g} s. Rule, fixed before the sweep: {record['rule']}. Settings are relative to a "
        "one-replica profile of the workload, made absolute for the profile of the scenario each run scores (in "
        "the sweep, each training scenario's; in the held-out tables, the scored scenario's): in-flight targets "
        "as multiples of Little's law per replica (μ_SLO × the mean latency of one replica fed Poisson arrivals at "
        "μ_SLO), llm-d's latency SLOs as multiples of that replica's P90 TTFT and TPOT, Dynamo's tokens per "
        "replica as multiples of its profiler's μ_SLO × mean tokens; published defaults stay absolute. On the "
        f"first training trace: μ_SLO {p['capacity']:.1f} req/s × mean latency {p['mean_latency']:.2f} s = "
        f"{p['capacity'] * p['mean_latency']:.1f} in flight per replica, P90 TTFT {p['p90_ttft']:.2f} s, P90 TPOT "
        f"{1000 * p['p90_tpot']:.0f} ms, {p['isl']:.0f} tokens in and {p['osl']:.0f} out; the static fleet's "
        f"replicas are absolute, stepped from its mean need, {p['mean_replicas']:.1f} replicas. Families swept by "
        "another command than the above: "
        + (", ".join(f"{f} (`{c}`)" for f, c in record.get("commands", {}).items() if c != record["command"]) or "none")
        + ".\n\n"
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
    workers: int = os.cpu_count() or 1,
    path: Path = TUNED,
) -> int:
    """Each baseline's best setting on ``name`` itself, by the same rule: the best it could ever do there.
    Reporting only: nothing is frozen; the frozen training profile steps the static grid, and every setting is
    built for ``name``'s own profile, as in the held-out tables."""
    from mmfleet_lab.bench.report import write_section

    profile = Profile(**json.loads(path.read_text())["profile"])
    trials = sweep(families, profile, [name], seeds, progress, workers)
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
