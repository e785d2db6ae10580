"""Add up the JUnit reports of the tox environments and print one closing line.

Exits non-zero if no test ran at all: a green run that executed nothing proves nothing.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(folder: str) -> int:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for report in sorted(Path(folder).glob("*.xml")):
        root = ET.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        env = {k: 0 for k in totals}
        for suite in suites:
            for k in totals:
                env[k] += int(suite.get(k, 0))
        for k in totals:
            totals[k] += env[k]
        ran = env["tests"] - env["skipped"]
        print(f"{report.stem}: {ran} ran, {env['skipped']} skipped, {env['failures'] + env['errors']} failed")
    failed = totals["failures"] + totals["errors"]
    passed = totals["tests"] - totals["skipped"] - failed
    print(f"total: {passed} passed, {failed} failed, {totals['skipped']} skipped")
    # The closing line in pytest's own format, so a reader (or a log scraper) sees the
    # whole matrix's result last, not the last environment's.
    print(f"{'=' * 20} {passed} passed, {failed} failed, {totals['skipped']} skipped (all tox environments) {'=' * 20}")
    if passed + failed == 0:
        print("no test ran", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else ".tox/junit"))
