"""The chaos test: real processes, injected faults, and invariants checked from the outside."""
