"""How long a committed record waits for the mark that takes it, from the main loop's pause
rule alone: a simulation on a virtual clock, so the machine's load does not enter it.

    python -m benchmarks.mark_cadence                    # the table for the docs
    python -m benchmarks.mark_cadence --mark-ms 3 --periods 5,10

A writer commits every ``period`` ms (``--poisson``: at random, the same mean). The main loop
runs :class:`~pyharvest.core.engine.idle.IdleBackoff` as the engine does: a mark takes
``--mark-ms`` and sees the rows committed before it began; one that returns rows is followed
at once by the next, one that returns none waits the pause. Each record's wait is from its
commit to the start of the mark that takes it; on a real machine add the mark itself, the
dispatch, and whatever the scheduler adds. ``ramp 0`` is the rule before the ramp (every
empty mark in the grace period pauses ``markBackoff``), ``ramp 2`` the rule now (a quarter,
half, then ``markBackoff``).
"""

from __future__ import annotations

import argparse
import bisect
import random

from pyharvest.core.engine.idle import IdleBackoff


def simulate(period: float, mark: float, backoff: float, ramp: int, seconds: float, poisson: bool,
             seed: int = 1) -> tuple[list[float], float]:
    """Waits (s) of every record, and marks per second. Evenly spaced commits come a little
    late at random (up to a fifth of the period, as a writer's do) and marks take 0.5 to 1.5
    times ``mark``: without that jitter the two clocks lock in phase and any rule looks
    either perfect or terrible."""
    rnd = random.Random(seed)
    commits: list[float] = []
    t = 0.0
    while t < seconds:
        t += rnd.expovariate(1 / period) if poisson else period
        commits.append(t if poisson else t + rnd.uniform(0, period / 5))
    now = [rnd.uniform(0, period)]
    idle = IdleBackoff(backoff, 1.0, clock=lambda: now[0], ramp_steps=ramp)
    taken = 0
    waits: list[float] = []
    marks = 0
    while taken < len(commits) and now[0] < seconds + 2:
        start = now[0]
        seen = bisect.bisect_left(commits, start)  # committed before the mark began
        marks += 1
        now[0] = start + mark * rnd.uniform(0.5, 1.5)
        if seen > taken:
            waits.extend(start - c for c in commits[taken:seen])
            taken = seen
            idle.found_rows()
        else:
            idle.found_nothing()
            now[0] += max(0.0, idle.due_in())
    return waits, marks / seconds


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--periods", default="1,5,10,20,50", help="ms between a writer's commits")
    p.add_argument("--mark-ms", type=float, default=2.0, help="how long a mark takes")
    p.add_argument("--mark-backoff-ms", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--poisson", action="store_true", help="commits at random times (same mean)")
    args = p.parse_args(argv)
    print(f"mark {args.mark_ms} ms, markBackoff {args.mark_backoff_ms} ms, "
          f"{'Poisson' if args.poisson else 'evenly spaced'} commits; "
          "wait = commit → the start of the mark that takes it")
    print(f"{'period ms':>9} {'ramp':>4} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'marks/s':>8}")
    for period in (float(x) for x in args.periods.split(",")):
        for ramp in (0, 2):
            waits, rate = simulate(period / 1000, args.mark_ms / 1000, args.mark_backoff_ms / 1000, ramp,
                                   args.seconds, args.poisson)
            print(f"{period:>9g} {ramp:>4} {1000 * pct(waits, 0.5):>7.1f} {1000 * pct(waits, 0.99):>7.1f} "
                  f"{1000 * max(waits):>7.1f} {rate:>8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
