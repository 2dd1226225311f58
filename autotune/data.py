"""Synthetic training data at the worst-case length (DESIGN.md, invariant 5).

Every example is exactly as long as the longest one the user will train with and has
no padding, so a config that fits the probe fits every real batch.
"""

from __future__ import annotations

from typing import Any

import torch


class WorstCaseDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
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
    ) -> None:
        self.task = task
        self.length = length
        self.seq_len = seq_len
        self.target_len = target_len
        self.vocab_size = vocab_size
        self.num_labels = num_labels
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(0, self.vocab_size, (self.seq_len,), generator=generator)
        item = {"input_ids": ids, "attention_mask": torch.ones(self.seq_len, dtype=torch.long)}
        if self.task == "seq2seq":
            item["labels"] = torch.randint(
                0, self.vocab_size, (self.target_len,), generator=generator
            )
        elif self.task == "classification":
            item["labels"] = torch.randint(0, self.num_labels, (), generator=generator)
        else:  # causal and masked LM: a loss at every position is the most memory
            item["labels"] = ids.clone()
        return item
