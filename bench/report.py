"""The printed table and the JSON file: the same rows, one per workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
PROCESSES = (("orchestrator", "orch"), ("app", "app"), ("postgres", "pg"), ("loadgen", "gen"))


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _q(summary: JSON | None, *labels: str) -> str:
    summary = summary or {}
    return "/".join(_num(summary.get(label), 0) for label in labels)


def details(row: JSON) -> str:
    """The workload's own figures, compactly."""
    x: JSON = row.get("extra") or {}
    name = row["workload"].split("@")[0]  # scale's rows: the workload @ the database
    parts: list[str] = []
    if name == "steps-1":
        parts.append(f"client p50/p95 {_q(x.get('client_latency_ms'), 'p50', 'p95')} ms")
    elif name == "sleep":
        parts.append(f"late p50/p95/max {_q(x.get('lateness_ms'), 'p50', 'p95', 'max')} ms")
        parts.append(f"vs wakeAt {_q(x.get('lateness_vs_wakeAt_ms'), 'p50', 'p95', 'max')} ms")
    elif name == "callback":
        ended = _q(x.get("completion_to_ended_ms"), "p50", "p95", "max")
        parts.append(f"done->ended p50/p95/max {ended} ms")
        parts.append(f"->seen p50 {_q(x.get('completion_to_seen_ms'), 'p50')} ms")
        if not x.get("all_suspended", True):
            parts.append("NOT ALL SUSPENDED")
    elif name.startswith("long-sleep-") or name == "big":
        parts.append(
            f"{_num(x.get('bytes_to_app_per_invocation'), 0)} B/inv to app "
            f"(largest body {x.get('largest_invoke_body', 0):,} B)"
        )
        parts.append(f"{_num(x.get('ms_per_iteration'), 2)} ms/iteration")
        parts.append(f"{x.get('invocations')} inv")
        for key, growth in x.items():
            if key.startswith("growth_vs_"):
                parts.append(
                    f"x{growth['bytes_per_invocation_ratio']} B/inv, "
                    f"x{growth['ms_per_iteration_ratio']} ms/iteration "
                    f"vs {key.removeprefix('growth_vs_')}"
                )
    elif name.startswith("long-"):
        parts.append(
            f"to app {x.get('bytes_to_app', 0):,} B ({_num(x.get('bytes_to_app_per_step'))} B/step)"
        )
        parts.append(f"{_num(x.get('ms_per_step'), 2)} ms/step")
        parts.append(f"{x.get('invocations')} inv")
        for key, growth in x.items():
            if key.startswith("growth_vs_"):
                parts.append(
                    f"per-step x{growth['bytes_per_step_ratio']} B, x{growth['ms_per_step_ratio']} "
                    f"time vs {key.removeprefix('growth_vs_').replace('_', '-')}"
                )
    elif name == "bulk-retry":
        op = x.get("operation") or {}
        parts.append(
            f"{op.get('succeeded')}/{op.get('matched')} retried in {x.get('operation_s')} s "
            f"(all ended again in {x.get('retried_runs_ended_s')} s)"
        )
        parts.append(
            f"lone run p50 x{x.get('lone_p50_ratio')}, p95 x{x.get('lone_p95_ratio')} vs before"
        )
    elif name == "fill":
        parts.append(f"{x.get('ended', 0):,} ended + {x.get('sleeping', 0):,} asleep added")
        parts.append(f"db {x.get('db_size')}, vacuumed in {x.get('vacuum_s')} s")
        for workload, ratio in (x.get("after_vs_empty") or {}).items():
            parts.append(f"{workload} x{ratio['steps_per_s']} steps/s x{ratio['p50_ms']} p50")
        plans = x.get("plans") or {}
        for query, seq in plans.items():
            parts.append(f"{query}: {'; '.join(seq)}")
        if not plans:
            parts.append("every run-loop statement: index scans only on large tables")
    elif name == "sweep":
        parts.append(
            f"{x.get('runs', 0):,} runs past retention deleted in {x.get('took_s')} s "
            f"({x.get('during_workloads', 0):,} while the workloads ran; sweeper duty "
            f"{x.get('duty')})"
        )
        for workload, ratio in (x.get("sweep_vs_empty") or {}).items():
            parts.append(f"{workload} x{ratio['steps_per_s']} steps/s x{ratio['p50_ms']} p50")
    elif name == "idle":
        per_min = x.get("cpu_s_per_min") or {}
        rss = x.get("rss_mb_end") or {}
        parts.append(f"{x.get('sleeping_runs', 0):,} asleep")
        parts.append(f"created {_num(x.get('create_per_s'), 0)}/s")
        parts.append(
            f"orch {_num(rss.get('orchestrator'))} MB, "
            f"{_num(per_min.get('orchestrator'), 2)} cpu-s/min"
        )
        parts.append(
            f"pg {_num(per_min.get('postgres'), 2)}, app {_num(per_min.get('app'), 2)} cpu-s/min"
        )
    if x.get("failures"):
        parts.append(f"FAILED: {x['failures'][0]}")
    return "; ".join(parts)


def table(rows: list[JSON]) -> str:
    """One text table: the common columns, then the workload's own figures."""
    header = ["workload", "runs", "wall s", "runs/s", "steps/s", "p50 ms", "p95 ms", "p99 ms"]
    for _, short in PROCESSES:
        header += [f"{short} cpu", f"{short} MB"]
    header.append("details")
    lines = [header]
    for row in rows:
        lat = row.get("latency_ms") or {}
        cells = [
            row["workload"],
            f"{row['runs_completed']}/{row['runs_attempted']}",
            _num(row["wall_s"], 2),
            _num(row["runs_per_s"]),
            _num(row["steps_per_s"]),
            _num(lat.get("p50")),
            _num(lat.get("p95")),
            _num(lat.get("p99")),
        ]
        procs = row.get("processes") or {}
        for name, _ in PROCESSES:
            usage = procs.get(name)
            cells += (
                [_num(usage["cpu_s"], 2), _num(usage["peak_rss_mb"], 0)] if usage else ["-", "-"]
            )
        cells.append(details(row))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    for n, line in enumerate(lines):
        left = [line[0].ljust(widths[0])]
        left += [cell.rjust(widths[i]) for i, cell in enumerate(line[1:-1], start=1)]
        out.append("  ".join([*left, line[-1]]).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)


def header_text(meta: JSON) -> str:
    """What ran where, above the table."""
    db = meta.get("postgres") or {}
    m = meta.get("machine") or {}
    return (
        f"stepline bench — {meta.get('date')} — commit {meta.get('commit')} — "
        f"{m.get('cpus')} CPUs, {m.get('memory_gib')} GiB, Python {m.get('python')}, "
        f"PostgreSQL {db.get('version')} ({db.get('kind')}) — "
        f"{(meta.get('config') or {}).get('workers', 1)} orchestrator worker(s)"
    )


def footer_text() -> str:
    return (
        "runs: completed/attempted; latency: endedAt - createdAt of each run (server clock); "
        "cpu: CPU seconds during the workload; MB: peak RSS (pg: postmaster + private memory of "
        "its processes; orch: every worker); gen: this load generator"
    )


def write_json(path: Path, meta: JSON, rows: list[JSON]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "workloads": rows}, indent=2) + "\n")
