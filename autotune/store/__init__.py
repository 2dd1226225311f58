"""Persistence: the only code that touches Optuna storage."""
