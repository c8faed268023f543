"""What `ray job submit --working-dir .` uploads from this checkout: Ray's own packager, run on the repository."""

from pathlib import Path
from zipfile import ZipFile

from ray._private.ray_constants import get_runtime_env_default_excludes
from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE, create_package

ROOT = Path(__file__).resolve().parent.parent


def test_the_working_dir_package_holds_the_jobs_and_stays_far_under_rays_limit(tmp_path):
    """The cluster recipe's upload: the jobs and the package's code go, the checkpoints and git history do not,
    and the zip stays under a quarter of the size Ray's job server refuses (its request limit is 100 MiB)."""
    target = tmp_path / "working_dir.zip"
    create_package(str(ROOT), target, include_gitignore=True, excludes=get_runtime_env_default_excludes())
    names = ZipFile(target).namelist()
    assert "jobs/encode_cc12m.py" in names and "model/configs/" in {n[:len("model/configs/")] for n in names}
    assert not [n for n in names if n.startswith(("checkpoints/", ".git/", "runs/"))]
    assert target.stat().st_size < GCS_STORAGE_MAX_SIZE / 4, target.stat().st_size
