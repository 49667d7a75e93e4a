"""A non-editable install must carry the shipped configs and recipes (found by bare name) and the report's page."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_configs_and_recipes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("bertrain-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"bertrain/configs/{p.name}" for p in (ROOT / "bertrain" / "configs").glob("*.yaml")}
    shipped |= {f"bertrain/data_recipes/{p.name}" for p in (ROOT / "bertrain" / "data_recipes").glob("*.yaml")}
    assert "bertrain/configs/albert_base.yaml" in shipped
    shipped |= {f"bertrain/train/report_assets/{p.name}" for p in (ROOT / "bertrain/train/report_assets").iterdir()}
    assert shipped <= names, f"missing from the wheel: {sorted(shipped - names)}"
    # Every module too: a new sub-package without __init__.py would be left out by packages.find.
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bertrain").rglob("*.py") if "__pycache__" not in p.parts}
    assert "bertrain/config/schema.py" in sources
    assert sources <= names, f"modules missing from the wheel: {sorted(sources - names)}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bertrain = bertrain.cli:entry" in zipfile.ZipFile(wheel).read(entry_points).decode()
