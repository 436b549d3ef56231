"""The lab's sub-commands of ``mmfleet``: ``demo``, ``bench``, ``cluster`` and ``twin``.

``mmfleet.cli`` finds ``register`` through the ``mmfleet.commands`` entry point, so the operator
never imports the lab and ``mmfleet run`` works where the lab is not installed.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfleet.cli import EXIT_INVALID
from mmfleet_lab.cluster import register_cli

if TYPE_CHECKING:
    from mmfleet_lab.twin.scenarios import TraceFile


def cmd_demo(_: argparse.Namespace) -> int:
    from mmfleet_lab.demo import run_demo

    return run_demo()


def cmd_bench_operator(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import operator_scale

    return operator_scale.main(
        args.count or [100], Path(args.docs), args.timeout, _progress, args.floor, args.floor_watched
    )


def cmd_bench_foreign(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import foreign

    return foreign.main(args.configmaps, args.pods, Path(args.docs), _progress)


def cmd_bench_faults(args: argparse.Namespace) -> int:
    from mmfleet_lab import faults_api, faults_crash

    for flag, value in (("--kills", args.kills), ("--api-trials", args.api_trials)):
        if value < 0:
            print(f"{flag}: {value}: must be 0 (none) or more", file=sys.stderr)
            return EXIT_INVALID
    if not args.kills and not args.api_trials:
        print("--kills 0 and --api-trials 0: nothing to run; give either a positive count", file=sys.stderr)
        return EXIT_INVALID
    status = faults_crash.main(args.kills, args.seed, Path(args.docs), _progress) if args.kills else 0
    if args.api_trials:
        status = max(status, faults_api.main(args.api_trials, Path(args.docs), _progress))
    return status


def cmd_bench_fuzz(args: argparse.Namespace) -> int:
    from mmfleet_lab import fuzz

    if args.count < 2:
        print(f"--count {args.count}: at least 2 (half drawn from the schema, half mutated examples)", file=sys.stderr)
        return EXIT_INVALID
    if args.batch < 1:
        print(f"--batch {args.batch}: at least 1 fleet at a time", file=sys.stderr)
        return EXIT_INVALID
    report = Path(args.report) if args.report else None
    return fuzz.main(args.seed or [13], args.count, args.live, Path(args.docs), _progress, args.batch, report)


def _trace(args: argparse.Namespace) -> TraceFile | str | None:
    """The user's ``--trace`` read once (so a bad file is reported before the benchmark starts, not met in a
    worker), None without one, or why it cannot be used."""
    from mmfleet_lab.twin.scenarios import TraceFile

    if not args.trace:
        return None
    if not args.time_column:
        return f"--time-column: required with --trace {args.trace} (the name of its timestamp column)"
    trace = TraceFile(
        path=args.trace,
        time_column=args.time_column,
        input_column=args.input_column,
        output_column=args.output_column,
        images_column=args.images_column,
        count_column=args.count_column,
        time_scale=args.time_scale,
    )
    problem = _unreadable("--trace", args.trace, lambda: _load_trace(trace))
    return problem if problem else trace


def cmd_bench_autoscale(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import autoscale, traces, tune
    from mmfleet_lab.twin import Shipped
    from mmfleet_lab.twin.scenarios import changes_mix

    trace = _trace(args)
    if isinstance(trace, str):
        print(trace, file=sys.stderr)
        return EXIT_INVALID
    frozen = _frozen(args.tuned)
    if isinstance(frozen, str):
        print(frozen, file=sys.stderr)
        return EXIT_INVALID
    if args.quick:
        default, colds = [QUICK_CELL], [tune.COLD_START]
    else:
        default, colds = [*traces.TRAIN, *traces.VALIDATION, *traces.TEST], list(autoscale.COLD_STARTS)
    scenarios = args.scenario or (["trace"] if trace is not None else default)
    shifted = [s for s in scenarios if changes_mix(s)]
    if shifted and len(shifted) < len(scenarios):
        others = ", ".join(s for s in scenarios if s not in shifted)
        print(f"--scenario: {', '.join(shifted)} change the request mix and are written to a section of their own; "
              f"run them apart from {others}", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    baselines, record = frozen
    profiled = autoscale.Profiled(PROFILED, lambda p: Shipped(PROFILED, capacity_per_replica=p.capacity))
    policies = [Shipped(), profiled, *baselines]
    if not 1.0 <= args.start_oversized <= 100.0:
        print(f"--start-oversized: {args.start_oversized:g}; from 1 to 100 (times the warm-up fleet)", file=sys.stderr)
        return EXIT_INVALID
    names = [p.name for p in policies]
    unknown = sorted(set(args.policy or ()) - set(names))
    if unknown:
        print(f"--policy: {', '.join(unknown)} is not a policy; accepted: {', '.join(names)}", file=sys.stderr)
        return EXIT_INVALID
    return autoscale.main(
        scenarios,
        args.cold_start or colds,
        Path(args.docs),
        Path(args.plots),
        _progress,
        [p for p in policies if not args.policy or p.name in args.policy],
        seeds=args.seed or list(autoscale.SEEDS),
        trace=trace,
        oracle=not args.no_oracle,
        tuned_from=f"`{record['command']}`, {args.tuned}",
        only=args.policy or (),
        oversize=args.start_oversized,
    )


def _load_trace(trace: TraceFile) -> None:
    import numpy as np

    from mmfleet_lab.twin.scenarios import base_requests, traces_dir

    base_requests("trace", traces_dir(), np.random.default_rng(0), trace=trace)


def _unreadable(flag: str, path: str, read: Callable[[], object]) -> str | None:
    """Why the file given with ``flag`` cannot be used (missing, a directory, not UTF-8, empty, malformed), or None."""
    try:
        read()
    except UnicodeDecodeError as error:
        return f"{flag} {path}: not UTF-8 text (byte {error.object[error.start]:#04x})"
    except OSError as error:
        return f"{flag} {path}: {error.strerror or error}"
    except KeyError as error:
        return f"{flag} {path}: no key {error}"
    except (ValueError, TypeError, OverflowError, csv.Error) as error:  # malformed CSV or JSON, a missing column
        return f"{flag} {path}: {str(error).removeprefix(f'{path}: ')}"  # the readers name the file too
    return None


def _unwritable(flag: str, path: Path, folder: bool) -> str | None:
    """Why ``path`` (a folder to write into, with ``folder``, else a file to write) could not be written, or None: an
    existing file must be readable text (a docs file's other sections are kept) and writable, a new one's nearest
    existing ancestor a folder one may write in."""
    if path.exists():
        if folder != path.is_dir():
            return f"{flag} {path}: {'not a folder' if folder else 'a folder'}; expected {_WRITES[folder]}"
        problem = None if folder else _unreadable(flag, str(path), path.read_text)
        if problem is None and not os.access(path, os.W_OK):
            problem = f"{flag} {path}: not writable; expected {_WRITES[folder]}"
        return problem
    above = next(p for p in path.parents if p.exists())
    if not above.is_dir():
        return f"{flag} {path}: {above} is not a folder; expected {_WRITES[folder]}"
    return None if os.access(above, os.W_OK) else f"{flag} {path}: {above} is not writable; expected {_WRITES[folder]}"


_WRITES = {True: "a folder for the plots", False: "a file it can write"}


def _outputs_checked(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, refused at once when its ``--docs`` or ``--plots`` could not be written: a benchmark runs minutes
    to hours before it writes them, and its results would be lost."""

    def checked(args: argparse.Namespace) -> int:
        outputs = [("--docs", getattr(args, "docs", None), False), ("--plots", getattr(args, "plots", None), True)]
        for flag, value, folder in outputs:
            problem = (
                None if value is None or getattr(args, "no_docs", False) else _unwritable(flag, Path(value), folder)
            )
            if problem:
                print(problem, file=sys.stderr)
                return EXIT_INVALID
        return command(args)

    return checked


def _frozen(path: str) -> tuple[list[Any], dict[str, Any]] | str:
    """The baselines frozen in ``--tuned`` and its record, or why the file cannot be used."""
    from mmfleet_lab.bench import tune

    frozen: list[tuple[list[Any], dict[str, Any]]] = []
    problem = _unreadable("--tuned", path, lambda: frozen.append(tune.frozen(Path(path))))
    return problem if problem else frozen[0]


def cmd_bench_reachable(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import reachable
    from mmfleet_lab.twin.scenarios import NAMES

    trace = _trace(args)
    if isinstance(trace, str):
        print(trace, file=sys.stderr)
        return EXIT_INVALID
    scenarios = args.scenario or (["trace"] if trace is not None else list(REACHABLE_CELLS))
    unknown = [s for s in scenarios if s not in NAMES]
    if unknown:
        print(f"--scenario: {', '.join(unknown)} is not a scenario; accepted: {', '.join(NAMES)}", file=sys.stderr)
        return EXIT_INVALID
    colds = args.cold_start or [90.0]
    odd = [c for c in colds if c <= 0 or not float(c).is_integer()]
    if odd:
        print(f"--cold-start: {', '.join(f'{c:g}' for c in odd)}: the oracle plans in whole seconds; give a whole "
              "number of seconds above 0, e.g. 90", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    if args.workers < 1:
        print(f"--workers: {args.workers}; at least 1", file=sys.stderr)
        return EXIT_INVALID
    return reachable.main(scenarios, colds, args.seed or [0, 1, 2], Path(args.docs), _progress, args.workers, trace)


def cmd_bench_cache(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import cache

    seeds = args.seed or [0, 1, 2, 3, 4]
    scenarios = args.scenario or list(REACHABLE_CELLS)
    size = cache.WEIGHT_BYTES if args.weight_bytes is None else args.weight_bytes
    download = cache.DOWNLOAD_MBPS if args.download_mbps is None else args.download_mbps
    read = cache.SHARED_READ_MBPS if args.shared_read_mbps is None else args.shared_read_mbps
    try:
        cache.check_flags(scenarios, seeds, args.workers)
        cache.cold_starts(size, download, read)
    except cache.FlagError as error:
        print(error, file=sys.stderr)
        return EXIT_INVALID
    frozen = _frozen(args.tuned)
    if isinstance(frozen, str):
        print(frozen, file=sys.stderr)
        return EXIT_INVALID
    baselines, record = frozen
    return cache.main(
        scenarios, seeds, Path(args.docs), _progress, baselines, record, f"`{record['command']}`",
        weight_bytes=size, download_mbps=download, shared_read_mbps=read, workers=args.workers,
    )  # fmt: skip


def cmd_bench_routing(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import routing

    if args.workers < 1:
        print(f"--workers: {args.workers}; at least 1", file=sys.stderr)
        return EXIT_INVALID
    if args.spike:
        from mmfleet_lab.bench import picker_signal

        return picker_signal.main(
            Path(args.docs), routing.sizing(), _progress, args.seed or list(routing.SEEDS), args.workers
        )
    return routing.main(Path(args.docs), _progress, args.seed or list(routing.SEEDS), args.workers)


def cmd_bench_mix(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import mix

    seeds = args.seed or list(mix.SEEDS)
    command = "mmfleet bench mix " + " ".join(f"--seed {s}" for s in seeds)
    return mix.main(Path(args.docs), seeds, _progress, command)


def cmd_bench_idle(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import idle

    if args.workers < 1:
        print(f"--workers: {args.workers}; at least 1", file=sys.stderr)
        return EXIT_INVALID
    return idle.main(Path(args.docs), _progress, args.seed or list(idle.SEEDS), args.workers)


def cmd_bench_encode(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import encode

    seeds = args.seed or list(encode.SEEDS)
    return encode.main(None if args.no_docs else Path(args.docs), _progress, seeds, args.split)


QUICK_CELL = "spike-x4@azure-code"
REACHABLE_CELLS = ("azure-code", "servegen-language", "servegen-reason", QUICK_CELL)
# The shipped autoscaler given spec.autoscaling.capacityPerReplica: μ_SLO of the scored workload's one-replica
# profile (autoscale.profile_of), the profile every baseline is configured from, as a user who profiled a replica
# on their own traffic would set it.
PROFILED = "mmfleet-profiled"


def cmd_bench_tune(args: argparse.Namespace) -> int:
    from mmfleet_lab.bench import tune
    from mmfleet_lab.bench.baselines import FAMILIES
    from mmfleet_lab.bench.traces import TRAIN, HeldOutError

    families = args.family or list(FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or args.workers < 1:
        print(f"--family: {', '.join(unknown)}; choose from {', '.join(FAMILIES)}" if unknown
              else f"--workers: {args.workers}; at least 1", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    seeds = args.seed or list(tune.SWEEP_SEEDS)
    flags = [*(f"--family {f}" for f in args.family or ()), *(f"--seed {s}" for s in seeds)]
    if args.report_on:
        command = " ".join(["mmfleet bench tune", f"--report-on {args.report_on}", *flags])
        return tune.report_test_tuned(
            args.report_on, families, seeds, Path(args.docs), Path(args.plots), _progress, command, args.workers
        )
    problem = _unwritable("--tuned", Path(args.tuned), folder=False)  # where the sweep's record goes, at its end
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_INVALID
    scenarios = args.scenario or list(TRAIN)
    command = " ".join(["mmfleet bench tune", *(f"--scenario {s}" for s in scenarios), *flags])
    try:
        record = tune.tune(families, scenarios, seeds, _progress, command, args.workers, Path(args.tuned))
    except (HeldOutError, ValueError) as error:
        print(f"mmfleet bench tune: {error}", file=sys.stderr)
        return EXIT_INVALID
    tune.write_docs(record, Path(args.docs), Path(args.plots))
    return 0


def cmd_twin_serve(args: argparse.Namespace) -> int:
    from mmfleet_lab.cluster import ClusterError
    from mmfleet_lab.twin import serve

    try:
        spikes = tuple(serve.Spike.parse(text) for text in args.spike)
        spec = serve.TrafficSpec(
            name=args.scenario,
            rate=args.rate,
            spikes=spikes,
            duration=args.duration,
            seed=args.seed,
            traces=Path(args.traces) if args.traces else None,
        )
        from mmfleet import telemetry

        otlp = args.otlp_endpoint if args.otlp_endpoint is not None else telemetry.endpoint()
        return serve.serve(args.cluster, spec, port=args.port, profile=args.profile, otlp_endpoint=otlp or None)
    except ValueError as error:
        print(f"mmfleet twin serve: {error}", file=sys.stderr)
        return EXIT_INVALID
    except (ClusterError, FileNotFoundError, OSError) as error:
        print(f"mmfleet twin serve: {error}", file=sys.stderr)
        return 1


def cmd_twin_profile(args: argparse.Namespace) -> int:
    """What a profiling run would measure: the highest steady rate one replica holds with the SLO met."""
    import numpy as np
    from pydantic import ValidationError

    from mmfleet.api import SloSpec
    from mmfleet_lab.twin import capacity_at_slo
    from mmfleet_lab.twin.replica import PROFILES
    from mmfleet_lab.twin.scenarios import base_requests, traces_dir

    try:
        slo = SloSpec(metric=args.metric, percentile=args.percentile, target=args.target)
    except ValidationError as error:
        print(f"mmfleet twin profile: {'; '.join(e['msg'] for e in error.errors())}", file=sys.stderr)
        return EXIT_INVALID
    folder = traces_dir(Path(args.traces) if args.traces else None)
    loaded: list[Any] = []
    problem = _unreadable(
        "--traces",
        str(folder),
        lambda: loaded.append(base_requests(args.mix, folder, np.random.default_rng(args.seed))),
    )
    if problem:
        print(f"mmfleet twin profile: {problem}", file=sys.stderr)
        return EXIT_INVALID
    mix, _ = loaded[0]
    capacity = capacity_at_slo(PROFILES[args.profile], mix, slo)
    if capacity <= 0:
        print(f"mmfleet twin profile: --target {args.target}: no steady rate meets P{slo.percentile:g} {slo.metric} "
              f"<= {slo.target} on one {args.profile} replica with {args.mix}'s mix; a longer target would",
              file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    print(
        f"# {args.profile}, {args.mix}'s request mix: {capacity:.3g} req/s per replica meet "
        f"P{slo.percentile:g} {slo.metric} <= {slo.target}\n"
        f"spec:\n  autoscaling:\n    capacityPerReplica: {capacity:.3g}"
    )
    return 0


def _tuned() -> str:
    """``bench/tuned.json`` beside ``bench.tune`` (``tune.TUNED``), without importing the benchmark."""
    return str(Path(__file__).resolve().parent / "bench" / "tuned.json")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _trace_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that describe a user's own trace (``_trace`` reads them)."""
    parser.add_argument("--trace", help="your own CSV: one row per request, or a request count per window")
    parser.add_argument("--time-column", help="its timestamp column (seconds, or date-times)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply the times by this to get seconds")
    parser.add_argument("--input-column", help="prompt tokens column (default: the ServeGen mix)")
    parser.add_argument("--output-column", help="output tokens column (default: the ServeGen mix)")
    parser.add_argument("--images-column", help="images per request column (default: ServeGen's share)")
    parser.add_argument("--count-column", help="requests per window: the file is a count series, not requests")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the lab's sub-commands to the ``mmfleet`` parser."""
    p_demo = sub.add_parser("demo", help="local control plane, operator, examples: watch them become Ready")
    p_demo.set_defaults(func=cmd_demo)

    p_bench = sub.add_parser("bench", help="benchmarks; each writes its table to docs/benchmarks.md")
    bench = p_bench.add_subparsers(dest="bench", required=True)
    p_bop = bench.add_parser("operator", help="N resources on the local control plane: time to Ready, cost, memory")
    p_bop.add_argument("--count", type=int, action="append", help="resources per run (repeatable; default 100)")
    p_bop.add_argument("--timeout", type=float, default=300, help="seconds to wait for all Ready after the last apply")
    p_bop.add_argument("--docs", default="docs/benchmarks.md", help="where the table is written")
    p_bop.add_argument(
        "--floor", action="store_true", help="also apply the children with no operator: what the cluster alone needs"
    )
    p_bop.add_argument(
        "--floor-watched",
        action="store_true",
        help="--floor, and once more with the operator's watches held open: what serving them costs the API server",
    )
    p_bop.set_defaults(func=cmd_bench_operator)
    p_bfo = bench.add_parser("foreign", help="the operator with no fleet while the cluster's other objects churn")
    p_bfo.add_argument("--configmaps", type=int, default=2000, help="ConfigMaps created and patched (default 2000)")
    p_bfo.add_argument("--pods", type=int, default=300, help="pods created and run (default 300)")
    p_bfo.add_argument("--docs", default="docs/benchmarks.md", help="where the table is written")
    p_bfo.set_defaults(func=cmd_bench_foreign)
    p_bfa = bench.add_parser(
        "faults", help="SIGKILL the operator mid-reconcile N times, then API server faults through a proxy M times each"
    )
    p_bfa.add_argument("--kills", type=int, default=100, help="crash trials, one SIGKILL each (default 100; 0: none)")
    p_bfa.add_argument("--api-trials", type=int, default=5, help="trials of each API server fault (default 5; 0: none)")
    p_bfa.add_argument("--seed", type=int, default=0, help="seed of the operations and kill moments")
    p_bfa.add_argument("--docs", default="docs/reliability.md", help="where the table is written")
    p_bfa.set_defaults(func=cmd_bench_faults)
    p_bfz = bench.add_parser("fuzz", help="generated hostile specs through the API server and the running operator")
    p_bfz.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 13)")
    p_bfz.add_argument("--count", type=int, default=1200, help="generated specs per seed, plus 5 YAML attacks")
    p_bfz.add_argument("--live", action="store_true", help="also create every accepted spec under `mmfleet run`")
    p_bfz.add_argument("--batch", type=int, default=40, help="fleets live at once (default 40)")
    p_bfz.add_argument("--docs", default="docs/reliability.md", help="where the table is written")
    p_bfz.add_argument("--report", help="a JSON file for the counts and a sample of each failure with its spec")
    p_bfz.set_defaults(func=cmd_bench_fuzz)
    p_bas = bench.add_parser("autoscale", help="every policy and the oracle in the digital twin, on real traces")
    p_bas.add_argument("--scenario", action="append", help="scenario (repeatable; default: all)")
    p_bas.add_argument("--cold-start", type=float, action="append", help="cold start L in s (repeatable)")
    p_bas.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_bas.add_argument("--plots", default="docs/img", help="where the PNG plots are written")
    _trace_flags(p_bas)
    p_bas.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-4)")
    p_bas.add_argument("--quick", action="store_true", help=f"one cell: {QUICK_CELL} at 90 s")
    p_bas.add_argument("--no-oracle", action="store_true", help="skip the oracles (10-70 s a cell and seed)")
    p_bas.add_argument("--policy", action="append", help="run only this policy (repeatable; default: all)")
    p_bas.add_argument("--tuned", default=str(_tuned()), help="the baselines' frozen settings (mmfleet bench tune)")
    p_bas.add_argument(
        "--start-oversized", type=float, default=1.0, metavar="X",
        help="start every fleet at X times the warm-up fleet (default 1; a section of its own)",
    )  # fmt: skip
    p_bas.set_defaults(func=cmd_bench_autoscale)
    p_reach = bench.add_parser(
        "reachable",
        help="what a reactive rule or a linear forecast, told each window's exact need, pays to meet every window",
    )
    p_reach.add_argument("--scenario", action="append", help="scenario (repeatable; default: "
                         + ", ".join(REACHABLE_CELLS) + ")")  # fmt: skip
    p_reach.add_argument("--cold-start", type=float, action="append", help="cold start L in s (repeatable; default 90)")
    p_reach.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-2)")
    p_reach.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_reach.add_argument("--workers", type=int, default=2, help="processes (default 2; a spike cell's takes ~8 GB)")
    _trace_flags(p_reach)
    p_reach.set_defaults(func=cmd_bench_reachable)
    p_cache = bench.add_parser(
        "cache", help="the shipped autoscaler and the best tuned baseline at per-replica and shared-cache cold starts"
    )
    p_cache.add_argument("--scenario", action="append", help="scenario (repeatable; default: "
                         + ", ".join(REACHABLE_CELLS) + ")")  # fmt: skip
    p_cache.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-4)")
    p_cache.add_argument("--weight-bytes", type=float, help="bytes of weights a new pod fetches (default: "
                         "Qwen2.5-VL-7B-Instruct's, bf16)")  # fmt: skip
    p_cache.add_argument("--download-mbps", type=float, help="assumed per-pod download from the Hub, MB/s "
                         "(default 500)")  # fmt: skip
    p_cache.add_argument("--shared-read-mbps", type=float, help="assumed per-pod read from the shared claim, MB/s "
                         "(default 1573: EFS Elastic's 1,500 MiB/s per client)")  # fmt: skip
    p_cache.add_argument("--workers", type=int, default=2, help="processes (default 2; a spike cell's takes ~8 GB)")
    p_cache.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_cache.add_argument("--tuned", default=str(_tuned()), help="the baselines' frozen settings (mmfleet bench tune)")
    p_cache.set_defaults(func=cmd_bench_cache)
    p_route = bench.add_parser(
        "routing", help="round-robin, the endpoint picker's defaults and mmfleet's configuration, on shared prefixes"
    )
    p_route.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-4)")
    p_route.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p_route.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_route.add_argument(
        "--spike",
        action="store_true",
        help="instead: a burst the picker holds, the autoscaler as shipped vs one that also counts the held requests",
    )
    p_route.set_defaults(func=cmd_bench_routing)
    p_mix = bench.add_parser(
        "mix", help="which unit (requests, tokens, fitted work) a replica's capacity at the SLO holds in across mixes"
    )
    p_mix.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-2)")
    p_mix.add_argument("--docs", default="docs/benchmarks.md", help="where the table is written")
    p_mix.set_defaults(func=cmd_bench_mix)
    p_idle = bench.add_parser(
        "idle", help="scale to zero on days with idle gaps: the shipped autoscaler vs tuned zero-capable baselines"
    )
    p_idle.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-2)")
    p_idle.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p_idle.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_idle.set_defaults(func=cmd_bench_idle)
    p_enc = bench.add_parser(
        "encode", help="aggregated against E/PD (an encode tier) at equal GPUs, autoscaled, and an image-only spike"
    )
    p_enc.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0-4)")
    p_enc.add_argument("--split", choices=("train", "validation", "test"), default="test",
                       help="the trace the cells run on (default test: azure-code); loads from train")  # fmt: skip
    p_enc.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_enc.add_argument("--no-docs", action="store_true", help="print the tables only")
    p_enc.set_defaults(func=cmd_bench_encode)
    p_tune = bench.add_parser("tune", help="sweep each baseline's knobs on the training traces; freeze the picks")
    p_tune.add_argument("--family", action="append", help="baseline (repeatable; default: all)")
    p_tune.add_argument("--scenario", action="append", help="training scenario (repeatable; a test one is refused)")
    p_tune.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0, 1)")
    p_tune.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: one per core)")
    p_tune.add_argument("--report-on", help="sweep on this (test) scenario and report, without freezing anything")
    p_tune.add_argument("--tuned", default=str(_tuned()), help="where the frozen settings are written")
    p_tune.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_tune.add_argument("--plots", default="docs/img", help="where the PNG plots are written")
    p_tune.set_defaults(func=cmd_bench_tune)
    for p_each in bench.choices.values():
        p_each.set_defaults(func=_outputs_checked(p_each.get_default("func")))

    register_cli(sub)
    _twin_cli(sub)


def _twin_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from mmfleet_lab.cluster.cluster import DEFAULT_NAME
    from mmfleet_lab.twin.replica import PROFILES
    from mmfleet_lab.twin.serve import DEFAULT_DURATION, DEFAULT_PROFILE, DEFAULT_RATE, TRAFFIC_NAMES

    p_twin = sub.add_parser("twin", help="the digital twin of a fleet")
    twin = p_twin.add_subparsers(dest="twin", required=True)
    p_serve = twin.add_parser(
        "serve",
        help="simulate the inference servers of a local cluster's pods in real time, with metrics for Prometheus",
    )
    p_serve.add_argument("--cluster", default=DEFAULT_NAME, help=f"local cluster name (default: {DEFAULT_NAME})")
    p_serve.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1 (default: any free one)")
    p_serve.add_argument(
        "--scenario",
        default=TRAFFIC_NAMES[0],
        choices=TRAFFIC_NAMES,
        help="traffic: Poisson with ServeGen's multimodal mix, or a benchmark scenario (default: poisson)",
    )
    p_serve.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help=f"mean requests/s per fleet (default: {DEFAULT_RATE:g})"
    )
    p_serve.add_argument(
        "--spike",
        action="append",
        default=[],
        metavar="START:END:FACTOR",
        help="multiply the rate by FACTOR from START to END seconds after start (repeatable), e.g. 60:180:4",
    )
    p_serve.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        help=f"seconds of traffic; afterwards nothing arrives (default: {DEFAULT_DURATION:g})",
    )
    p_serve.add_argument("--seed", type=int, default=0, help="random seed of the arrivals (default: 0)")
    p_serve.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=sorted(PROFILES),
        help=f"replica model (GPU, Qwen2.5-VL-7B) (default: {DEFAULT_PROFILE})",
    )
    p_serve.add_argument(
        "--traces", help="folder with the trace files (default: $MMFLEET_TRACES, else the twin's own copies)"
    )
    p_serve.add_argument(
        "--otlp-endpoint",
        help="OTLP/gRPC endpoint for the request spans of pods with spec.tracing.enabled, e.g. http://127.0.0.1:4317 "
        "(default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT, else no spans)",
    )
    p_serve.set_defaults(func=cmd_twin_serve)
    from mmfleet_lab.twin.scenarios import BASES

    p_profile = twin.add_parser(
        "profile",
        help="the capacity per replica at an SLO on a request mix, for spec.autoscaling.capacityPerReplica",
    )
    p_profile.add_argument("--mix", default="servegen-mm", choices=BASES, help="request mix (default: servegen-mm)")
    p_profile.add_argument("--target", default="10s", help="SLO target, e.g. 2s (default: 10s)")
    p_profile.add_argument("--percentile", type=float, default=90.0, help="SLO percentile (default: 90)")
    p_profile.add_argument("--metric", default="e2e", choices=("e2e", "ttft", "itl"), help="SLO metric (default: e2e)")
    p_profile.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES), help="replica model")
    p_profile.add_argument("--seed", type=int, default=0, help="random seed of the synthetic mix (default: 0)")
    p_profile.add_argument("--traces", help="folder with the trace files (default: the twin's own copies)")
    p_profile.set_defaults(func=cmd_twin_profile)
