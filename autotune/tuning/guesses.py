"""The first guesses: what the search probes before its model of step time has data.

They are the user's recipe (what they would run, measured rather than inferred), the
plain default, and the usual fast settings (core.space.seed_candidates). A guess the
memory estimate says will not fit is deferred (tuning._skips), and its settings are
then tried at the largest batch the estimate says fits, the global batch kept: the
guess is a prior on precision and optimizer as much as on batch, and memory ruling
out its batch says nothing about the rest of it.

Without that, the guess's settings were left to the model of step time, which had seen
them nowhere. In the families' replays with memory binding (BERT at 680 MiB: bf16 at
batch 16 does not fit, at 8 it is the fastest config), searches spent their probes on
untried values and never reached 8x2 bf16: 5 of 18 real searches missed it (0.65 of the
best); simulated against the recorded grid (benchmarks/families_simulated.py), 17 of 24
before and 0 of 24 with the guess made to fit, all settings 0.961 -> 0.985. Where the
estimate is optimistic for the guess's settings (GPT-2's bf16 at batch 8), the fitted
guess runs out of memory and costs that probe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

from autotune.core.parity import Arithmetic
from autotune.core.space import seed_candidates
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, TrialRecord
from autotune.tuning.parity import reference_candidate
from autotune.tuning.selection import keeping


def first_guesses(spec: SearchSpec) -> list[Candidate]:
    """The configs queued before any probe, in order: the recipe, then the seeds."""
    seeds = seed_candidates(spec.space, spec.device, spec.tokens_per_sample)
    return list(dict.fromkeys([*recipe_guess(spec), *seeds]))


def recipe_guess(spec: SearchSpec) -> list[Candidate]:
    """The user's own recipe (--base-args, or their class's defaults) among the first
    guesses, where the space holds it: what they would run is measured, not inferred."""
    if not spec.recipe.given:
        return []
    recipe = reference_candidate(spec, [])
    space = spec.space
    inside = (
        recipe.precision in space.precisions
        and recipe.optim in space.optimizers
        and recipe.activation_checkpointing in space.checkpointing
        and recipe.per_device_train_batch_size in space.all_batches
    )
    return [recipe] if inside else []


def fitted_guess(
    spec: SearchSpec,
    records: Sequence[TrialRecord],
    open_configs: Collection[Candidate],
    fits: Callable[[Candidate], bool],
    *,
    in_flight: Collection[Candidate] = (),
    allowed: Collection[Arithmetic] = (),
) -> Candidate | None:
    """A first guess the estimate says will not fit, at the largest batch it says fits
    (the same samples a step); None when every guess ran, had its fitted twin measured,
    or fits as queued. `open_configs`: those left to probe; `fits`: the estimate's
    verdict; `in_flight`: configs other workers are probing (as good as measured here).

    `allowed`: where only these arithmetics may be exported (empty: any), a guess of
    another that has not had its probe is made to keep the recipe's
    (`selection.keeping`): its batch and levers are a prior still. A one-minute NeoX
    search whose fast guess (bf16, fused AdamW, sdpa) could not be confirmed probed fused
    AdamW with eager attention next, 0.83x the recipe; the guess in fp32 read 1.00-1.08x
    the recipe in four searches. A guess that ran has had its probe: what keeps its
    arithmetic is the keeping twin's (`selection.keeping_twin`) or the model's to find."""
    seen = {r.candidate for r in records} | set(in_flight)
    for first in first_guesses(spec):
        if first in seen or any(f in seen for f in _fitted(spec, first)):
            continue  # the guess has its probe, as it is or at a batch that fits
        kept = not allowed or Arithmetic.of(first) in allowed
        guess = first if kept else keeping(spec, first)
        if guess is None or guess in seen:
            continue
        if guess != first and guess in open_configs and fits(guess):
            return guess  # not queued: a guess only made to keep the arithmetic
        if fits(guess):
            continue  # queued as it is
        for fitted in _fitted(spec, guess):
            if fitted in seen:
                break  # measured or being measured: the guess has its probe
            if fitted in open_configs and fits(fitted):
                return fitted
    return None


def _fitted(spec: SearchSpec, guess: Candidate) -> list[Candidate]:
    """The guess at each smaller micro-batch of the space, largest first, the samples a
    step kept."""
    samples = guess.per_device_train_batch_size * guess.gradient_accumulation_steps
    return [
        dataclasses.replace(
            guess, per_device_train_batch_size=batch, gradient_accumulation_steps=samples // batch
        )
        for batch in sorted(spec.space.all_batches, reverse=True)
        if batch < guess.per_device_train_batch_size and samples % batch == 0
    ]
