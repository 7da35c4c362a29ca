"""Run the fault-injection suite and print the table for docs/reliability.md.

    python -m rpcbus.benchmarks.reliability        # about a minute; prints Markdown

Each scenario runs a steady load (2 nodes, providers and callers on both, 200 calls
in flight, 3 s deadlines) through one fault; see tests/faults/harness.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

COLUMNS = ("scenario", "calls", "outcomes", "worst lateness past deadline",
           "recovery (bound)", "ran twice / in flight at crash")


def main() -> int:
    out = tempfile.mkdtemp(prefix="rpcbus-faults-")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/faults", "-p",
                          "no:cacheprovider"], env={**os.environ, "FAULTS_REPORT_DIR": out})
    rows = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            r = json.load(f)
        outcomes = ", ".join(f"{code} {n}" for code, n in sorted(r["outcomes"].items()))
        twice = (f"{r['ran_twice']} / {r['in_flight_at_crash']}" if r["in_flight_at_crash"]
                 else "0 (no crash)")
        rows.append((r["scenario"], str(r["calls"]), outcomes, f"{r['worst_late_s']:.2f} s",
                     f"{r['recovery_s']:.2f} s ({r['recovery_bound_s']:.1f} s)", twice))
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
