"""Fault suite: rerun the reliability figures against a real served instance.

    .venv/bin/python scripts/fault_suite.py [--only worker_kills,database_kill] \\
        [--set worker_kills.outputs=600] [--keep]

Starts ``manage.py serve`` on a free loopback port with its own ``MEMORY_DATA_DIR``
(a fresh embedded PostgreSQL in a temporary directory: never the developer's or the
test run's database), runs each section of ``scripts/faults/sections.py`` in order
(worker kills during Memory Base ingestion, a kill -9 of the worker's main process,
the database killed and stopped under load, hostile input, schemathesis, a cross-tenant
sweep, SIGTERM to serve) and prints the figures.
The watchdog runs with ``WORKER_STALL_SECONDS=10`` (default 60) to keep the run to a
few minutes.
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.faults.harness import Instance  # noqa: E402
from scripts.faults.sections import SECTIONS  # noqa: E402

SUITE_ENV = {"WORKER_STALL_SECONDS": "10", "Q_WORKERS": "2", "LOG_LEVEL": "INFO"}


def _overrides(pairs: list[str]) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        section, name = key.split(".", 1)
        try:
            parsed: object = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        found.setdefault(section, {})[name] = parsed
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated section names")
    parser.add_argument("--set", action="append", default=[], help="section.param=value")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SECTIONS)
    unknown = set(names) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {list(SECTIONS)}")
    overrides = _overrides(args.set)
    inst = Instance(env_overrides=SUITE_ENV)
    print(f"# fault suite on {platform.node()} ({platform.machine()}), data dir {inst.data_dir}")
    print(f"# instance env: {json.dumps(SUITE_ENV)}")
    started = time.monotonic()
    failed = False
    try:
        for name in names:
            if inst.proc is None:
                inst.start()
            function, params = SECTIONS[name]
            params = {**params, **overrides.get(name, {})}
            section_started = time.monotonic()
            try:
                figures = function(inst, **params)
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                failed = True
                where = traceback.extract_tb(exc.__traceback__)[-1]
                figures = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "at": f"{where.filename}:{where.lineno} {where.line}",
                }
            took = time.monotonic() - section_started
            print(f"\n## {name} ({took:.0f}s){' ' + json.dumps(params) if params else ''}")
            for key, value in figures.items():
                print(f"  {key}: {json.dumps(value) if not isinstance(value, str) else value}")
    finally:
        if args.keep:
            inst.stop()
            print(f"\n# kept {inst.data_dir} (its database is still running)")
        else:
            inst.destroy()
    print(f"\n# total {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
