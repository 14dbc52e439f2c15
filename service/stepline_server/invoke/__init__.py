"""Calls into apps: signed invocations and describe requests, and signed callback URLs."""
