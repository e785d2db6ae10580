"""A py-spy profile in brief: the share of samples per thread, and the functions most often
on top of the stack or anywhere in it.

    python -m benchmarks.profile_summary PROFILE.txt [--top 25]

``PROFILE.txt`` is py-spy's raw (collapsed) output, one ``thread;frame;frame... count`` line
per stack, as ``steady_bench --py-spy`` writes it.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

_FRAME = re.compile(r"^(?P<fn>[^ ]+) \((?P<file>[^:]+)(?::\d+)?\)$")


def _name(frame: str) -> str:
    found = _FRAME.match(frame)
    return f"{found['fn']} ({found['file'].rsplit('/', 1)[-1]})" if found else frame


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    threads: Counter[str] = Counter()
    top: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in open(args.profile):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[1] if len(frames) > 1 and not frames[1].startswith("Thread.") else frames[0]
        threads[re.sub(r" \(\d+\)", "", frames[0]) + (f" {thread}" if thread != frames[0] else "")] += n
        named = [_name(f) for f in frames[1:]]
        if named:
            top[named[-1]] += n
        for f in set(named):
            inclusive[f] += n
        total += n
    print(f"{total} samples")
    print("\nby thread:")
    for t, n in threads.most_common():
        print(f"  {100 * n / total:5.1f}%  {t}")
    print("\non top of the stack:")
    for f, n in top.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {f}")
    print("\nanywhere in the stack:")
    for f, n in inclusive.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
