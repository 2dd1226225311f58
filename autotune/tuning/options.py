"""What a search is asked: `SearchOptions`, the one place a search option is declared.

The CLI builds it from click (cli_types.py gives each option its flag and help, and a
test fails when the two disagree); Python callers build it through `autotune.search`.
The plan (`tuning/plan.py`), the limits of the study loop and the workers all read this
one value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.core.enums import Objective
from autotune.core.parity import CALIBRATED_STEPS
from autotune.tuning.limits import SearchLimits

# A search given no time budget stops within this: never hours unasked (20 probes of up
# to the trial timeout's 10 minutes each would be over three)
DEFAULT_TIME_BUDGET_S = 30 * 60.0
# Parity run length by --parity mode, when --parity-steps is not given: 20 steps verify
# (core/parity.CALIBRATED_STEPS); quick runs none: the probes' own losses judge (NaNs,
# gross divergence; unverified); auto plans one or the other once the first guesses are
# measured (tuning/time_plan.py)
PARITY_STEPS = {"on": CALIBRATED_STEPS, "auto": CALIBRATED_STEPS, "quick": 0}


@dataclasses.dataclass(frozen=True)
class AskedWorkload:
    """The workload's figures as asked (None: not asked): what the plan keeps over
    the user's arguments file and the model's defaults."""

    global_batch_size: int | None = None
    seq_len: int | None = None
    target_len: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """A search's options, with the defaults `autotune search --help` states.

    Sizes are bytes and durations seconds here; `autotune.search` also takes "16GiB" and
    "10m" as the CLI does."""

    # -- the common ones
    # What to tune: your own job (a Trainer factory, "train.py:make_trainer" or
    # "package.module:make_trainer"), or a stand-in built from --model
    trainer: str | None = None
    model: str | None = None  # a local folder with config.json, a hub id, or a preset
    base_args: Path | None = None  # your TrainingArguments JSON: batch, lengths, fields
    memory_budget: int | None = None  # bytes one training process may use; None: all
    time_budget: float | None = None  # seconds for the whole search; None: the default
    objective: Objective = Objective.THROUGHPUT  # or efficiency: samples/s per GiB
    study_name: str | None = None  # None: from the model's name
    output: Path | None = None  # the export; None: studies/<study>.best.json
    # -- the workload
    global_batch_size: int | None = None  # kept exactly; None: --base-args', else 32
    seq_len: int | None = None  # the longest input; None: --base-args', the data's, 512
    target_len: int | None = None  # the longest target (seq2seq)
    train_steps: int | None = None  # your run's steps: rank by time to finish it
    task: str = "auto"  # seq2seq, causal-lm, masked-lm, classification; auto: the config's
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    headroom: float = 0.05  # share of the budget kept free for fragmentation in long runs
    # -- your job
    args_class: str | None = None  # the factory's arguments class, when not annotated
    lora: str | None = None  # "r=16,alpha=32,targets=q_proj,v_proj": a LoRA stand-in
    peft_config: Path | None = None  # an adapter_config.json for the stand-in
    # -- your data
    dataset: str | None = None  # a save_to_disk folder, a local file, or a hub name
    dataset_split: str = "train"
    text_column: str | None = None
    target_column: str | None = None
    tokenizer: str | None = None  # None: the model's own
    # -- what to try
    precisions: tuple[str, ...] | None = None  # None: every one the device supports
    optimizers: tuple[str, ...] | None = None  # None: those installed of the usual five
    # levels by name (core/checkpointing.py); None: every level offered
    checkpointing: tuple[str, ...] | None = None
    levers: tuple[str, ...] = ()  # "NAME=V[,V]": fix or narrow a lever
    # -- how to search
    max_trials: int = 20  # probes in the whole study, a resumed one's included
    trial_timeout: float = 600.0  # seconds before a probe is killed as a timeout
    sampler: str = "model"  # autotune's model of step time, or an Optuna sampler's name
    seed: int = 0  # of the sampler, and of the probes' weights and data
    confirm_top: int = 3  # finalists measured again, longer (0: none)
    confirm_steps: int | None = None  # measured steps of a confirmation; None: 2 x measure
    # paired rounds (the first confirmations' included) between the two finalists the
    # export hinges on, while they cannot be told apart; below 2: none
    confirm_rounds: int = 8
    # auto: 20-step runs where the time budget affords them, else quick; on: always 20
    # steps, never an unverified export; quick: the probes' own losses, whose passing
    # configs are exported marked unverified; off
    parity: str = "auto"
    parity_steps: int | None = None  # None: PARITY_STEPS[parity]
    warmup_steps: int = 3  # at most this many steps before timing
    measure_steps: int | None = None  # timed steps a probe, at most; None: by the budget
    fixed_steps: bool = False  # time exactly warmup + measure steps, every probe
    fork_server: bool = True  # fork probes from a pre-imported server
    # before the export, rehearse the run's evaluation and checkpoint save under the budget
    rehearse: bool = True
    reuse: bool = True  # take over what another study in the storage measured alike
    # -- storage and workers
    storage: str | None = None  # an Optuna storage URL; None: sqlite under studies/
    parallel: int = 1  # CPU: this many probes at a time, the cores split between them
    devices: tuple[str, ...] | None = None  # CUDA: one worker per listed GPU
    nproc_per_node: int = 1  # probe each config as a DDP run of this many processes
    # a probe across nodes (core/nodes.py): how many, this node's rank (None: Slurm's, or
    # 0 on one node), the head's address every node reaches (None: Slurm's first node)
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    # -- output
    quiet: bool = False  # plain lines instead of the live table
    force: bool = False  # replace --output even if autotune did not write it

    @property
    def budget_s(self) -> float:
        """The time budget in force: the one asked, else DEFAULT_TIME_BUDGET_S."""
        return DEFAULT_TIME_BUDGET_S if self.time_budget is None else self.time_budget

    @property
    def workload(self) -> AskedWorkload:
        return AskedWorkload(self.global_batch_size, self.seq_len, self.target_len)

    def limits(self, measure_steps: int) -> SearchLimits:
        """The study loop's limits (`measure_steps`: the spec's, which sets the default
        length of a confirmation)."""
        return SearchLimits(
            max_trials=self.max_trials,
            trial_timeout_s=self.trial_timeout,
            confirm_top=self.confirm_top,
            confirm_steps=self.confirm_steps or 2 * measure_steps,
            confirm_rounds=self.confirm_rounds,
            parity_check=self.parity != "off",
            parity_steps=0
            if self.parity == "off"
            else self.parity_steps or PARITY_STEPS[self.parity],
            parity_quick=self.parity == "quick",
            parity_auto=self.parity == "auto" and self.parity_steps is None,
            objective=Objective(self.objective),
            fork_server=self.fork_server,
            rehearse=self.rehearse,
            adaptive=not self.fixed_steps,
            reuse=self.reuse,
            propose=self.sampler == "model",
        )
