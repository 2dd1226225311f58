"""The CLI's errors: one line, the right exit code, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from autotune.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.err


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def assert_nothing_written(path: Path) -> None:
    assert not (path / "studies").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nobody/no-such-model"], "not found: no local directory"),
        (["--model", "gpt2", "--memory-budget", "8XB"], "'8XB' is not a size"),
        (["--model", "gpt2", "--time-budget", "-3m"], "'-3m' is not a duration"),
        (["--model", "gpt2", "--global-batch-size", "12"], "no per-device batch divides"),
        (["--model", "gpt2", "--device", "cpu", "--precisions", "tf32"], "none is supported"),
        (["--model", "gpt2", "--precisions", "fp64"], "fp64 not in"),
        (["--model", "gpt2", "--optimizers", "adamw_magic"], "adamw_magic not available"),
        (["--model", "gpt2", "--seq-len", "4096"], "exceeds gpt2's limit of 1024"),
        (["--model", "gpt2", "--device", "cuda"], "no CUDA GPU"),
        (["--model", "gpt2", "--dataset", "./none.jsonl"], "no such file or folder"),
        (["--model", "gpt2", "--tokenizer", "./tok"], "--tokenizer need --dataset"),
        (["--model", "gpt2", "--parallel", "64"], "--parallel 64 needs at least 64 cores"),
        (["--model", "gpt2", "--devices", "0,1"], "--devices needs CUDA GPUs"),
        (["--model", "gpt2", "--nproc-per-node", "3"], "not divisible by --nproc-per-node 3"),
        (["--model", "gpt2", "--memory-budget", "0.5"], "'0.5' is not a size"),
        (["--model", "gpt2", "--memory-budget", "0.5B"], "less than one byte"),
        (["--model", "gpt2", "--memory-budget", "9" * 401 + "B"], "too large"),
        (["--model", "gpt2", "--headroom", "nan"], "'nan' is not between 0.0 and 0.5"),
        (["--model", "gpt2", "--seed", "-1"], "-1 is not in the range"),
        (["--model", "gpt2", "--trial-timeout", "99999999999"], "longer than a year"),
        (["--model", "gpt2", "--global-batch-size", "8000000000"], "over the limit of"),
        (["--model", "gpt2", "--device", "cuda:abc"], "is not one of auto, cpu, cuda"),
        (["--model", "gpt2", "--study", "../outside"], "--study '../outside' is not a usable"),
        (["--model", "gpt2", "--study", "/abs/name"], "is not a usable name"),
        (["--model", "gpt2", "--dataset", "./none.jsonl", "--parallel", "64"], "--parallel 64"),
        (["--model", "gpt2", "--lever", "fsdp=true"], "NAME one of torch_compile"),
        (["--model", "gpt2", "--lever", "torch_compile=maybe"], "'maybe' is not true/false"),
        (["--model", "gpt2", "--lever", "use_liger_kernel=true"], "True is not available here"),
        (["--model", "gpt2", "--lever", "attn_implementation=flash_attention_2"], "flash-attn"),
        (["--model", "gpt2", "--train-steps", "0"], "0 is not in the range"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    if argv[-1] == "cuda" and os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU is present")
    code, err = run(["search", *argv], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert_nothing_written(in_tmp)


def test_model_dir_without_config(capsys: pytest.CaptureFixture[str], in_tmp: Path) -> None:
    (in_tmp / "empty").mkdir()
    code, err = run(["search", "--model", "./empty"], capsys)
    assert code == 2
    assert (
        err.strip() == "error: './empty' has no config.json; pass a model directory saved "
        "with save_pretrained, or a hub id"
    )
    assert_nothing_written(in_tmp)


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.core.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="nobody/no-such-model"):
        main(["--debug", "search", "--model", "nobody/no-such-model"])


def test_export_of_a_missing_study(capsys: pytest.CaptureFixture[str], in_tmp: Path) -> None:
    code, err = run(["export", "--study", "nope", "--storage", f"sqlite:///{in_tmp}/x.db"], capsys)
    assert code == 1
    assert "no study named 'nope'" in err


def test_budget_below_the_weights(capsys: pytest.CaptureFixture[str], in_tmp: Path) -> None:
    code, err = run(["search", "--model", "gpt2", "--memory-budget", "100MiB"], capsys)
    assert code == 2
    assert "below the 475 MiB the fp32 weights alone need (124M parameters)" in err
    assert_nothing_written(in_tmp)


@pytest.mark.parametrize(
    "storage",
    [
        "sqlite:////proc/no-such-dir/autotune.db",
        "postgresql://nobody@127.0.0.1:1/none",
        "bogus://x",
    ],
)
def test_storage_that_cannot_be_opened(
    storage: str, capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    code, err = run(["search", "--model", "gpt2", "--storage", storage], capsys)
    assert code == 1
    assert err.startswith(f"error: cannot open storage {storage!r}")
    assert len(err.strip().splitlines()) == 1
    assert_nothing_written(in_tmp)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"per_device_train_batch_size": 0}', "per_device_train_batch_size is 0; it must be"),
        ('{"per_device_train_batch_size": "eight"}', "is 'eight'; it must be a whole number"),
        ('{"per_device_train_batch_size": 8, "max_seq_length": -5}', "max_seq_length is -5"),
        ('{"gradient_accumulation_steps": 2.5, "per_device_train_batch_size": 8}', "is 2.5"),
    ],
)
def test_base_args_values_that_mean_nothing_are_refused(
    content: str, message: str, capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    (in_tmp / "args.json").write_text(content)
    code, err = run(["search", "--model", "gpt2", "--base-args", "args.json"], capsys)
    assert (code, len(err.strip().splitlines())) == (2, 1)
    assert message in err, err
    assert not (in_tmp / "studies").exists()


def test_default_study_names_are_path_safe() -> None:
    from autotune.core.paths import default_study_name

    assert default_study_name("..") == "study"
    assert default_study_name("/") == "study"
    assert default_study_name("google/mt5-small") == "mt5-small"
    assert default_study_name("./my model!") == "my-model"


def test_the_dashboard_refuses_the_network_without_allow_remote(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = run(["dashboard", "--study", "s", "--host", "0.0.0.0"], capsys)
    assert code == 2 and "--allow-remote" in err and "without authentication" in err


def test_the_dashboard_says_how_to_reach_it_what_it_serves_and_what_a_trial_holds() -> None:
    from autotune.commands import dashboard_lines

    here = "\n".join(dashboard_lines("s", "sqlite:///studies/autotune.db", "127.0.0.1", 8080, 3))
    assert "http://127.0.0.1:8080/dashboard/studies/3" in here
    assert "listens on 127.0.0.1 only" in here and "ssh -L 8080:localhost:8080" in here
    assert "every study in that storage" in here and "samples/s" in here and "peak memory" in here
    remote = "\n".join(dashboard_lines("s", "sqlite:///x.db", "0.0.0.0", 9000, 1))
    assert "ssh -L" not in remote and "without authentication" in remote


def test_parallel_cpu_probes_cannot_share_more_memory_than_the_machine_has(
    capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores for --parallel 2")
    from autotune.system.devices import cpu_memory_bytes

    budget = int(0.6 * cpu_memory_bytes())
    argv = [
        "search",
        "--model",
        "gpt2",
        "--device",
        "cpu",
        "--parallel",
        "2",
        "--memory-budget",
        f"{budget}B",
    ]
    code, err = run(argv, capsys)
    assert code == 2 and "--parallel 2 probes at once exceeds this machine" in err
    assert_nothing_written(in_tmp)


def test_storage_passwords_never_appear_in_messages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://alice:S3cretPW@127.0.0.1:1/db"
    code, err = run(["show", "--study", "s", "--storage", url], capsys)
    assert code == 1 and "cannot open storage" in err
    assert "S3cretPW" not in err and "alice" in err


def test_an_export_over_a_users_file_is_refused_before_the_search(
    capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    (in_tmp / "mine.json").write_text('{"learning_rate": 0.1}')
    code, err = run(["search", "--model", "gpt2", "--output", "mine.json"], capsys)
    assert code == 1 and "not written by autotune" in err and "--force" in err
    assert (in_tmp / "mine.json").read_text() == '{"learning_rate": 0.1}'
    assert_nothing_written(in_tmp)


def test_one_study_name_in_two_storages_gets_two_folders(tmp_path: Path) -> None:
    from autotune.core.paths import default_storage, study_folder

    studies = tmp_path / "studies"
    default = study_folder(studies, "s", default_storage(studies))
    other = study_folder(studies, "s", "postgresql://bob:pw@host/db")
    assert default == studies / "s"
    assert other != default and other.name.startswith("s-")
    assert study_folder(studies, "s", "postgresql://bob:other@host/db") == other  # not keyed on pw


def test_a_heartbeat_interval_that_is_not_a_number_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, in_tmp: Path
) -> None:
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "ten")
    code, err = run(["show", "--study", "s"], capsys)
    assert code == 2 and "AUTOTUNE_HEARTBEAT_S='ten' is not a whole number" in err
    assert len(err.strip().splitlines()) == 1


def test_every_option_of_every_command_says_what_it_does() -> None:
    from autotune.cli import cli

    missing = [
        f"{name} {'/'.join(param.opts)}"
        for name, command in cli.commands.items()
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert missing == []


def test_activation_checkpointing_is_the_name_and_checkpointing_still_works(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flag in ("--activation-checkpointing", "--checkpointing"):
        code, err = run(["search", "--model", "gpt2", flag, "sometimes"], capsys)
        assert code == 2 and "sometimes not in off, every-4, every-2, on, offload" in err


@pytest.fixture
def demo(in_tmp: Path) -> list[str]:
    """The recorded example study (tuned on the CPU), copied: --study and --storage."""
    from conftest import ROOT

    (in_tmp / "demo.db").write_bytes((ROOT / "examples" / "demo" / "autotune.db").read_bytes())
    return ["--study", "mt5-small", "--storage", f"sqlite:///{in_tmp / 'demo.db'}"]


def test_a_cpu_study_says_so_and_use_cpu_never_reaches_a_gpu_run_unannounced(
    demo: list[str], capsys: pytest.CaptureFixture[str], in_tmp: Path
) -> None:
    main(["export", *demo, "--format", "cli"])
    out, err = capsys.readouterr()
    assert "--use_cpu True" in out and "use_cpu true is set" in err and "--for-device cuda" in err
    main(["export", *demo, "--format", "cli", "--for-device", "cuda"])
    out, err = capsys.readouterr()
    assert "use_cpu" not in out and "--tf32 False" in out and "figures are that device's" in err
    (in_tmp / "mine.json").write_text('{"learning_rate": 0.001, "use_cpu": false}')
    main(["export", *demo, "--merge-into", "mine.json", "--for-device", "cuda"])
    merged = json.loads((in_tmp / "mine.json").read_text())
    assert merged["use_cpu"] is False and merged["learning_rate"] == 0.001


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "cli", "--output", "x.json"], "--format cli prints flags"),
        (["--output", "x.json", "--merge-into", "y.json"], "not both"),
        (["--for-device", "cuda"], "--for-device goes with --merge-into or --format cli"),
    ],
)
def test_export_refuses_options_that_would_be_ignored(
    demo: list[str], extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["export", *demo, *extra], capsys)
    assert code == 2 and message in err


def test_estimate_as_json_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "estimate",
            "--model",
            "gpt2",
            "--device",
            "cpu",
            "--precisions",
            "fp32,bf16",
            "--optimizers",
            "adamw_torch,adafactor",
            "--format",
            "json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    # GPT-2's 12 layers on the CPU: checkpointing off, every 4th, every 2nd, every layer
    assert data["parameters"] == 124_439_808 and len(data["rows"]) == 2 * 2 * 4
    levels = [row["activation_checkpointing"] for row in data["rows"]][:4]
    assert levels == ["off", "every-4", "every-2", "on"]
    for row in data["rows"]:  # the peak: backward's activations or the optimizer's step
        static = sum(row[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"))
        moment = max(
            row["activations_bytes"], row["optimizer_step_bytes"], row["embedding_gradient_bytes"]
        )
        assert row["total_bytes"] == static + moment
    # AdamW on the CPU steps a tensor at a time: two copies of the largest, gpt2's
    # 50257 x 768 embedding
    adamw = next(r for r in data["rows"] if r["optim"] == "adamw_torch")
    assert adamw["optimizer_step_bytes"] == 2 * 4 * 50257 * 768
    # the tied embedding (input and output layer): its two gradients and their sum at
    # backward's end, one of which becomes the gradient (no accumulation at --batch 8)
    assert adamw["embedding_gradient_bytes"] == 2 * 4 * 50257 * 768


def test_estimate_of_a_lora_stand_in(capsys: pytest.CaptureFixture[str]) -> None:
    """With --lora the estimate is the adapter's job: gradients and AdamW state for the
    adapter alone, the base's weights frozen as held; a malformed adapter, or one whose
    targets the model lacks, is refused in one line."""
    flags = ["estimate", "--model", "gpt2", "--device", "cpu", "--precisions", "fp32"]
    main([*flags, "--optimizers", "adamw_torch", "--format", "json"])
    full = json.loads(capsys.readouterr().out)
    main([*flags, "--optimizers", "adamw_torch", "--lora", "r=8,alpha=16,targets=c_attn"])
    main(
        [*flags, "--optimizers", "adamw_torch", "--lora", "r=8,targets=c_attn", "--format", "json"]
    )
    out = capsys.readouterr().out
    assert "124.7M parameters, 0.29M of them train" in out
    lora = json.loads(out[out.index("{") :])
    trains = lora["trainable_parameters"]
    assert trains == 12 * 8 * (768 + 3 * 768) and lora["parameters"] == 124_439_808 + trains
    off = lora["rows"][0]
    assert off["gradients_bytes"] == 4 * trains and off["optimizer_state_bytes"] == 8 * trains
    assert off["total_bytes"] < full["rows"][0]["total_bytes"]
    for bad in ("r=8,targets", "r=8,targets=q_proj"):  # malformed; a layer gpt2 lacks
        code, err = run([*flags, "--lora", bad], capsys)
        assert code == 2 and err.count("\n") == 1 and "--lora" in err


def test_search_help_groups_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    main(["search", "--help"])
    out = capsys.readouterr().out
    headings = [
        "Common:",
        "Advanced: the workload:",
        "Advanced: your data:",
        "Advanced: what to try:",
        "Advanced: how to search:",
        "Advanced: storage and workers:",
        "Advanced: output:",
    ]
    positions = [out.index(h) for h in headings]
    assert positions == sorted(positions) and "Other options:" not in out
    common = out[out.index("Common:") : out.index("Advanced: the workload:")]
    # the few options most searches set, first, and no more than 8 of them
    common_ones = ("--model", "--memory-budget", "--time-budget", "--objective", "--study")
    assert [o for o in common_ones if o in common] == list(common_ones)
    assert common.count("\n  --") <= 8 and "30m]" in common
    for lever in (
        "torch_compile",
        "attn_implementation",
        "use_liger_kernel",
        "padding_free",
        "dataloader_num_workers",
    ):
        assert lever in out  # every searched dimension, and when it is offered


def test_debug_works_after_the_command_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(Exception, match="not found"):  # the traceback's exception, raised
        main(["search", "--model", "nobody/no-such-model", "--debug"])
    code, err = run(["search", "--model", "nobody/no-such-model"], capsys)
    assert code == 2 and "Traceback" not in err


@pytest.mark.parametrize(("debug", "shown"), [(False, ""), (True, "kernel missing\n")])
def test_what_the_libraries_log_stays_off_the_terminal_unless_debugging(
    debug: bool, shown: str
) -> None:
    """bitsandbytes (imported through peft) logged a missing optional kernel on every
    search, as the first line a user saw: only autotune speaks, --debug shows it."""
    code = (
        "import logging; from autotune.cli import library_logs; "
        f"library_logs(debug={debug}); "
        "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('kernel missing')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr == shown


def test_every_search_option_is_one_field_of_the_options_object() -> None:
    """An option is declared once, as a field of SearchOptions; click's declaration must
    name the same fields with the same defaults, so adding one without the other fails."""
    import dataclasses

    from autotune.cli import search
    from autotune.tuning.options import SearchOptions

    ctx = click.Context(search)
    params = {p.name: p for p in search.params if p.name not in ("help", "fmt")}
    fields = {f.name: f for f in dataclasses.fields(SearchOptions)}
    assert set(params) == set(fields)
    for name, param in params.items():
        declared = param.get_default(ctx)
        unset = declared is None or getattr(declared, "name", "") == "UNSET"  # click 8.4
        empty = () if getattr(param, "multiple", False) else None  # what click passes
        flag_default = empty if unset else param.type_cast_value(ctx, declared)
        field = fields[name]
        default = None if field.default is dataclasses.MISSING else field.default
        assert flag_default == default, name
