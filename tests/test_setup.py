"""The set-up a fresh machine runs: `make test` and `make demo` must know how to build the venv they need."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["test", "demo", "venv"])
def test_targets_install_a_missing_venv(target, tmp_path):
    """A dry run (`make -n`) against a venv that does not exist yet lists its whole installation."""
    venv, vllm_venv = tmp_path / "venv", tmp_path / "venv-vllm"
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}", f"VLLM_VENV={vllm_venv}"],
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    for step in (f"-m venv {venv}", "-r requirements/ci.txt", "--no-deps -r requirements/nodeps.txt",
                 "--no-build-isolation -r requirements/deepspeed.txt", f"touch {venv}/.installed"):
        assert step in dry.stdout, step


def test_only_the_study_and_the_tasks_import_the_study_extra():
    """pyproject's `study` extra holds what only ppo_rlhf/study and ppo_rlhf/tasks import: the library, `train`,
    `export` and `check` run without it (cli.STUDY_MODULES names them; the CLI says so in one line when one is
    missing)."""
    import ast

    from ppo_rlhf.cli import STUDY_MODULES

    found = []
    for path in (ROOT / "ppo_rlhf").rglob("*.py"):
        if path.parent.name in ("study", "tasks"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] in STUDY_MODULES]
    assert not found, found
