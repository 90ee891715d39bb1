#!/usr/bin/env bash
# Set up (if needed), then the checks CI runs, in order: lint, format, types, the test suite on the CPU.
# Arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`); TEST_WORKERS sets the pytest-xdist workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# one pytest worker per core, 2 at most (TEST_WORKERS=1: in this process); worksteal: the long docs pages do not
# queue behind each other. Counted before OMP_NUM_THREADS is set: GNU nproc reports that variable when set.
workers=${TEST_WORKERS:-$(n=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 1); echo $(( n < 2 ? 1 : 2 )))}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the suite starts about 150 Python processes: with bytecode caching off, each compiles depthlens (and pytest
# rewrites every test module in each worker) again
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check depthlens tests bench scripts
.venv/bin/ruff format --check depthlens tests bench scripts
.venv/bin/mypy  # the package, configured in pyproject.toml ([tool.mypy])
if [ "$workers" -gt 1 ]; then
  exec .venv/bin/python -m pytest -n "$workers" --dist worksteal "$@"
fi
exec .venv/bin/python -m pytest "$@"
