"""Stepline's orchestrator: REST API, run loop and PostgreSQL store."""

__version__ = "0.1.0"
