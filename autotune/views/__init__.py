"""What people and scripts see: progress, show, report, export.

What a study's trials mean (`_insight`) and the report's figures (`_charts`) serve
`report`. A public name imports its module on first use: `show` and `export` import
neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.views.doctor import print_report
    from autotune.views.estimate_table import estimate_json, print_estimate
    from autotune.views.export import (
        export_selected,
        parity_summary,
        previous_export,
        script_changes,
        written_script_changes,
    )
    from autotune.views.progress import Progress
    from autotune.views.report import write_report
    from autotune.views.show import StudyView, print_view, trial_rows
    from autotune.views.summary import change_lines, finish_lines, outcome_json, versus_line

__all__ = [
    "Progress",
    "StudyView",
    "change_lines",
    "estimate_json",
    "export_selected",
    "finish_lines",
    "outcome_json",
    "parity_summary",
    "previous_export",
    "print_estimate",
    "print_report",
    "print_view",
    "script_changes",
    "trial_rows",
    "versus_line",
    "write_report",
    "written_script_changes",
]

# each public name, and the module that holds it
_OWNERS = {
    "print_report": "autotune.views.doctor",
    "estimate_json": "autotune.views.estimate_table",
    "print_estimate": "autotune.views.estimate_table",
    "export_selected": "autotune.views.export",
    "parity_summary": "autotune.views.export",
    "previous_export": "autotune.views.export",
    "script_changes": "autotune.views.export",
    "written_script_changes": "autotune.views.export",
    "Progress": "autotune.views.progress",
    "write_report": "autotune.views.report",
    "StudyView": "autotune.views.show",
    "print_view": "autotune.views.show",
    "trial_rows": "autotune.views.show",
    "change_lines": "autotune.views.summary",
    "finish_lines": "autotune.views.summary",
    "outcome_json": "autotune.views.summary",
    "versus_line": "autotune.views.summary",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
