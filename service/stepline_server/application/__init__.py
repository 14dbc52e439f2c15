"""The application layer: the use cases the API and the dashboard share (start a run, complete
a callback, pause, cancel, retry, sync an app...), what they read and how they answer it."""
