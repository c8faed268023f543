"""The installed package: one import name (`edje`), the `edje` command and its subcommands, and the scripts that
`ray job submit` runs still working from a checkout."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edje.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
JOBS = ("encode", "compress", "pretrain", "finetune", "distill", "evaluate", "serve", "quickstart", "sampleworld")


def test_edje_help_lists_every_job(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for job in JOBS:
        assert job in COMMANDS and f"    {job}" in out


def test_a_subcommand_runs_its_job_with_its_own_options(tmp_path, capsys):
    assert main(["sampleworld", "generate", "--seed", "3", "--n-train", "0", "--n-val", "0", "--n-test", "4",
                 "--out", str(tmp_path / "w")]) == 0
    assert (tmp_path / "w" / "world.json").is_file()
    with pytest.raises(SystemExit):
        main(["encode", "--help"])
    assert "usage: edje encode" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["no-such-job"])


def test_the_console_script_is_installed():
    exe = Path(sys.executable).parent / "edje"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert all(job in out for job in JOBS)


@pytest.mark.slow
def test_the_wheel_installs_exactly_one_top_level_name(tmp_path):
    leftover = not (ROOT / "build").exists()  # setuptools builds in the source tree's build/: remove what we made
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True, text=True)
    if leftover:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"edje"}, top
    # the design card's folders travel inside it, with their data files
    for part in ("pipeline", "serving", "schemas", "model", "storage", "training", "jobs", "evaluation", "sampleworld"):
        assert f"edje/{part}/__init__.py" in names
    assert "edje/serving/ui/index.html" in names and any(n.startswith("edje/model/configs/") for n in names)
    assert {"edje/sampleworld/open_assets/sprites.png", "edje/sampleworld/open_assets/OFL.txt"} <= set(names)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "edje = edje.cli:main" in entry
