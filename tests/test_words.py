"""How the plan and explain spell a replica's GPUs, from one public function (render used to import explain's
private `_span`)."""

from __future__ import annotations

import ast
from pathlib import Path

import reconciler
from reconciler.plan import JobChange
from reconciler.render import where
from reconciler.words import gpu_span


def test_gpu_indices_read_as_a_range_when_consecutive_else_listed():
    assert gpu_span((3, 0, 2, 1)) == "0-3"
    assert gpu_span((5, 0, 2)) == "0,2,5"
    assert gpu_span((4,)) == "4"
    assert gpu_span((6, 7)) == "6-7"


def test_the_plan_names_each_replicas_gpus_on_its_instance():
    j = JobChange("train", "t1", "place", ("i-1", "+2", "i-3"), (), gpus=((0, 1, 2, 3), (4, 6), ()))
    assert where(j) == "i-1[0-3], +2[4,6], i-3"


def test_render_imports_no_private_name_of_another_module():
    tree = ast.parse((Path(reconciler.__file__).parent / "render.py").read_text())
    private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("reconciler")
               for a in n.names if a.name.startswith("_")]
    assert private == []
