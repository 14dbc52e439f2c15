"""The SDK's version, sent with every ``describe`` answer."""

__version__ = "0.1.0"
