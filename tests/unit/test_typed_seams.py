"""The seams between packages are typed: the loaded model, the evaluator, the executor and
the recovery hook are never ``Any`` or ``object`` (parameters and fields alike, found with
ast), and the Verifier measures through the one ``Evaluator`` protocol, never by asking which
evaluator it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEAMS = {"loaded", "loaded_model", "evaluator", "executor", "recovery", "recovered", "runner"}


def _untyped_seams() -> list[str]:
    hits = []
    for path in [*(ROOT / "autoplan").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                items = [(x.arg, x.annotation) for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                items = [(node.target.id, node.annotation)]
            else:
                continue
            for name, annotation in items:
                words = set(re.findall(r"\w+", ast.unparse(annotation))) if annotation else set()
                # a seam by its name or its last word (long_evaluator)
                if (name in SEAMS or name.rsplit("_", 1)[-1] in SEAMS) \
                        and words & {"Any", "object"}:
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}: "
                                f"{ast.unparse(annotation)}")
    return hits


def test_no_seam_is_typed_any() -> None:
    hits = _untyped_seams()
    assert not hits, "type these seams:\n" + "\n".join(hits)


def test_the_verifier_does_not_branch_on_its_evaluator_type() -> None:
    source = (ROOT / "autoplan" / "search" / "verify" / "_verifier.py").read_text()
    assert "isinstance(self.evaluator" not in source
    assert "StreamedEvaluator" not in source and "QualityEvaluator" not in source
