"""The README's Python example is a test (lucidrains style)."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_python_example_runs(tmp_path, monkeypatch):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("/tmp/keel_l4", str(tmp_path / "keel_l4"))
    exec(compile(code, "README.md", "exec"), {})


def test_readme_starts_with_the_two_commands():
    lines = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    cmds = [l for l in lines[:6] if l.startswith("bash scripts/")]
    assert [c.split()[1] for c in cmds] == ["scripts/zoo-report.sh", "scripts/test.sh"]
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def test_save_and_load_survive_nnsight_import(tmp_path):
    """nnsight mounts `.save` on every object; depthlens.save must still be ours."""
    import nnsight  # noqa: F401

    import depthlens
    from depthlens.models import ModelConfig, build_model

    p = depthlens.save(build_model(ModelConfig.debug("preln")), tmp_path / "m")
    assert depthlens.load(p).config.arch == "preln"
