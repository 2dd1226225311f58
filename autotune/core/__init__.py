"""The typed values every part shares: trials, the space, the search spec, units, errors.

Pure Python: nothing here imports torch, transformers, Optuna or click.
"""
