"""`python -m producer report --run NAME [--out DIR] [--output URL]`: a run's pictures and summary as HTML.

The figures come from the committed objects the manifest lists; Redis is asked only where the
output is (the run's pinned settings) and for the dead letters by reason.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from producer.deferred import Deferred

DEFAULT_REPORTS_DIR = Path("reports")


def register(commands: Any) -> None:
    """Add the `report` command to `python -m producer`."""
    report = commands.add_parser(
        "report",
        help="pictures and a summary of a run's committed output (HTML page and PNGs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("--run", required=True, help="the run's name")
    report.add_argument(
        "--out", type=Path, help=f"folder for report.html and the PNGs (default {DEFAULT_REPORTS_DIR}/RUN)"
    )
    report.add_argument(
        "--output",
        dest="output",
        help="read the committed output here (a folder, file:// or s3://) instead of the run's pinned "
        "output; Redis is then optional (without it the dead letters are unknown)",
    )
    # The name this option had before every command called it --output: kept so old scripts still work.
    report.add_argument("--store", dest="output", help=argparse.SUPPRESS)
    report.set_defaults(handler=Deferred("producer.report.command", "cmd_report"))
