"""Print the package's build requirements ([build-system] requires in pyproject.toml), one per
line, for the scripts that install them before a build without isolation (scripts/test.sh,
scripts/test_vllm.sh).  pyproject.toml stays their one source."""
import ast
import os
import re
import sys

path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
try:
    import tomllib  # Python >= 3.11
    with open(path, "rb") as f:
        reqs = tomllib.load(f)["build-system"]["requires"]
except ImportError:  # Python 3.10: the one line this file writes the list on
    with open(path) as f:
        reqs = ast.literal_eval(re.search(r"^requires\s*=\s*(\[.*\])", f.read(), re.M).group(1))
sys.stdout.write("\n".join(reqs) + "\n")
