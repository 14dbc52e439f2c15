"""What drives the engine: the dispatcher, the scheduler, group commit, LISTEN, sweeping."""
