"""requirements.txt and environment.yml must pin the same versions."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_environment_yml_agrees_with_requirements():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _pins(pip_section) == req
    assert req["torch"] == "2.14.1" and req["torchvision"] == "0.29.1"


def test_readme_opens_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    commands = [l.split("#")[0].strip() for l in first_block.splitlines()[1:] if l.strip()]
    assert commands[:2] == ["make demo", "make test"]
