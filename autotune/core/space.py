"""The search space: derived from the hardware and the user's options.

Per-device batches are multiples of 8 that divide the global batch (1, 2 and 4 only as
a fallback, once 8 cannot fit: tuning/_skips.py); the accumulation steps follow, so
micro-batch x accumulation always equals the global batch exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from autotune.core.checkpointing import Checkpointing
from autotune.core.device import DeviceInfo, supported_precisions
from autotune.core.enums import DeviceKind, Precision
from autotune.core.errors import SpaceError
from autotune.core.levers import BY_NAME
from autotune.core.optimizers import DEFAULT as DEFAULT_OPTIMIZERS
from autotune.core.optimizers import PLAIN
from autotune.core.precisions import precision_spec
from autotune.core.trial import LEVERS, Candidate

FALLBACK_BATCHES = (1, 2, 4)
# TrainingArguments.train_sampling_strategy: searched when --dataset gives real lengths
SAMPLINGS = ("random", "group_by_length")


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    global_batch_size: int
    micro_batches: tuple[int, ...]  # multiples of 8 dividing the global batch
    fallback_batches: tuple[int, ...]  # 1, 2, 4 dividing it: only once 8 cannot fit
    precisions: tuple[Precision, ...]
    checkpointing: tuple[Checkpointing, ...]  # the levels searched, in order
    optimizers: tuple[str, ...]
    samplings: tuple[str, ...] = ("random",)  # + group_by_length when a dataset is given
    # Each lever (trial.LEVERS) with the values searched, the plain one first (a lever the
    # user fixed has one value); a lever absent runs at its Candidate default
    levers: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    # Levers not searched, and why (the device, a missing package, the model, the user)
    not_offered: tuple[tuple[str, str], ...] = ()

    @property
    def all_batches(self) -> tuple[int, ...]:
        return tuple(sorted(self.fallback_batches + self.micro_batches))

    def __post_init__(self) -> None:
        object.__setattr__(self, "precisions", tuple(Precision(p) for p in self.precisions))
        levels = sorted({Checkpointing.of(c) for c in self.checkpointing}, key=lambda c: c.rank)
        object.__setattr__(self, "checkpointing", tuple(levels))
        object.__setattr__(self, "levers", tuple((str(n), tuple(v)) for n, v in self.levers))
        not_offered = tuple((str(n), str(why)) for n, why in self.not_offered)
        object.__setattr__(self, "not_offered", not_offered)
        unknown = [n for n, _ in self.levers if n not in LEVERS]
        if unknown:
            raise ValueError(f"unknown lever(s) {unknown}")

    @property
    def plain_checkpointing(self) -> Checkpointing:
        """The plain run's level: off, or every layer where the job turns it on itself."""
        for level in (Checkpointing.OFF, Checkpointing.ON):
            if level in self.checkpointing:
                return level
        return self.checkpointing[0]

    @property
    def changes_samples(self) -> bool:
        """Whether some candidate's steps train other samples than the recipe's: a lever
        that does so searched, or fixed on."""
        return any(
            BY_NAME[name].changes_samples and not BY_NAME[name].is_plain(value)
            for name, values in self.levers
            for value in values
        )

    @property
    def varied_levers(self) -> dict[str, tuple[Any, ...]]:
        """The levers searched over more than one value."""
        return {n: v for n, v in self.levers if len(v) > 1}

    def candidate(
        self,
        batch: int,
        precision: str,
        checkpointing: Checkpointing | bool,
        optim: str,
        sampling: str = "",
        **levers: Any,
    ) -> Candidate:
        plain = {n: v[0] for n, v in self.levers}  # the first value of each: the plain run
        return Candidate(
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=self.global_batch_size // batch,
            precision=Precision(precision),
            activation_checkpointing=Checkpointing.of(checkpointing),
            optim=optim,
            train_sampling_strategy=sampling or self.samplings[0],  # "": the plain one
            **{**plain, **levers},
        )

    def candidates(self, *, include_fallback: bool = True) -> Iterator[Candidate]:
        batches = self.all_batches if include_fallback else self.micro_batches
        names = list(self.varied_levers)
        for batch, prec, ckpt, opt, sampling, *values in itertools.product(
            batches,
            self.precisions,
            self.checkpointing,
            self.optimizers,
            self.samplings,
            *self.varied_levers.values(),
        ):
            levers = dict(zip(names, values, strict=True))
            yield self.candidate(batch, prec, ckpt, opt, sampling, **levers)

    @property
    def size(self) -> int:
        size = (
            len(self.micro_batches)
            * len(self.precisions)
            * len(self.checkpointing)
            * len(self.optimizers)
            * len(self.samplings)
        )
        for values in self.varied_levers.values():
            size *= len(values)
        return size


def batch_choices(global_batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(regular, fallback) per-device batches that divide the global batch exactly."""
    if global_batch < 1:
        raise SpaceError(f"--global-batch-size must be positive, got {global_batch}")
    regular = tuple(b for b in range(8, global_batch + 1, 8) if global_batch % b == 0)
    fallback = tuple(b for b in FALLBACK_BATCHES if global_batch % b == 0)
    if not regular and global_batch not in FALLBACK_BATCHES:
        lower = max(8, global_batch - global_batch % 8)
        raise SpaceError(
            f"no per-device batch divides --global-batch-size {global_batch}: batches are "
            f"multiples of 8 (1, 2, 4 only as a fallback); use a multiple of 8, "
            f"e.g. {lower} or {lower + 8}"
        )
    if not regular:  # a global batch of 1, 2 or 4: the small batches are all there is
        return fallback, ()
    return regular, fallback


def derive_space(
    device: DeviceInfo,
    *,
    global_batch_size: int,
    precisions: Sequence[str] | None = None,
    optimizers: Sequence[str] | None = None,
    checkpointing: Sequence[Checkpointing | bool] | None = None,
    samplings: Sequence[str] = ("random",),
    installed_optimizers: Sequence[str],
    levers: Sequence[tuple[str, Sequence[Any]]] = (),
    not_offered: Sequence[tuple[str, str]] = (),
    held_in: str = "",
    trains_in: str = "",
) -> SearchSpace:
    """The space for this device, narrowed by the user's options; refuses an empty one.

    `installed_optimizers`: the optim names the installed libraries can run
    (autotune.hf.training_args.available_optimizers). `held_in`: what a job that holds
    its weights in 16 bits or quantized holds them in ("bfloat16", "4-bit nf4"); its
    runs without autocast are `as-loaded`, never fp32 or tf32. `trains_in`: the 16-bit
    dtype a job's trainable parameters are held in, where fp16's gradient scaler cannot
    run."""
    regular, fallback = batch_choices(global_batch_size)
    chosen_prec = _chosen_precisions(device, precisions, held_in, trains_in)
    installed = tuple(installed_optimizers)
    if optimizers:
        unknown = [o for o in optimizers if o not in installed]
        if unknown:
            raise SpaceError(
                f"optimizer(s) {', '.join(unknown)} not available here (unknown to "
                f"transformers or their library is not installed); available: "
                f"{', '.join(installed)}"
            )
        chosen_opt = tuple(optimizers)
    else:
        chosen_opt = tuple(o for o in DEFAULT_OPTIMIZERS if o in installed)
    return SearchSpace(
        global_batch_size=global_batch_size,
        micro_batches=regular,
        fallback_batches=fallback,
        precisions=chosen_prec,
        checkpointing=tuple(Checkpointing.of(c) for c in checkpointing or (False, True)),
        optimizers=chosen_opt,
        samplings=tuple(samplings),
        levers=tuple((name, tuple(values)) for name, values in levers),
        not_offered=tuple(not_offered),
    )


def _chosen_precisions(
    device: DeviceInfo, precisions: Sequence[str] | None, held_in: str, trains_in: str
) -> tuple[Precision, ...]:
    """The precisions asked for (all this device and the job can run, by default); one
    it cannot, or none left, is refused with what to ask for instead."""
    supported = _precisions_for(device, held_in, trains_in)
    for name in precisions or ():
        if name not in set(Precision):
            raise SpaceError(
                f"unknown precision {name!r}; choose from {', '.join(p.value for p in Precision)}"
            )
        if held_in and not (name == Precision.AS_LOADED or precision_spec(name).mixed):
            raise SpaceError(
                f"--precisions {name}: your job holds its weights in {held_in}, so a run "
                "without autocast computes in that, not in 32 bits; pass --precisions "
                "as-loaded for that run without autocast"
            )
        if trains_in and precision_spec(name).scales_gradients:
            raise SpaceError(
                f"--precisions fp16: your job trains its parameters in {trains_in}, and "
                "fp16's gradient scaler unscales only fp32 gradients; ask for bf16"
            )
    chosen = tuple(Precision(p) for p in (precisions or supported) if p in supported)
    if not chosen:
        raise SpaceError(
            f"--precisions {','.join(precisions or ())}: none is supported on {device.name} "
            f"({device.kind}); this device supports {', '.join(supported)}"
        )
    return chosen


def _precisions_for(device: DeviceInfo, held_in: str, trains_in: str) -> tuple[Precision, ...]:
    """The device's precisions; for a job held in 16 bits or quantized, `as-loaded` (no
    autocast) in place of fp32 and tf32, which would name arithmetic it does not do; no
    fp16 for one whose trainable parameters are held in 16 bits."""
    supported = supported_precisions(device)
    if trains_in:
        supported = tuple(p for p in supported if not precision_spec(p).scales_gradients)
    if not held_in:
        return supported
    mixed = tuple(p for p in supported if precision_spec(p).mixed)
    return (Precision.AS_LOADED, *mixed)


def seed_candidates(
    space: SearchSpace, device: DeviceInfo, tokens_per_sample: int = 1
) -> list[Candidate]:
    """Good first guesses to enqueue: the plain default, then the usual fast settings
    (mixed precision on a GPU, and on a CPU with bf16 instructions; fp32 on another CPU,
    where bf16 is emulated).

    On a GPU the fast guess is the largest micro-batch whose tokens (batch x tokens per
    sample) are a multiple of the device's tile (64 on Ampere+): the rule is in tokens,
    so it holds at any global batch, not only above 64 samples."""
    seeds = []
    batches = space.micro_batches
    default_batch = 8 if 8 in batches else batches[0]
    plain = [p for p in (Precision.FP32, Precision.AS_LOADED) if p in space.precisions]
    fp = plain[0] if plain else space.precisions[0]
    plain_opt = PLAIN if PLAIN in space.optimizers else space.optimizers[0]
    no_ckpt = space.plain_checkpointing
    seeds.append(space.candidate(default_batch, fp, no_ckpt, plain_opt))
    mixed = [p for p in ("bf16", "fp16") if p in space.precisions]
    native = device.kind == DeviceKind.CUDA or (device.native_bf16 and "bf16" in mixed)
    fast_prec = ("bf16" if device.kind == DeviceKind.CPU else mixed[0]) if mixed and native else fp
    fast_opt = "adamw_torch_fused" if "adamw_torch_fused" in space.optimizers else plain_opt
    align = device.alignment_tokens
    aligned = [b for b in batches if (b * tokens_per_sample) % align == 0]
    on_gpu = device.kind == DeviceKind.CUDA and aligned
    fast_batch = max(aligned) if on_gpu else batches[len(batches) // 2]
    seeds.append(space.candidate(fast_batch, fast_prec, no_ckpt, fast_opt))
    if "group_by_length" in space.samplings:  # with real data: the same, lengths grouped
        seeds.append(space.candidate(fast_batch, fast_prec, no_ckpt, fast_opt, "group_by_length"))
    return list(dict.fromkeys(seeds))
