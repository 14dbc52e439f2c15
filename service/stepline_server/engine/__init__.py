"""The run and schedule rules as plain functions: no I/O library is imported here."""
