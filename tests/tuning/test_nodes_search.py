"""A search across two nodes, simulated as two `autotune search` processes on this machine
(each --nproc-per-node 1, its own --node-rank, torchrun's c10d rendezvous on loopback,
gloo): one study, the global batch counting both nodes, the export trained by the user's
script under the exported two-node line; a node killed mid-probe ends the head's search
within the stated bounds, with one line naming it, and leaves no process behind."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_GPT2, autotune, probes_running, write_model

from autotune.core.nodes import JOIN_S, PROCESS_GROUP_S, REPORT_S

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
import torch
from transformers import AutoModelForCausalLM, GPT2Config, HfArgumentParser
from transformers import Trainer, TrainingArguments
(args,) = HfArgumentParser(TrainingArguments).parse_json_file(sys.argv[1])
args.max_steps, args.report_to, args.output_dir = 2, [], "out"
torch.manual_seed(0)
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 512, (64, 16))]
model = AutoModelForCausalLM.from_config(GPT2Config(**%s))
Trainer(model=model, args=args, train_dataset=data).train()
print("trained", torch.distributed.get_world_size())
"""


def search(work: Path, rank: int, storage: Path) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        "./tiny",
        "--device",
        "cpu",
        "--no-reuse",
        "--no-rehearse",
        "--lever",
        "torch_compile=false",
        "--lever",
        "attn_implementation=sdpa",
        # DDP's own process group bounds a silent peer (60 s); DeepSpeed's collectives
        # do not take it, and a lost node under ZeRO waits out --trial-timeout
        "--lever",
        "zero_stage=0",
        "--global-batch-size",
        "32",
        "--seq-len",
        "64",
        "--precisions",
        "fp32",
        "--optimizers",
        "adamw_torch,adafactor",
        "--checkpointing",
        "off",
        "--max-trials",
        "4",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--confirm-top",
        "0",
        "--parity",
        "off",
        "--quiet",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--rdzv-endpoint",
        "127.0.0.1",
        "--study",
        "across",
        "--storage",
        str(storage),
    ]
    return subprocess.Popen(
        argv,
        cwd=work,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_nodes_search_one_study_and_a_node_killed_mid_probe_stops_the_head(
    tmp_path: Path,
) -> None:
    write_model(tmp_path / "tiny", TINY_GPT2)
    storage = tmp_path / "shared" / "across.log"  # a journal on a filesystem both share
    follower = search(tmp_path, 1, storage)
    head = search(tmp_path, 0, storage)
    joined, lines = 0, []
    deadline = time.monotonic() + 300
    assert follower.stderr is not None
    while joined < 2 and time.monotonic() < deadline:  # the second run: mid-probe
        line = follower.stderr.readline()
        if not line:
            break
        lines.append(line)
        joined += "joining run" in line
    assert joined == 2, "".join(lines) + (head.communicate(timeout=60)[1] or "")
    time.sleep(6)  # its ranks joined the rendezvous and train (a probe here takes ~10 s)
    follower.send_signal(signal.SIGKILL)  # as a machine going down: no cleanup in it
    killed = time.monotonic()
    follower.wait()
    _, err = head.communicate(timeout=JOIN_S + PROCESS_GROUP_S + REPORT_S + 60)
    ended = time.monotonic() - killed
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert head.returncode == 1 and said, err
    assert said[-1].startswith("error: node 1 stopped: the search stops"), said
    assert "--node-rank 1" in said[-1]
    assert ended < JOIN_S + REPORT_S + 30, f"the head took {ended:.0f} s to stop"
    print(f"the head stopped {ended:.1f} s after node 1 was killed")
    time.sleep(2)
    assert probes_running(tmp_path) == []  # the killed node's ranks died with it

    done = autotune(tmp_path, "export", "--study", "across", "--storage", str(storage))
    assert done.returncode == 0, done.stderr
    (summary_path,) = (tmp_path / "studies").glob("across*.best.summary.json")
    summary = json.loads(summary_path.read_text())
    best_path = summary_path.with_name(summary_path.name.replace(".summary", ""))
    best = json.loads(best_path.read_text())
    # the global batch counts both nodes' processes: 16 a process, 2 processes
    assert summary["global_batch_size"] == 32 and summary["nnodes"] == 2
    assert best["per_device_train_batch_size"] * best["gradient_accumulation_steps"] == 16
    launch = summary["launch"]
    assert launch.startswith("torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d")
    assert summary["launch_srun"].startswith("srun --nodes 2 --ntasks-per-node 1 bash -c")

    (tmp_path / "train.py").write_text(SCRIPT % json.dumps(TINY_GPT2))
    words = shlex.split(
        launch.replace("HEAD_ADDR:29400", f"127.0.0.1:{free_port()}")
        .replace("your_script.py", "train.py")
        .replace("ARGS.json", str(best_path))
    )
    argv = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
    nodes = [
        subprocess.Popen(
            argv, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for node in nodes:
        out, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-2000:]
        assert "trained 2" in out
