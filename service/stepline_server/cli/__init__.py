"""The stepline command: serve, dev, migrate, keys."""
