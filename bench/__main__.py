"""``python -m bench``: run the benchmark and print one table (``--json`` writes it too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvloop

from bench import report
from bench.runner import DEFAULT_WORKLOADS, QUICK, WORKLOADS, Config, run


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Stepline's benchmark: PostgreSQL, `stepline serve`, the bench app under "
        "uvicorn and a load generator over the REST API; prints one table.",
    )
    p.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, from {','.join(WORKLOADS)} [all but scale and bulk]",
    )
    p.add_argument(
        "--runs", type=int, help=f"R: concurrent runs of steps, sleep, callback [{d.runs}]"
    )
    p.add_argument("--steps", type=int, help=f"N: sequential steps per run in `steps` [{d.steps}]")
    p.add_argument(
        "--latency-repeats", type=int, help=f"lone N-step runs, one at a time [{d.latency_repeats}]"
    )
    p.add_argument(
        "--keyed-runs", type=int, help=f"runs of `keyed` (limit 1 per key) [{d.keyed_runs}]"
    )
    p.add_argument("--keyed-keys", type=int, help=f"key values of `keyed` [{d.keyed_keys}]")
    p.add_argument("--fanout", type=int, help=f"parallel steps in the fanout run [{d.fanout}]")
    p.add_argument("--sleep-ms", type=int, help=f"sleep of each `sleep` run in ms [{d.sleep_ms}]")
    p.add_argument(
        "--long",
        type=_ints,
        help=f"step counts of the `long` runs [{','.join(map(str, d.long))}]",
    )
    p.add_argument(
        "--long-every",
        type=int,
        help=f"long-sleep-N-canK: continue as new every K iterations [{d.long_every}]",
    )
    p.add_argument("--big-steps", type=int, help=f"steps of the `big` run [{d.big_steps}]")
    p.add_argument("--big-kb", type=int, help=f"KB each `big` step returns [{d.big_kb}]")
    p.add_argument("--idle-runs", type=int, help=f"sleeping runs in `idle` [{d.idle_runs}]")
    p.add_argument(
        "--idle-window", type=float, help=f"seconds `idle` measures them [{d.idle_window:g}]"
    )
    p.add_argument("--scale-ended", type=int, help=f"ended runs `scale` adds [{d.scale_ended:,}]")
    p.add_argument(
        "--scale-sleeping", type=int, help=f"sleeping runs `scale` adds [{d.scale_sleeping:,}]"
    )
    p.add_argument(
        "--bulk-runs", type=int, help=f"failed runs `bulk` retries in bulk [{d.bulk_runs:,}]"
    )
    p.add_argument("--timeout", type=float, help=f"bound of each workload in s [{d.timeout:g}]")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller defaults: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()),
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the rows as JSON here")
    p.add_argument(
        "--database-url",
        help="use this database (else a fresh one on 127.0.0.1:5432, else embedded PostgreSQL)",
    )
    p.add_argument(
        "--log-level", default=d.log_level, help=f"the orchestrator's log level [{d.log_level}]"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help=f"orchestrator processes (stepline serve --workers) [{d.workers}]",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument(
        "--codec",
        action="store_true",
        help="the app encrypts every value (stepline.Encryption): run it with and without to"
        " see what encryption costs a step",
    )
    return p


def config_from(args: argparse.Namespace) -> Config:
    """The Config for the parsed flags: defaults, ``--quick``, then each flag given."""
    config = Config()
    if args.quick:
        for key, value in QUICK.items():
            setattr(config, key, value)
    for key in (
        "runs",
        "steps",
        "latency_repeats",
        "keyed_runs",
        "keyed_keys",
        "fanout",
        "sleep_ms",
        "long",
        "long_every",
        "big_steps",
        "big_kb",
        "idle_runs",
        "idle_window",
        "timeout",
        "scale_ended",
        "scale_sleeping",
        "bulk_runs",
    ):
        value = getattr(args, key)
        if value is not None:
            setattr(config, key, value)
    config.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    config.database_url = args.database_url
    config.log_level = args.log_level
    config.workers = max(1, args.workers)
    config.keep_logs = args.keep_logs
    config.codec = args.codec
    return config


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = config_from(args)
    result = uvloop.run(run(config))
    print()
    print(report.header_text(result.meta))
    print(report.table(result.rows))
    print(report.footer_text())
    if args.json:
        report.write_json(args.json, result.meta, result.rows)
        print(f"JSON written to {args.json}")
    incomplete = [r["workload"] for r in result.rows if r["runs_completed"] < r["runs_attempted"]]
    if incomplete:
        print(f"incomplete: {', '.join(incomplete)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
