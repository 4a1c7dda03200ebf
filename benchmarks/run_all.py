"""Run every benchmark and write one table of figures, each next to its target.

Each benchmark runs as its own process with ``--json`` and a timeout; its last stdout line
is the JSON object of benchmarks/common.py. Writes ``benchmarks/RESULTS.md``: the machine,
the command, and a markdown table (benchmark | figure | value | target | met). A benchmark
that fails or times out is a row saying so, and this runner then exits 1.

    python benchmarks/run_all.py [--only NAME[,NAME]] [--quick] [--out FILE] [--strict]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from common import fmt_value

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    args: list[str] = field(default_factory=list)
    quick: list[str] = field(default_factory=list)
    timeout_s: float = 1800.0
    quick_timeout_s: float = 600.0
    optional: bool = False
    """Skipped (not failed) when its script is absent and it was not asked for by name."""


BENCHES = [
    Bench("checkpoint_cost", "checkpoint_cost.py", [], ["--steps", "20", "--rounds", "1"], 1800),
    Bench("transfer_vs_scp", "transfer_vs_scp.py", [], ["--mb", "32", "--rounds", "1"], 1800),
    Bench("host_to_host", "host_to_host.py", [], ["--mb", "32", "--rounds", "1"], 1200, 300),
    Bench("replica_lag", "replica_lag.py", [], ["--quick"], 900, 300),
    Bench("mttr_cold", "mttr.py", [], ["--trials", "1"], 2400),
    Bench("mttr_warm", "mttr.py", ["--warm"], ["--warm", "--trials", "1"], 2400),
    Bench("mttr_default", "mttr.py", ["--defaults"], ["--defaults", "--trials", "1"], 2400),
    Bench("console_scale", "console_scale.py", [], ["--quick"], 1800, optional=True),
    Bench("console_scale_ssh", "console_scale_ssh.py", [], ["--quick"], 2400, 600, optional=True),
    Bench("protocol_rate", "protocol_rate.py", [], ["--quick"], 600, 300),
    Bench("executor_overhead", "executor_overhead.py", [], ["--quick"], 1800),
    Bench("journal_startup", "journal_startup.py", [], ["--events", "100000"], 600, 300),
    Bench("restart_vs_torchrun", "restart_vs_torchrun.py", [], ["--quick"], 1800, 900),
    Bench("byo_script", "byo_script.py", [], ["--quick"], 1800, 900),
    Bench("planned_move", "planned_move.py", [], ["--quick"], 1200, 600),
    Bench("multihost_torchrun", "multihost_torchrun.py", [], ["--quick"], 1200, 600),
    Bench("multihost_restart", "multihost_restart.py", [], ["--quick"], 2400, 900),
    Bench("elastic_reduce", "elastic_reduce.py", [], ["--quick"], 900, 300),
    Bench("elastic_resize", "elastic_resize.py", [], ["--quick"], 1200, 600),
    Bench("provision_mttr", "provision_mttr.py", [], ["--trials", "1"], 1200, 600),
    Bench("lease_under_load", "lease_under_load.py", [], ["--seconds", "20"], 1200, 600),
    Bench("sharded_checkpoint", "sharded_checkpoint.py", [], ["--quick"], 1800, 600),
    Bench("local_ranks", "local_ranks.py", [], ["--quick"], 1200, 600),
    Bench(
        "console_restart", "console_restart.py", [], ["--trials", "2", "--every", "12"], 900, 300
    ),
    Bench(
        "console_failover", "console_failover.py", [], ["--trials", "2", "--every", "15"], 900, 300
    ),
]


@dataclass
class Result:
    bench: Bench
    seconds: float
    body: dict[str, Any] | None = None
    error: str | None = None
    skipped: str | None = None


def one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def parse(stdout: str, name: str) -> dict[str, Any]:
    """The benchmark's JSON object: its last non-empty stdout line."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("printed nothing on stdout")
    try:
        body = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise ValueError(f"last stdout line is not JSON: {one_line(lines[-1], 80)}") from None
    if not isinstance(body, dict) or not isinstance(body.get("figures"), list):
        raise ValueError("last stdout line is not a {benchmark, figures, notes} object")
    for f in body["figures"]:
        if not isinstance(f, dict) or not {"name", "value", "unit"} <= set(f):
            raise ValueError(f"a figure lacks name, value or unit: {one_line(str(f), 80)}")
    return body


def run(bench: Bench, quick: bool) -> Result:
    script = HERE / bench.script
    if not script.exists():
        return Result(bench, 0.0, error=f"{script.relative_to(REPO)} does not exist")
    args = bench.quick if quick else bench.args
    timeout = bench.quick_timeout_s if quick else bench.timeout_s
    cmd = [sys.executable, str(script), *args, "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    # its own session, so a timeout ends the benchmark and everything it started (sshd, executors)
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return Result(bench, time.monotonic() - t0, error=f"timed out after {timeout:g} s")
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        last = [ln for ln in err.splitlines() if ln.strip()]
        why = one_line(last[-1]) if last else "no message on stderr"
        return Result(bench, seconds, error=f"exit {proc.returncode}: {why}")
    try:
        return Result(bench, seconds, body=parse(out, bench.name))
    except ValueError as e:
        return Result(bench, seconds, error=str(e))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.communicate(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _read(path: str, key: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _command(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def machine() -> list[tuple[str, str]]:
    mem = _read("/proc/meminfo", "MemTotal")
    ram = f"{int(mem.split()[0]) / 2**20:.1f} GiB" if mem.split()[0].isdigit() else mem
    gpus = _command(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return [
        ("CPU", _read("/proc/cpuinfo", "model name")),
        ("cores", str(os.cpu_count())),
        ("RAM", ram),
        ("GPU", ", ".join(gpus.splitlines()) if gpus else "none"),
        ("torch", torch),
        ("Python", platform.python_version()),
        ("OS", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("commit", _command(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]) or "unknown"),
        ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
    ]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(results: list[Result], command: str, quick: bool) -> str:
    out = ["# Benchmark results", ""]
    if quick:
        out += ["**Quick smoke run** (fewer rounds and trials): not figures to quote.", ""]
    out += ["| machine | |", "|---|---|"]
    out += [f"| {k} | {_cell(v)} |" for k, v in machine()]
    out += ["", f"Command: `{command}`", ""]
    out += ["| benchmark | figure | value | target | met |", "|---|---|---|---|---|"]
    notes: list[str] = []
    for r in results:
        name = r.bench.name
        if r.skipped:
            out.append(f"| {name} | skipped: {_cell(r.skipped)} | | | |")
        elif r.error or r.body is None:
            out.append(f"| {name} | **FAILED**: {_cell(r.error)} | | | no |")
        else:
            for f in r.body["figures"]:
                value = (
                    "n/a" if f["value"] is None else f"{fmt_value(float(f['value']))} {f['unit']}"
                )
                met = {True: "yes", False: "**NO**", None: ""}.get(f.get("ok"))
                row = [name, f["name"], value, f.get("target", ""), met]
                out.append("| " + " | ".join(_cell(c) for c in row) + " |")
            notes.append(f"- **{name}** ({r.seconds:.0f} s): {_cell(r.body.get('notes', ''))}")
    return "\n".join([*out, "", "Settings:", "", *notes, ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", help="comma-separated benchmark names: " + ", ".join(b.name for b in BENCHES)
    )
    ap.add_argument("--quick", action="store_true", help="fewer rounds and trials: a smoke check")
    ap.add_argument(
        "--out", type=Path, default=HERE / "RESULTS.md", help="the markdown file to write"
    )
    ap.add_argument(
        "--strict", action="store_true", help="also exit 1 when a figure misses its target"
    )
    args = ap.parse_args()
    known = {b.name: b for b in BENCHES}
    chosen = BENCHES
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in names if n not in known]
        if bad or not names:
            print(f"run_all: --only: unknown benchmark {', '.join(bad) or '(none)'}; have: "
                  f"{', '.join(known)}", file=sys.stderr)  # fmt: skip
            return 2
        chosen = [known[n] for n in names]
    results: list[Result] = []
    for bench in chosen:
        if bench.optional and not args.only and not (HERE / bench.script).exists():
            results.append(Result(bench, 0.0, skipped=f"{bench.script} not present"))
            print(f"{bench.name}: skipped ({bench.script} not present)", file=sys.stderr)
            continue
        print(f"{bench.name}: running ...", file=sys.stderr, flush=True)
        r = run(bench, args.quick)
        results.append(r)
        print(f"{bench.name}: {r.error or 'ok'} ({r.seconds:.0f} s)", file=sys.stderr, flush=True)
    command = " ".join(shlex.quote(a) for a in ["benchmarks/run_all.py", *sys.argv[1:]])
    text = report(results, command, args.quick)
    try:
        args.out.write_text(text)
    except OSError as e:
        print(f"run_all: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(text)
    failed = [r.bench.name for r in results if r.error]
    missed = [
        f"{r.bench.name}: {f['name']}"
        for r in results
        if r.body
        for f in r.body["figures"]
        if f.get("ok") is False
    ]
    if missed:
        print(f"run_all: below target: {'; '.join(missed)}", file=sys.stderr)
    if failed:
        print(f"run_all: failed: {', '.join(failed)} (see {args.out})", file=sys.stderr)
        return 1
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
