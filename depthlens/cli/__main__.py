"""`python -m depthlens.cli ...` (e.g. under `torchrun -m`)."""

from .app import app

app(prog_name="depthlens")
