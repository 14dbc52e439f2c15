"""The dashboard: server-rendered pages under ``/ui/`` over the same store and engine as ``api``."""
