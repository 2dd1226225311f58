"""The Optuna sampler that proposes configs."""

from __future__ import annotations

import optuna

from autotune.core.enums import SamplerName


def make_sampler(name: SamplerName | str, seed: int | None) -> optuna.samplers.BaseSampler:
    name = SamplerName(name)
    if name in (SamplerName.TPE, SamplerName.MODEL):  # MODEL: its proposals are queued
        # constant_liar: trials running in other workers count as poor points, so two
        # workers sharing the study are not steered to the same config.
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=4, constant_liar=True
        )
    if name == SamplerName.RANDOM:
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
