"""A notebook, executed by a real Jupyter kernel, tunes a Trainer factory defined in its
own cell with `autotune.search` and reads the export back with `autotune.load`: the
factory has no file the probes could import, so it travels to them by value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

CELLS = [
    """
import os
import sys
sys.path.insert(0, TESTS)
from pathlib import Path
from job_script import BASE_ARGS, write_job

work = Path(WORK)
write_job(work)  # a small Llama, a tokenizer and a jsonl dataset
""",
    """
from trl import SFTConfig

def make_trainer(args: SFTConfig):  # defined here, in the notebook: no file to import
    import os

    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    with open(work / "notebook_calls.log", "a") as out:  # which process called it
        print(os.getpid(), file=out)
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(work / "model"),
        args=args,
        train_dataset=load_dataset("json", data_files=str(work / "train.jsonl"), split="train"),
        processing_class=AutoTokenizer.from_pretrained(work / "tokenizer"),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
""",
    """
import autotune

outcome = autotune.search(
    make_trainer,
    base_args=SFTConfig(**BASE_ARGS, use_cpu=True),
    memory_budget="4GiB",
    time_budget="5m",
    device="cpu",
    precisions="fp32",
    optimizers="adamw_torch",
    checkpointing="off",
    max_trials=1,
    warmup_steps=1,
    measure_steps=2,
    confirm_top=0,
    parity="off",
    rehearse=False,
    levers=["torch_compile=false"],
    quiet=True,
)
tuned = autotune.load(outcome.study_name)
print(outcome.study_name, tuned["per_device_train_batch_size"], tuned["max_length"], os.getpid())
""",
]


def test_a_notebook_tunes_a_factory_defined_in_its_own_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    work = tmp_path / "job"
    where = f"TESTS = {str(ROOT / 'tests')!r}\nWORK = {str(work)!r}\n"
    cells = [where + CELLS[0], *CELLS[1:]]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the kernel inherits it
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    study, batch, max_length, kernel = printed.splitlines()[-1].split()
    assert study == "make_trainer" and int(max_length) == 64 and int(batch) in (8, 4, 2, 1)
    exported = json.loads((tmp_path / "studies" / "make_trainer.best.json").read_text())
    assert exported["per_device_train_batch_size"] == int(batch)
    assert (tmp_path / "studies" / "factories" / "make_trainer.pkl").is_file()
    # the cell's function ran in the survey's and the probe's own processes
    callers = (work / "notebook_calls.log").read_text().split()
    assert len(callers) == 2 and kernel not in callers and len(set(callers)) == 2
