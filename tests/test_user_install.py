"""The README's user install, as a new user runs it: its pip line into a fresh virtual environment (no development
tools, no editable install), then the import and the CLI from that environment on a tiny program."""

from __future__ import annotations

import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

from tests.helpers.programs import TinyProgram

REPOSITORY = Path(__file__).resolve().parents[1]


def _install_block() -> list[str]:
    """The command lines of the README's first bash block under "## Install"."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Install\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the README's Install section has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.skipif(os.environ.get("PAWFN_SKIP_USER_INSTALL") == "1", reason="PAWFN_SKIP_USER_INSTALL=1")
def test_the_readmes_user_install_runs_the_cli_in_a_fresh_environment(qwen3_program: TinyProgram, tmp_path: Path) -> None:
    pip_line, run_line = _install_block()
    assert pip_line.startswith("pip install ") and run_line.startswith("pawfn run ")
    environment = tmp_path / "user-venv"
    venv.create(environment, with_pip=True)
    bin_dir = environment / "bin"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", VIRTUAL_ENV=str(environment), PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    installed = subprocess.run(["bash", "-c", pip_line], cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    python = str(bin_dir / "python")
    where = subprocess.run([python, "-c", "import pawfn, fastapi, PIL; print(pawfn.__file__)"], env=env, capture_output=True, text=True, check=False)
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(environment), where.stdout  # the fresh install, not this checkout
    assert subprocess.run([python, "-c", "import pytest"], env=env, capture_output=True, check=False).returncode != 0  # no dev tools
    # the README's run line on the tiny program (its slug needs the hub: a local bundle and base instead)
    run = run_line.replace("--program email-triage", f"--program {qwen3_program.folder} --base {qwen3_program.interpreter.gguf_path}")
    result = subprocess.run(["bash", "-c", f"{run} --max-tokens 4 --json"], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stdout.count('"tokens"') == 1, result.stdout
