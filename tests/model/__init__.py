"""The model-based test of the run state machine (see test_model.py)."""
