"""A MIG demand's work units and instance share come from the catalog whenever they are asked, not only after
the first build_problem: they used to be read from a module-level dict that build_problem filled, so a fresh
process (a status read, a test, a tool) that asked before planning got every profile counted as 1 slice."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from reconciler.load import load
from reconciler.problem import build_problem
from tests.fleetkit import catalog_observed

ROOT = Path(__file__).resolve().parent.parent

# In a fresh interpreter: size and share first, then a build_problem, then both again.
_PROBE = """
import json, pickle, sys
d, c, desired, observed = pickle.load(open(sys.argv[1], "rb"))
from reconciler.problem import build_problem, share
before = [d.size, share(d, c)]
build_problem(desired, observed)
print(json.dumps({"before": before, "after": [d.size, share(d, c)]}))
"""


def test_mig_size_and_share_are_right_before_any_problem_is_built(tmp_path):
    desired = load(ROOT / "examples" / "ml-platform")
    observed = catalog_observed(desired)
    problem = build_problem(desired, observed)
    d = next(x for x in problem.demands if x.mig is not None)
    c = next(x for x in problem.capacities if x.mig and x.gpu_type == d.gpu_type)
    # 2 devices of 3g.40gb (3 of an A100-80GB's 7 compute slices each) on an instance partitioned into them.
    d3, c3 = replace(d, mig=("3g.40gb", 2)), replace(c, mig=("3g.40gb", "3g.40gb"))
    blob = tmp_path / "probe.pkl"
    blob.write_bytes(pickle.dumps((d3, c3, desired, observed)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(blob)], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    got = json.loads(out.stdout)
    expected = [6, 6 / (7 * c3.gpus)]
    assert got["after"] == expected
    assert got["before"] == expected
