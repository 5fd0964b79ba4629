"""Where a cell runs: in the pytest worker (``local``) or as a cluster job (``slurm``).

One module per executor, in the way pytest-xdist keeps one module per scheduling
strategy. Every executor takes a :class:`~pytest_automedbench.runner.CellPlan` and gives
back the cell's :class:`~pytest_automedbench.results.CellResult`; the pytest worker
records it in the ledger and reports it, whichever executor ran it.
"""

from __future__ import annotations

from pathlib import Path

from pytest_automedbench.results import CellResult
from pytest_automedbench.runner import CellPlan, run_cell


def execute_cell(plan: CellPlan, jobs_log: Path) -> CellResult:
    """Run the cell with the configured executor. ``jobs_log`` lists the cluster jobs a
    session submitted, so that a cancelled session can cancel them."""
    if plan.config.executor == "slurm":
        from pytest_automedbench.executors.slurm import run_cell_on_slurm

        return run_cell_on_slurm(plan, plan.config.slurm, jobs_log)
    return run_cell(plan)
