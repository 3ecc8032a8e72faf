"""lm-eval resolves ``!function tasks.x`` next to the YAML: re-export ../tasks.py for the MMLU files."""
import importlib.util as _ilu
import os as _os

_spec = _ilu.spec_from_file_location("_unweight_evals_tasks", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)),
                                                                           _os.pardir, "tasks.py"))
_mod = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
load = _mod.load
