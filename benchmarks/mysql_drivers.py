"""MariaDB/MySQL drivers side by side: the harvester's drain and the stasher, on each driver in turn.

    python -m benchmarks.mysql_drivers --bootstrap 127.0.0.1:19092 \
        --database mysql://root@127.0.0.1:3306/bench --rounds 2

Each round runs every driver once (``pymysql, mysqldb, mariadbconnector, pymysql, ...``), so
the shared machine's drift hits them alike; every run is a fresh child process (the drain is
``harvest_bench``'s ``drain-100k`` scenario, the stasher ``stasher_bench``'s ``stash`` and
``stash_many`` ways). The figures are CPU per record of the harvester's (or the writer's)
process, which counts what the process spent and not what it waited for, and records/s beside
it; the summary gives each driver's medians and their ratio to the first driver's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

DRIVERS = ("pymysql", "mysqldb", "mariadbconnector")
HERE = Path(__file__).resolve().parent


def with_driver(url: str, driver: str) -> str:
    return sa.make_url(url).set(drivername=f"{sa.make_url(url).get_backend_name()}+{driver}").render_as_string(
        hide_password=False
    )


def drain(url: str, bootstrap: str, scenario: str) -> dict[str, Any]:
    from benchmarks.children import python_module

    cmd = [*python_module("benchmarks.harvest_bench"), "--child", "--scenario", scenario, "--database", url,
           "--bootstrap", bootstrap, "--delivery", "at-least-once"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, check=False,
                          env={**__import__("os").environ, "PYTHONPATH": str(HERE)})
    if proc.returncode != 0:
        raise SystemExit(f"drain on {url} failed:\n{proc.stderr[-4000:]}")
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"rate": r["records_per_second"], "cpu_us": r["notes"]["cpu_us_per_record"]["harvester"],
            "stmt_per_1k": r["statements_per_1000"], "ok": not (r["lost"] or r["reordered"])}


def stash(url: str, records: int) -> dict[str, Any]:
    from benchmarks import stasher_bench

    args = argparse.Namespace(database=url, records=records, value="bytes", registry="")
    return stasher_bench.child(sys.executable, "driver", ["stash", "stash_many"], args)["ways"]  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", default="mysql://root@127.0.0.1:3306/test", help="the driver part is replaced")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--drivers", default=",".join(DRIVERS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scenario", default="drain-100k", help="harvest_bench's drain scenario")
    p.add_argument("--records", type=int, default=5_000, help="records per stasher way")
    p.add_argument("--skip", default="", help="drain or stasher: leave that part out")
    args = p.parse_args(argv)
    drivers = args.drivers.split(",")
    runs: dict[str, list[dict[str, float]]] = {d: [] for d in drivers}
    for round_ in range(1, args.rounds + 1):
        for driver in drivers:
            url = with_driver(args.database, driver)
            figures: dict[str, float] = {}
            if "drain" not in args.skip:
                d = drain(url, args.bootstrap, args.scenario)
                if not d["ok"]:
                    raise SystemExit(f"drain on {driver} lost or reordered records")
                figures |= {"drain cpu µs": d["cpu_us"], "drain rec/s": d["rate"], "drain stmt/1k": d["stmt_per_1k"]}
            if "stasher" not in args.skip:
                for way, w in stash(url, args.records).items():
                    figures |= {f"{way} cpu µs": w["cpu_us"], f"{way} rec/s": w["rate"]}
            runs[driver].append(figures)
            print(f"round {round_} {driver:>16}: " + "  ".join(f"{k} {v:,.1f}" for k, v in figures.items()), flush=True)
    first = drivers[0]
    # Round by round: the machine's drift between rounds is larger than the drivers' difference.
    print(f"\nratio to {first}'s, round by round:")
    for driver in drivers[1:]:
        for k in runs[first][0]:
            each = " ".join(f"{r[k] / b[k]:.2f}" for r, b in zip(runs[driver], runs[first], strict=True))
            print(f"  {driver:>16} {k:<18} {each}")
    print(f"\nmedians, and ratio to {first}'s:")
    for driver in drivers:
        med = {k: statistics.median(r[k] for r in runs[driver]) for k in runs[driver][0]}
        base = {k: statistics.median(r[k] for r in runs[first]) for k in runs[first][0]}
        print(f"  {driver:>16}: " + "  ".join(f"{k} {v:,.1f} ({v / base[k]:.2f}x)" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
