"""What atomicity costs a Python application: ``python -m decree.bench``.

Two PostgreSQL databases, A and B, each hold ``<table>(id int primary key, balance
bigint)`` with ``--accounts`` rows. A transfer debits one random account in A by 1 and
credits one random account in B by 1, the transfer of ``decree bench --rm postgres``. Per
thread count and round, the same transfers run in these modes, each on its own psycopg 3
connections (two per thread), for ``--duration`` seconds:

- ``independent``: a local transaction on A, committed, then one on B: two independent
  commits, no atomicity (a crash between them loses the credit);
- ``native-2pc``: psycopg's own two-phase API (``tpc_begin``, ``tpc_prepare``,
  ``tpc_commit``) on both connections in decree's order, without decree: what two-phase
  commit costs the databases and the driver, and so the ceiling of any coordinator;
- ``decree``: one decree transaction over both connections (``tm.transaction()``,
  ``tx.enlist``), i.e. prepare both, ``Decide`` on the state server, commit both.

It prints the transfers per second and the p50/p95 latency of every run, the ratio of the
decree mode's tps to the independent mode's (and to the native ceiling's), and the CPU
time this process spent per transfer (``time.process_time``, every thread): the decree
mode's minus the native mode's is what the library itself costs, its minus the
independent mode's is what atomicity costs the application's process. Each run also
gives the whole machine's busy CPU time per transfer (``/proc/stat``; on a shared machine
it counts the neighbours' work too) and, with ``--server-pid``, the state server's. With ``--rounds``
above 1 every round starts with the next mode, and a summary gives the median and range
of the rounds' figures (a shared machine drifts; runs close in time see the same drift).

It needs a running ``decree serve`` whose configuration lists both databases as
``[[rm]]`` entries of kind ``postgres`` (their names go to ``--rm-names``), and the two
databases' connection strings::

    python -m decree.bench --connect unix:/run/decree/decree.sock \\
        --dsn "host=db dbname=a" --dsn "host=db dbname=b" --rm-names pg-a,pg-b \\
        --threads 1,16 --duration 3 --rounds 3

After every run the balances must add up (B gained one per transfer, A+B unchanged) and no
branch of the run may be left prepared; otherwise the benchmark stops with an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import DecreeError
from .protocol import DECREE_FORMAT_ID, GID_PREFIX
from .tm import TransactionManager, connect

MODES = ("independent", "native-2pc", "decree")
BALANCE_START = 1_000_000_000
NATIVE_GID_PREFIX = "decree-pybench-native-"
"""Names of the native mode's prepared transactions; never a decree gid."""


class BenchFailed(Exception):
    """A transfer failed or an invariant did not hold after a run."""


@dataclass(frozen=True)
class Spec:
    connect: str
    dsns: tuple[str, str]
    rm_names: tuple[str, str]
    threads: tuple[int, ...]
    duration: float
    rounds: int
    modes: tuple[str, ...]
    accounts: int
    table: str
    seed: int
    server_pid: int | None = None


@dataclass
class Run:
    """One mode at one thread count in one round."""

    threads: int
    round: int
    mode: str
    transfers: int
    seconds: float
    tps: float
    p50_ms: float
    p95_ms: float
    cpu_us_per_transfer: float
    """This process's CPU time (all threads) per transfer."""
    machine_cpu_us_per_transfer: float | None
    """The whole machine's busy CPU time per transfer (/proc/stat), when readable."""
    server_cpu_us_per_transfer: float | None = None
    """The state server's CPU time per transfer (``--server-pid``, /proc/PID/stat)."""


@dataclass
class Summary:
    """Medians (and ranges) over the rounds at one thread count."""

    threads: int
    rounds: int
    tps: dict[str, float]
    tps_range: dict[str, tuple[float, float]]
    p50_ms: dict[str, float]
    p95_ms: dict[str, float]
    cpu_us_per_transfer: dict[str, float]
    ratio: float | None
    """decree tps / independent tps (median of the rounds' ratios)."""
    ratio_range: tuple[float, float] | None
    ratio_native: float | None
    """decree tps / native-2pc tps (median of the rounds' ratios)."""
    library_cpu_us_per_transfer: float | None
    """decree minus native-2pc CPU per transfer (median of the rounds' differences)."""
    atomicity_cpu_us_per_transfer: float | None
    """decree minus independent CPU per transfer (median of the rounds' differences)."""
    server_cpu_us_per_transfer: float | None
    """The state server's CPU per decree transfer (median of the rounds; ``--server-pid``)."""
    runs: list[Run] = field(default_factory=list)


# --- the databases ----------------------------------------------------------------------


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - the message is the point
        raise SystemExit("decree.bench needs psycopg 3: pip install 'psycopg[binary]'") from e
    return psycopg


def _update_sql(table: str, side: int) -> str:
    return f"UPDATE {table} SET balance = balance {'-+'[side]} 1 WHERE id = %s"


def setup(spec: Spec) -> None:
    """Creates the table with its accounts in both databases (existing rows are kept)."""
    psycopg = _psycopg()
    for dsn in spec.dsns:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"CREATE TABLE IF NOT EXISTS {spec.table} (id int PRIMARY KEY, balance bigint NOT NULL)")
            c.execute(
                f"INSERT INTO {spec.table} SELECT g, %s FROM generate_series(1, %s) g ON CONFLICT (id) DO NOTHING",
                (BALANCE_START, spec.accounts),
            )


def balances(spec: Spec) -> tuple[int, int]:
    psycopg = _psycopg()
    out = []
    for dsn in spec.dsns:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute(f"SELECT COALESCE(SUM(balance), 0)::bigint FROM {spec.table}").fetchone()
            out.append(int(row[0]))
    return out[0], out[1]


def prepared(spec: Spec, like: str) -> list[str]:
    psycopg = _psycopg()
    found: list[str] = []
    for dsn in spec.dsns:
        with psycopg.connect(dsn, autocommit=True) as c:
            rows = c.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE %s", (like,)
            ).fetchall()
            found += [str(r[0]) for r in rows]
    return found


# --- the modes ----------------------------------------------------------------------------

Transfer = Callable[[int, int], None]
"""One transfer: debit account ``a`` in A, credit account ``b`` in B."""


def _one_row(cursor: Any, side: str, account: int) -> None:
    if cursor.rowcount != 1:
        raise BenchFailed(f"the {side} of account {account} changed {cursor.rowcount} rows, not 1")


def _make_transfer(mode: str, spec: Spec, conns: Sequence[Any], tm: TransactionManager | None, tag: str) -> Transfer:
    a, b = conns
    upd_a, upd_b = _update_sql(spec.table, 0), _update_sql(spec.table, 1)

    if mode == "independent":

        def independent(ida: int, idb: int) -> None:
            _one_row(a.execute(upd_a, (ida,), prepare=True), "debit", ida)
            a.commit()
            _one_row(b.execute(upd_b, (idb,), prepare=True), "credit", idb)
            b.commit()

        return independent

    if mode == "native-2pc":
        counter = iter(range(1, 2**62))

        def native(ida: int, idb: int) -> None:
            gid = f"{NATIVE_GID_PREFIX}{tag}-{next(counter)}"
            a.tpc_begin(gid + "-a")
            b.tpc_begin(gid + "-b")
            _one_row(a.execute(upd_a, (ida,), prepare=True), "debit", ida)
            _one_row(b.execute(upd_b, (idb,), prepare=True), "credit", idb)
            a.tpc_prepare()
            b.tpc_prepare()
            a.tpc_commit()
            b.tpc_commit()

        return native

    assert mode == "decree" and tm is not None
    rm_a, rm_b = spec.rm_names

    def two_phase(ida: int, idb: int) -> None:
        with tm.transaction() as tx:
            tx.enlist(a, rm_a)
            tx.enlist(b, rm_b)
            _one_row(a.execute(upd_a, (ida,), prepare=True), "debit", ida)
            _one_row(b.execute(upd_b, (idb,), prepare=True), "credit", idb)
        if tx.report is None or tx.report.kind != "two_phase":
            raise BenchFailed(f"a decree transfer did not commit in two phases: {tx.report}")

    return two_phase


def _machine_busy() -> float | None:
    """Busy CPU seconds of the whole machine since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system) of process ``pid`` (Linux /proc/PID/stat), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def run_one(spec: Spec, mode: str, threads: int, round_: int, tm: TransactionManager, node: int) -> Run:
    """Runs ``mode`` with ``threads`` threads for the spec's duration and checks the
    invariants after it."""
    psycopg = _psycopg()
    before = balances(spec)
    conns: list[list[Any]] = []
    try:
        for _ in range(threads):
            conns.append([psycopg.connect(dsn) for dsn in spec.dsns])
        latencies: list[list[float]] = [[] for _ in range(threads)]
        counts = [0] * threads
        errors: list[BaseException] = []
        stop = threading.Event()
        ready = threading.Barrier(threads + 1)
        deadline = [0.0]

        def worker(index: int) -> None:
            rng = random.Random(spec.seed * 1_000_003 + round_ * 1009 + index)
            transfer = _make_transfer(mode, spec, conns[index], tm, f"{os.getpid()}-{threads}-{round_}-{index}")
            mine = latencies[index]
            try:
                # One transfer before the clock starts: statements prepared, session pooled.
                transfer(rng.randint(1, spec.accounts), rng.randint(1, spec.accounts))
                counts[index] += 1
            except BaseException as e:
                errors.append(e)
                stop.set()
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                return
            try:
                while not stop.is_set():
                    ida, idb = rng.randint(1, spec.accounts), rng.randint(1, spec.accounts)
                    t0 = time.perf_counter()
                    transfer(ida, idb)
                    t1 = time.perf_counter()
                    counts[index] += 1
                    if t1 >= deadline[0]:
                        break
                    mine.append(t1 - t0)
            except BaseException as e:
                errors.append(e)
                stop.set()

        workers = [threading.Thread(target=worker, args=(i,), name=f"bench-{i}", daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        deadline[0] = float("inf")
        try:
            ready.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        cpu0, busy0, server0, t0 = time.process_time(), _machine_busy(), _process_cpu(spec.server_pid), time.perf_counter()
        deadline[0] = t0 + spec.duration
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
        cpu1, busy1, server1 = time.process_time(), _machine_busy(), _process_cpu(spec.server_pid)
        if errors:
            raise BenchFailed(f"{mode} at {threads} threads: a transfer failed: {errors[0]!r}") from errors[0]
    finally:
        for pair in conns:
            for c in pair:
                c.close()

    measured = [x for lat in latencies for x in lat]
    measured.sort()
    transfers_total = sum(counts)
    # The transfers inside the window: the timed ones plus each thread's last (past the deadline).
    timed = len(measured) + threads
    after = balances(spec)
    if sum(after) != sum(before):
        raise BenchFailed(f"{mode} at {threads} threads: the total changed from {sum(before)} to {sum(after)}")
    if after[1] - before[1] != transfers_total:
        raise BenchFailed(
            f"{mode} at {threads} threads: B gained {after[1] - before[1]} but {transfers_total} transfers were counted"
        )
    like = f"{GID_PREFIX}{DECREE_FORMAT_ID:08x}:{node:08x}%" if mode == "decree" else NATIVE_GID_PREFIX + "%"
    left = prepared(spec, like)
    if mode == "native-2pc":
        left = [g for g in left if f"-{os.getpid()}-" in g]
    if left:
        raise BenchFailed(f"{mode} at {threads} threads: branches left prepared: {left[:5]}")
    machine = None
    if busy0 is not None and busy1 is not None:
        machine = (busy1 - busy0) / timed * 1e6
    server = None
    if server0 is not None and server1 is not None:
        server = (server1 - server0) / timed * 1e6
    return Run(
        threads=threads,
        round=round_,
        mode=mode,
        transfers=timed,
        seconds=elapsed,
        tps=timed / elapsed,
        p50_ms=_percentile(measured, 0.50) * 1e3,
        p95_ms=_percentile(measured, 0.95) * 1e3,
        cpu_us_per_transfer=(cpu1 - cpu0) / timed * 1e6,
        machine_cpu_us_per_transfer=machine,
        server_cpu_us_per_transfer=server,
    )


def order(modes: Sequence[str], round_: int) -> list[str]:
    """The modes in round ``round_`` (from 1): each round starts one mode further."""
    n = len(modes)
    return [modes[(round_ - 1 + i) % n] for i in range(n)]


def summarise(threads: int, runs: list[Run]) -> Summary:
    by_mode: dict[str, list[Run]] = {}
    for r in runs:
        by_mode.setdefault(r.mode, []).append(r)

    def med(mode: str, key: str) -> float:
        return statistics.median(float(getattr(r, key)) for r in by_mode[mode])

    rounds = sorted({r.round for r in runs})

    def per_round(num: str, den: str, f: Callable[[Run, Run], float]) -> list[float]:
        out = []
        for rnd in rounds:
            x = [r for r in by_mode.get(num, []) if r.round == rnd]
            y = [r for r in by_mode.get(den, []) if r.round == rnd]
            if x and y:
                out.append(f(x[0], y[0]))
        return out

    ratios = per_round("decree", "independent", lambda x, y: x.tps / y.tps)
    native = per_round("decree", "native-2pc", lambda x, y: x.tps / y.tps)
    library = per_round("decree", "native-2pc", lambda x, y: x.cpu_us_per_transfer - y.cpu_us_per_transfer)
    atomicity = per_round("decree", "independent", lambda x, y: x.cpu_us_per_transfer - y.cpu_us_per_transfer)
    server = [r.server_cpu_us_per_transfer for r in by_mode.get("decree", []) if r.server_cpu_us_per_transfer is not None]
    return Summary(
        threads=threads,
        rounds=len(rounds),
        tps={m: med(m, "tps") for m in by_mode},
        tps_range={m: (min(r.tps for r in rs), max(r.tps for r in rs)) for m, rs in by_mode.items()},
        p50_ms={m: med(m, "p50_ms") for m in by_mode},
        p95_ms={m: med(m, "p95_ms") for m in by_mode},
        cpu_us_per_transfer={m: med(m, "cpu_us_per_transfer") for m in by_mode},
        ratio=statistics.median(ratios) if ratios else None,
        ratio_range=(min(ratios), max(ratios)) if ratios else None,
        ratio_native=statistics.median(native) if native else None,
        library_cpu_us_per_transfer=statistics.median(library) if library else None,
        atomicity_cpu_us_per_transfer=statistics.median(atomicity) if atomicity else None,
        server_cpu_us_per_transfer=statistics.median(server) if server else None,
        runs=runs,
    )


def run(spec: Spec, report: Callable[[Run], None] = lambda r: None) -> list[Summary]:
    setup(spec)
    tm = connect(spec.connect, client_name=f"decree.bench pid {os.getpid()}")
    try:
        probe = tm.transaction()
        origin = probe.xid.origin
        probe.rollback()
        node = origin.node if origin is not None else 0
        summaries = []
        for threads in spec.threads:
            runs = []
            for rnd in range(1, spec.rounds + 1):
                for mode in order(spec.modes, rnd):
                    r = run_one(spec, mode, threads, rnd, tm, node)
                    report(r)
                    runs.append(r)
            summaries.append(summarise(threads, runs))
        return summaries
    finally:
        tm.close()


# --- the command --------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(v < 1 or v > 1024 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts are 1 to 1024")
    return values


def _modes(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [m for m in values if m not in MODES]
    if bad or not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: modes are a list of distinct {', '.join(MODES)}")
    return values


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m decree.bench",
        description="The same transfer between two PostgreSQL databases as two independent commits, "
        "with psycopg's own two-phase API, and as a decree transaction: tps, p50/p95 latency, their ratio, "
        "and the CPU per transfer the library costs.",
    )
    ap.add_argument("--connect", required=True, help="the running decree serve: unix:/path, tcp:host:port (a pair: A,B)")
    ap.add_argument("--dsn", action="append", required=True, help="libpq connection string; give it twice (A, then B)")
    ap.add_argument("--rm-names", default="pg-a,pg-b", help="the server's [[rm]] names of A and B (default pg-a,pg-b)")
    ap.add_argument("--threads", type=_ints, default=(1, 16), help="thread counts, comma-separated (default 1,16)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per run (default 3)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the modes per thread count (default 1)")
    ap.add_argument("--modes", type=_modes, default=MODES, help=f"modes, comma-separated (default {','.join(MODES)})")
    ap.add_argument("--accounts", type=int, default=10_000, help="accounts per database (default 10000)")
    ap.add_argument("--table", default="decree_pybench_accounts", help="the accounts table (created when missing)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--server-pid", type=int, help="the state server's process id: its CPU per transfer is reported too (Linux)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    return ap


def spec_of(args: argparse.Namespace, ap: argparse.ArgumentParser) -> Spec:
    if len(args.dsn) != 2:
        ap.error("give --dsn twice: database A, then database B")
    names = tuple(x.strip() for x in args.rm_names.split(","))
    if len(names) != 2 or not all(names):
        ap.error("--rm-names needs two names: A,B")
    if not args.table.replace("_", "").isalnum() or len(args.table) > 63:
        ap.error("--table: letters, digits and _ only, at most 63")
    if args.duration <= 0 or not 1 <= args.rounds <= 100 or args.accounts < 2:
        ap.error("--duration must be positive, --rounds 1 to 100, --accounts at least 2")
    return Spec(
        connect=args.connect,
        dsns=(args.dsn[0], args.dsn[1]),
        rm_names=(names[0], names[1]),
        threads=args.threads,
        duration=args.duration,
        rounds=args.rounds,
        modes=args.modes,
        accounts=args.accounts,
        table=args.table,
        seed=args.seed,
        server_pid=args.server_pid,
    )


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    spec = spec_of(args, ap)
    header = (
        f"decree.bench: {spec.modes} over 2 PostgreSQL databases, server {spec.connect}, "
        f"{spec.accounts} accounts, {spec.duration:g} s per run, {spec.rounds} round(s); "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )

    def line(r: Run) -> None:
        print(
            f"{r.threads:>7} {r.round:>5} {r.mode:<12} {r.transfers:>9} {r.tps:>9.1f} {r.p50_ms:>8.2f} "
            f"{r.p95_ms:>8.2f} {r.cpu_us_per_transfer:>9.0f} {_fmt(r.server_cpu_us_per_transfer, 0):>9} "
            f"{_fmt(r.machine_cpu_us_per_transfer, 0):>9}",
            flush=True,
        )

    if not args.json:
        print(header)
        print(f"{'threads':>7} {'round':>5} {'mode':<12} {'transfers':>9} {'tps':>9} {'p50 ms':>8} {'p95 ms':>8} "
              f"{'cpu us/tr':>9} {'server us':>9} {'host us':>9}")
    try:
        summaries = run(spec, report=(lambda r: None) if args.json else line)
    except (BenchFailed, DecreeError) as e:
        print(f"decree.bench: {e}", file=sys.stderr)
        return 1
    if args.json:
        doc = {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "connect": spec.connect,
            "modes": list(spec.modes),
            "duration_s": spec.duration,
            "rounds": spec.rounds,
            "accounts": spec.accounts,
            "summaries": [asdict(s) for s in summaries],
        }
        print(json.dumps(doc, indent=1))
        return 0
    for s in summaries:
        print(f"threads {s.threads}, median of {s.rounds} round(s):")
        for m in spec.modes:
            lo, hi = s.tps_range[m]
            print(
                f"  {m:<12} {s.tps[m]:>9.1f} tps ({lo:.1f}-{hi:.1f})  p50 {s.p50_ms[m]:.2f} ms  "
                f"p95 {s.p95_ms[m]:.2f} ms  cpu {s.cpu_us_per_transfer[m]:.0f} us/transfer"
            )
        if s.ratio is not None and s.ratio_range is not None:
            print(f"  decree / independent tps: {s.ratio:.3f} ({s.ratio_range[0]:.3f}-{s.ratio_range[1]:.3f})")
        if s.ratio_native is not None:
            print(f"  decree / native-2pc tps:  {s.ratio_native:.3f}")
        if s.library_cpu_us_per_transfer is not None:
            print(f"  CPU per transfer of the library (decree - native-2pc): {s.library_cpu_us_per_transfer:.0f} us")
        if s.atomicity_cpu_us_per_transfer is not None:
            print(f"  CPU per transfer of atomicity (decree - independent):  {s.atomicity_cpu_us_per_transfer:.0f} us")
        if s.server_cpu_us_per_transfer is not None:
            print(f"  CPU per transfer of the state server (decree mode):    {s.server_cpu_us_per_transfer:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
