"""Stepline's benchmark suite: ``python -m bench`` (see ``bench/README.md``).

It sets everything up as a user deploys it — PostgreSQL, the orchestrator (``stepline serve``)
in its own process, the workflow app (:mod:`bench.app`) under uvicorn in another — and drives
the workloads from this process over the public REST API, printing one table of the figures.
"""

from __future__ import annotations
