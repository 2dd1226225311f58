"""Tuning on the user's own data, end to end: the example script with a tokenizer
trained locally tunes, exports, and trains with the exported config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PLAIN_LEVERS, ROOT, TINY_T5, autotune, write_model
from helpers import word_tokenizer

pytestmark = pytest.mark.slow


def test_tune_on_local_text_then_train_with_the_export(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "tune_on_local_text.py"),
            str(tmp_path),
            "--lines",
            "200",
            "--max-trials",
            "4",
            "--train-steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "data corpus.txt: 200 samples, tokens: max" in done.stdout
    assert "padding waste" in done.stdout
    assert "trained 3 steps with local-text.best.json" in done.stdout

    shown = json.loads(
        autotune(tmp_path, "show", "--study", "local-text", "--format", "json").stdout
    )
    data = shown["data"]
    assert data["lengths"]["max"] >= data["lengths"]["p90"] >= data["lengths"]["p50"]
    waste = data["padding_waste"]["8"]
    assert waste["group_by_length"] < waste["random"]
    ok = [t for t in shown["trials"] if t["outcome"] == "ok"]
    assert ok and all(t["padding_pct"] is not None and t["tokens_per_s"] for t in ok)
    assert all(t["worst_case_samples_per_s"] for t in ok)
    samplings = {t["training_arguments"].get("train_sampling_strategy", "random") for t in ok}
    assert "group_by_length" in samplings  # the grouped first guess was measured

    summary = json.loads((tmp_path / "studies" / "local-text.best.summary.json").read_text())
    assert summary["data"]["lengths"] == data["lengths"]
    assert 0 < summary["best"]["padding_fraction"] < 1  # lines of varied length: some padding
    table = autotune(tmp_path, "show", "--study", "local-text").stdout
    assert "real tokens/s" in table and "padding waste" in table


def test_a_seq2seq_search_on_text_pairs_times_real_batches(tmp_path: Path) -> None:
    words = "the quick brown fox jumps over a lazy dog and runs".split()
    word_tokenizer(tmp_path / "tok", [" ".join(words)])
    rows = [
        {"document": " ".join(words[: 2 + i % 10] * (1 + i % 3)), "summary": " ".join(words[:3])}
        for i in range(64)
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_model(tmp_path / "tiny-t5", TINY_T5)
    done = autotune(
        tmp_path,
        "search",
        "--model",
        "./tiny-t5",
        "--device",
        "cpu",
        *PLAIN_LEVERS,
        "--dataset",
        "pairs.jsonl",
        "--text-column",
        "document",
        "--target-column",
        "summary",
        "--tokenizer",
        "./tok",
        "--global-batch-size",
        "8",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch",
        "--checkpointing",
        "off",
        "--max-trials",
        "2",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--confirm-top",
        "0",
        "--quiet",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "targets: 64 samples, tokens: max 3" in done.stdout
    assert "33/3 source/target tokens" in done.stdout  # lengths from the data: 11 words x 3
    summary = json.loads((tmp_path / "studies" / "tiny-t5.best.summary.json").read_text())
    assert summary["best"]["padding_fraction"] > 0 and summary["target_len"] == 3
