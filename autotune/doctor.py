"""`autotune doctor`: check, on this machine, each assumption the search rests on.

Each check runs real probes (child processes, as a search does) on a tiny model built
from a config, or measures the device directly, and returns a typed `Check`; the view
prints them as a table and the command exits 1 when one fails.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from autotune.core.checkpointing import Checkpointing
from autotune.core.device import DeviceInfo, supported_precisions
from autotune.core.enums import DeviceKind, Outcome, Precision, Task
from autotune.core.optimizers import PLAIN as PLAIN_OPTIMIZER
from autotune.core.subnormals import SLOW as SUBNORMALS_SLOW
from autotune.core.trial import Candidate, ModelSpec, TrialConfig, TrialResult
from autotune.core.units import format_size
from autotune.launch.forkserver import ForkServer
from autotune.launch.runner import run_trial
from autotune.probe import subnormals
from autotune.probe.flops import measure_peak_flops
from autotune.system.devices import cuda_device_count, process_data_limit

MIB = 2**20
TINY = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 128,
    "vocab_size": 512,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
# Dense peaks from the datasheets (FLOP/s, no sparsity), matched on the device name.
DATASHEET = {
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}
# An import-time reservation (the one Arrow's mimalloc pool made: ~1 GiB) shows as data
# segment far above the resident set; a few hundred MiB is thread stacks and arenas.
RESERVATION_SLACK = 512 * MIB
PEAK_AGREEMENT = 0.10


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: information only (the search holds either way)
    figures: str
    advice: str = ""


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    device: DeviceInfo
    versions: dict[str, str]
    checks: tuple[Check, ...]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]


class Doctor:
    """Runs the checks in a scratch folder; each probe is a child process."""

    def __init__(self, device: DeviceInfo, work: Path, timeout_s: float = 300.0) -> None:
        self.device = device
        self.work = work
        self.timeout_s = timeout_s
        self.model = ModelSpec("doctor-tiny-gpt2", "local", Task.CAUSAL_LM, TINY)
        self.count = 0

    def probe(
        self,
        candidate: Candidate,
        *,
        limit: int | None,
        nproc: int = 1,
        server: ForkServer | None = None,
    ) -> TrialResult:
        self.count += 1
        config = TrialConfig(
            number=self.count,
            trial_dir=str(self.work / str(self.count)),
            model=self.model,
            candidate=candidate,
            device=self.device.torch_device,
            seq_len=64,
            target_len=8,
            memory_limit_bytes=limit,
            warmup_steps=1,
            measure_steps=2,
            nproc_per_node=nproc,
        )
        return run_trial(config, timeout_s=self.timeout_s, server=server)

    def plain(
        self, batch: int = 8, precision: str = "fp32", optim: str = PLAIN_OPTIMIZER
    ) -> Candidate:
        return Candidate(batch, 1, Precision(precision), Checkpointing.OFF, optim)

    def run(self, optimizers: tuple[str, ...]) -> Iterator[Check]:
        """Each check as it ends (a dozen probes: on a GPU each starts CUDA afresh, and
        the whole takes minutes)."""
        checks: list[Callable[[], Check]] = [
            self.baseline,
            self.peak_agreement,
            self.cap_enforced,
            self.fork_safety,
        ]
        for check in checks:
            yield check()
        yield from self.precisions()
        yield from self.optimizers(optimizers)
        yield from self.matmul_peaks()
        yield self.subnormals()
        yield self.ddp()

    def baseline(self) -> Check:
        """The memory a probe starts from, and that no reservation eats the budget."""
        result = self.probe(self.plain(), limit=None)
        b = result.baseline
        if self.device.kind == DeviceKind.CUDA:
            context = int(b.get("context_bytes", 0))
            return Check(
                "baseline: CUDA context measured and subtracted",
                context > 0,
                f"context {format_size(context)} by {b.get('context_method', '?')}",
                "" if context > 0 else "no context measured: check NVML access",
            )
        vmdata, rss = int(b.get("vmdata_bytes", 0)), int(b.get("rss_bytes", 0))
        ok = result.outcome == Outcome.OK and vmdata - rss < RESERVATION_SLACK
        return Check(
            "baseline: no import-time reservation in the budget",
            ok,
            f"after imports: data segment {format_size(vmdata)}, resident {format_size(rss)}",
            ""
            if ok
            else "an import reserves address space RLIMIT_DATA counts; see "
            "/proc/<pid>/status of a probe (ARROW_DEFAULT_MEMORY_POOL=system is set)",
        )

    def peak_agreement(self) -> Check:
        """The probe's reported peak against the kernel's own count of the child."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        result = self.probe(self.plain(16), limit=None)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if self.device.kind == DeviceKind.CUDA or after <= before:
            reported = format_size(result.peak_memory_bytes or 0)
            return Check("peak: reported vs independent", None, f"reported {reported}")
        reported_peak = result.peak_memory_bytes or 0
        gap = abs(reported_peak - after) / after
        return Check(
            "peak: reported vs the kernel's count of the child",
            gap <= PEAK_AGREEMENT,
            f"reported {format_size(reported_peak)}, kernel {format_size(after)} "
            f"({100 * gap:.1f}% apart)",
        )

    def cap_enforced(self) -> Check:
        """An allocation over the cap raises the typed OOM; the next probe starts clean."""
        ok_run = self.probe(self.plain(8), limit=None)
        peak = ok_run.peak_memory_bytes or 0
        limit = int(peak * 0.9)
        if self.device.kind == DeviceKind.CPU:  # above what the imports hold: training OOMs
            held = int(ok_run.baseline.get("vmdata_bytes", 0))
            limit = held + 2 * max(0, peak - int(ok_run.baseline.get("rss_bytes", 0)))
        small = self.probe(self.plain(64), limit=limit) if peak else None
        after = self.probe(self.plain(8), limit=int(peak * 1.5)) if peak else None
        passed = bool(
            small and after and small.outcome == Outcome.OOM and after.outcome == Outcome.OK
        )
        figures = (
            f"batch 64 under {format_size(limit)}: "
            f"{small.outcome if small else '-'} ({small.error[:60] if small else ''}); "
            f"next probe: {after.outcome if after else '-'}"
        )
        return Check(
            "cap: over-budget allocation fails with the typed OOM",
            passed,
            figures,
            "" if passed else "the memory limit is not enforced on this machine",
        )

    def fork_safety(self) -> Check:
        limit = process_data_limit(self.device.kind, None)
        server = ForkServer(self.work / "forkserver.log", data_limit=limit)
        try:
            if server.fresh_only:
                return Check(
                    "fork server: CUDA not initialised before fork",
                    False,
                    "an import initialised CUDA",
                    "probes fall back to fresh processes",
                )
            result = self.probe(self.plain(), limit=None, server=server)
        finally:
            server.close()
        return Check(
            "fork server: CUDA not initialised before fork; a forked probe runs",
            result.outcome == Outcome.OK,
            f"forked probe: {result.outcome}",
        )

    def precisions(self) -> Iterator[Check]:
        for p in supported_precisions(self.device):
            yield self.one_step(f"precision {p}", self.plain(8, p))

    def optimizers(self, names: tuple[str, ...]) -> Iterator[Check]:
        for o in names:
            yield self.one_step(f"optimizer {o}", self.plain(8, "fp32", o))

    def one_step(self, what: str, candidate: Candidate) -> Check:
        r = self.probe(candidate, limit=None)
        return Check(f"{what} trains a step", r.outcome == Outcome.OK, _figures(r), r.reason)

    def matmul_peaks(self) -> Iterator[Check]:
        sheet = next((v for k, v in DATASHEET.items() if k in self.device.name), None)
        for precision in supported_precisions(self.device):
            measured = measure_peak_flops(self.device.kind, precision)
            known = sheet.get(precision) if sheet else None
            if known is None:
                yield Check(
                    f"matmul peak {precision}",
                    None,
                    f"{measured / 1e12:.3f} TFLOP/s (no datasheet figure)",
                )
                continue
            yield Check(
                f"matmul peak {precision} vs datasheet",
                measured >= 0.5 * known,
                f"{measured / 1e12:.1f} of {known / 1e12:.0f} TFLOP/s "
                f"({100 * measured / known:.0f}%)",
                "far below the datasheet: clocks, power cap, or a shared GPU",
            )

    def subnormals(self) -> Check:
        """What this CPU pays for arithmetic on subnormal numbers. A stand-in's random
        weights can make them where the trained checkpoint does not (mt5-small's: a
        twice slower fp32 step on an Intel Xeon), and a run can make more as it goes
        (4% of that softmax at the first step, 22% at the 20th), so its later steps slow
        down where a probe times its first ones."""
        name = "subnormal numbers"
        if self.device.kind == DeviceKind.CUDA:
            return Check(name, None, "a GPU adds and multiplies them at full speed; not timed")
        slowdown, low, high = subnormals.slowdown()
        figures = (
            f"an fp32 matmul of subnormal inputs takes {slowdown:.1f}x as long "
            f"({low:.1f}-{high:.1f}x)"
        )
        if slowdown < SUBNORMALS_SLOW:
            return Check(name, None, figures)
        return Check(
            name,
            None,
            figures,
            "fp32 steps that make subnormal numbers run slower here, and slower still as "
            "a run makes more of them: torch.set_flush_denormal(True) at your script's "
            "start flushes them to zero",
        )

    def ddp(self) -> Check:
        devices = _gpus() if self.device.kind == DeviceKind.CUDA else len(os.sched_getaffinity(0))
        if devices < 2:
            return Check("DDP: a 2-rank torchrun probe", None, "needs 2 devices; skipped")
        r = self.probe(self.plain(8), limit=None, nproc=2)
        return Check("DDP: a 2-rank torchrun probe", r.outcome == Outcome.OK, _figures(r), r.reason)


def run_doctor(
    *,
    device: DeviceInfo,
    optimizers: tuple[str, ...],
    versions: dict[str, str],
    work: Path | None = None,
    on_check: Callable[[Check], None] = lambda check: None,
) -> DoctorReport:
    """Every check, each handed to `on_check` as it ends."""
    checks = []
    with tempfile.TemporaryDirectory(prefix="autotune-doctor-") as tmp:
        for check in Doctor(device, work or Path(tmp)).run(optimizers):
            on_check(check)
            checks.append(check)
    return DoctorReport(device, versions, tuple(checks))


def _figures(result: TrialResult) -> str:
    if result.outcome != Outcome.OK:
        return str(result.outcome)
    return (
        f"{result.samples_per_s or 0:.1f} samples/s, "
        f"peak {format_size(result.peak_memory_bytes or 0)}"
    )


def _gpus() -> int:

    return cuda_device_count()
