"""The packages a release would publish, built from a clean copy of what git tracks and
checked as the registries would: the Python sdist and wheel (``python -m build``, ``twine
check --strict``, complete metadata, an sdist that builds the same wheel) and the JS SDK's
npm tarball (``npm pack``, ``npm publish --dry-run``). The wheel as a user installs and
runs it: test_wheel.py."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import rpcbus

from .test_wheel import ROOT, tracked_copy


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_the_python_packages_build_pass_twine_and_carry_their_metadata(tmp_path):
    src = tracked_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                    "--outdir", str(dist), str(src)], check=True, capture_output=True)
    [sdist], [wheel] = dist.glob("*.tar.gz"), dist.glob("*.whl")
    version = rpcbus.__version__
    assert sdist.name == f"rpcbus-{version}.tar.gz"
    assert wheel.name == f"rpcbus-{version}-py3-none-any.whl"
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                            str(sdist), str(wheel)], capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count("PASSED") == 2, check.stdout

    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(f"rpcbus-{version}.dist-info/METADATA"))
        licenses = [n for n in z.namelist() if n.endswith("licenses/LICENSE")]
    assert meta["Name"] == "rpcbus" and meta["Version"] == version
    assert meta["License"] == "MIT" and licenses
    assert meta["Requires-Python"] == ">=3.11" and meta["Author"]
    assert meta["Description-Content-Type"] == "text/markdown"
    classifiers = meta.get_all("Classifier")
    for wanted in ("License :: OSI Approved :: MIT License", "Typing :: Typed",
                   "Programming Language :: Python :: 3.11", "Development Status :: 3 - Alpha"):
        assert wanted in classifiers
    description = meta.get_payload()
    assert description.startswith("# rpcbus") and "## [Unreleased]" in description

    # the sdist is complete: it builds the same wheel on its own
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        t.extractall(tmp_path / "unpacked", filter="data")
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "setup.cfg", "pyproject.toml",
                   "clients/py.typed", "broker/dashboard.html", "conf/rpcbus.service",
                   "benchmarks/cost_baseline.json"):
        assert needed in names, needed
    again = tmp_path / "again"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(again),
                    str(tmp_path / "unpacked" / f"rpcbus-{version}")],
                   check=True, capture_output=True)
    [rebuilt] = again.glob("*.whl")
    assert wheel_files(rebuilt) == wheel_files(wheel)
    assert {"rpcbus/py.typed", "rpcbus/broker/dashboard.html",
            "rpcbus/conf/rpcbus.toml"} <= wheel_files(wheel)


def test_the_js_sdk_packs_and_would_publish_cleanly(tmp_path):
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI"):
            pytest.fail("npm missing: ./dev test installs it")
        pytest.skip("npm missing (./dev test installs it)")
    js = tracked_copy(tmp_path, "clients/js")
    package = json.loads((js / "package.json").read_text())
    assert package["version"] == rpcbus.__version__      # one version for both SDKs
    assert package["license"] == "MIT" and package["types"] and package["exports"]
    assert (js / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    env = {**os.environ, "npm_config_cache": str(tmp_path / "npm-cache"),
           "npm_config_update_notifier": "false"}
    packed = subprocess.run([npm, "pack", "--dry-run", "--json"], cwd=js, env=env,
                            capture_output=True, text=True, check=True)
    [tarball] = json.loads(packed.stdout)
    files = {f["path"] for f in tarball["files"]}
    assert {"package.json", "README.md", "LICENSE", "src/index.js", "src/index.d.ts",
            "src/client.js"} <= files
    assert all(f.startswith("src/") or f in ("package.json", "README.md", "LICENSE")
               for f in files), files                  # no tests, benchmarks or lockfile
    published = subprocess.run([npm, "publish", "--dry-run"], cwd=js, env=env,
                               capture_output=True, text=True)
    assert published.returncode == 0, published.stderr
    warnings = [line for line in published.stderr.splitlines()
                if line.startswith("npm warn") and "logged in" not in line]
    assert not warnings, warnings       # npm fixed nothing in package.json, found nothing odd
    assert f"+ rpcbus@{rpcbus.__version__}" in published.stdout
