"""`tracediff confirm`: each source of the difference checked by a run on this machine
(`confirm.py`), with the settings a re-run can set (`settings.py`), the runs themselves
(`runs.py`) and what each run is judged by (`measure.py`)."""

from .confirm import confirm

__all__ = ["confirm"]
