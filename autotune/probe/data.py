"""What a probe feeds the model.

Synthetic data at the worst-case length (docs/ARCHITECTURE.md, invariant 5): every example is
exactly as long as the longest one the user will train with and has no padding, so a
config that fits the probe fits every real batch; and learnable, so the loss a probe
records at each step tells how the config trains. With --dataset, the probe then times
real batches too: RealBatches pads each micro-batch to its longest, as a user's
collator does, and counts the real and the padded tokens it fed.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DataCollatorWithFlattening

from autotune.core.enums import Task
from autotune.probe._inputs import Workload


class RealBatches:
    """A data collator for the user's tokenized data (TokenCount counts what it feeds).

    Pads inputs with the tokenizer's pad id and labels with -100 (no loss on padding).
    Causal and masked LMs get a loss at every real token (labels = inputs), which is
    what their memory and speed depend on; seq2seq uses the tokenized targets.
    """

    def __init__(self, *, task: str, pad_token_id: int) -> None:
        self.task = task
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [list(f["input_ids"]) for f in features]
        width = max(len(x) for x in ids)
        batch = {
            "input_ids": torch.tensor([x + [self.pad_token_id] * (width - len(x)) for x in ids]),
            "attention_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
        }
        if self.task == Task.SEQ2SEQ:
            labels = [list(f["labels"]) for f in features]
            target = max(len(t) for t in labels)
            batch["labels"] = torch.tensor([t + [-100] * (target - len(t)) for t in labels])
        elif self.task == Task.CLASSIFICATION:
            batch["labels"] = torch.tensor([int(f["labels"]) for f in features])
        else:
            batch["labels"] = torch.tensor([x + [-100] * (width - len(x)) for x in ids])
        return batch


class TokenCount:
    """The real (non-pad) and fed tokens of each micro-batch the model is given, counted
    in the training process by a forward pre-hook: a collator may run in loader worker
    processes, whose counts would never come back. Padded inputs: the attention mask's
    ones (and the targets' non -100 labels for seq2seq); packed inputs: all of them.
    The sums stay on the device until read (no sync per micro-batch)."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.counts: list[tuple[Any, int]] = []

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids")
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        real: Any = mask.sum() if mask is not None else ids.numel()
        fed = ids.numel()
        labels = kwargs.get("labels")
        if self.task == Task.SEQ2SEQ and labels is not None:
            real = real + (labels != -100).sum()
            fed += labels.numel()
        self.counts.append((real, fed))

    def fed(self) -> list[tuple[int, int]]:
        """(real tokens, tokens incl. padding) of each micro-batch so far."""
        return [(int(real), fed) for real, fed in self.counts]


class WorstCaseDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Every sample at the worst-case length, and learnable within tens of steps: a
    probe's loss falls, so its per-step losses are parity evidence, and a parity run
    trains and holds out the same kind of samples.

    Sequences over a small alphabet follow a fixed random successor table (each token's
    successor with probability 3/4, else any letter): the loss falls from ln(vocab)
    towards the table's entropy. Seq2seq targets are the source's successors, labels
    for classification the first token's letter modulo the classes, for a masked LM
    each position's successor (a copy would be learnt at once). `offset` selects
    a disjoint range of samples (the held-out batches). Sample `index` is the same in
    every dataset of one seed, whatever its length."""

    ALPHABET = 64
    FOLLOW = 0.75

    @classmethod
    def of(cls, work: Workload, length: int, offset: int = 0) -> WorstCaseDataset:
        """`length` samples of the probe's model, lengths and seed, from `offset` on."""
        return cls(
            task=work.model.task,
            length=length,
            seq_len=work.seq_len,
            target_len=work.target_len,
            vocab_size=work.model.vocab_size,
            num_labels=int(work.model.config.get("num_labels", 2)),
            seed=work.seed,
            offset=offset,
        )

    def __init__(
        self,
        *,
        task: str,
        length: int,
        seq_len: int,
        target_len: int,
        vocab_size: int,
        num_labels: int = 2,
        seed: int = 0,
        offset: int = 0,
    ) -> None:
        self.task, self.length, self.offset, self.seed = task, length, offset, seed
        self.seq_len, self.target_len, self.num_labels = seq_len, target_len, num_labels
        size = min(self.ALPHABET, vocab_size)
        first = min(100, vocab_size - size)  # clear of the usual special ids
        self.letters = torch.arange(first, first + size)
        table = torch.Generator().manual_seed(seed * 7919 + 17)
        self.successor = torch.randperm(size, generator=table)
        self._next = self.successor.tolist()

    def __len__(self) -> int:
        return self.length

    def _walk(self, generator: torch.Generator, length: int) -> torch.Tensor:
        """A walk over the letters (plain Python over lists: a probe reads these inside
        its timed steps, and a tensor's item access costs microseconds)."""
        size = len(self.letters)
        first = int(torch.randint(0, size, (), generator=generator))
        follow = (torch.rand(length, generator=generator) < self.FOLLOW).tolist()
        noise = torch.randint(0, size, (length,), generator=generator).tolist()
        walk = [first]
        for i in range(1, length):
            walk.append(self._next[walk[-1]] if follow[i] else noise[i])
        return torch.tensor(walk, dtype=torch.long)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.length:  # ends iteration (LengthGroupedSampler iterates)
            raise IndexError(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.offset + index)
        letters = self._walk(generator, self.seq_len)
        ids = self.letters[letters]
        item = {"input_ids": ids, "attention_mask": torch.ones(self.seq_len, dtype=torch.long)}
        if self.task == Task.SEQ2SEQ:
            source = letters[: self.target_len]
            if len(source) < self.target_len:
                source = torch.cat([source, self._walk(generator, self.target_len - len(source))])
            item["labels"] = self.letters[self.successor[source]]
        elif self.task == Task.CLASSIFICATION:
            item["labels"] = letters[0] % self.num_labels
        elif self.task == Task.MASKED_LM:  # each position's successor: not a plain copy
            item["labels"] = self.letters[self.successor[letters]]
        else:
            item["labels"] = ids.clone()
        return item


class PackedBatches:
    """Padding-free batches: transformers' DataCollatorWithFlattening (every sequence of
    the micro-batch in one row, position ids restarting at each), counting tokens.

    Only for causal LMs whose attention keeps packed sequences apart (checked by
    autotune.hf._packing before the lever is offered). Nothing is padded."""

    def __init__(self, *, flash_attention: bool = False) -> None:
        self.inner = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_attention)  # type: ignore[no-untyped-call]

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [{"input_ids": [int(t) for t in f["input_ids"]]} for f in features]
        return dict(self.inner(ids))
