"""The measured seconds of each test, which put the slowest in the `slow` tier (tests/conftest.py).

    python -m pytest --junitxml=/tmp/junit.xml            # the whole suite, as CI runs it
    python -m pytest -m "not slow" --junitxml=/tmp/fast.xml   # the fast tier (module fixtures paid there)
    python tests/support/durations.py /tmp/junit.xml /tmp/fast.xml   # rewrite tests/support/durations.json

A test measured above `SLOW_SECONDS` is marked slow, so `pytest -m "not slow"` (the edit-test loop) leaves it
out; a test not measured yet counts as fast until the file is rewritten.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
SLOW_SECONDS = 3.0


def measured() -> dict[str, float]:
    """Test node id -> seconds, from the last recorded run (empty where none is recorded)."""
    return json.loads(FILE.read_text()) if FILE.exists() else {}


def main(*junits: str) -> None:
    """Each test's longest time over the runs given: a module fixture's setup counts where a test pays it (in
    the fast tier, the first fast test of its module; in the whole suite, maybe a slow one). A test the runs
    skipped (the real pair's, without its folder) keeps the seconds recorded before."""
    seconds: dict[str, float] = {}
    for junit in junits:
        for case in ET.parse(junit).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            path = case.get("classname", "").replace(".", "/") + ".py"
            name = f"{path}::{case.get('name')}"
            seconds[name] = max(seconds.get(name, 0.0), round(float(case.get("time", 0)), 1))
    seconds = {**measured(), **seconds}
    FILE.write_text(json.dumps(dict(sorted(seconds.items())), indent=0) + "\n")
    print(f"{len(seconds)} tests, {sum(t > SLOW_SECONDS for t in seconds.values())} above {SLOW_SECONDS} s")


if __name__ == "__main__":
    main(*sys.argv[1:])
