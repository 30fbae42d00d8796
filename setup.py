"""Builds the meshccl_torch wheel: meson builds libmeshccl, its transport
plugins and the extension; this copies them into the package, where the
extension finds the library through its $ORIGIN/lib run path and the library
finds its plugins in lib/meshccl, as in an installed tree (<libdir>/meshccl).

MESHCCL_BUILD_DIR: an existing meson build directory to package (it must have
been set up with the torch feature); unset, build/pip is set up and built.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def project_version():
    with open(os.path.join(HERE, "meson.build")) as f:
        return re.search(r"^\s*version:\s*'([^']+)'", f.read(), re.M).group(1)


def check_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit("meshccl_torch is built for an interpreter that has PyTorch; %s cannot import torch (%s). "
                 "On Debian: /usr/bin/python3 -m venv --system-site-packages ENV, then ENV/bin/pip install ."
                 % (sys.executable, e))


class BinaryDistribution(Distribution):
    """The wheel holds compiled code: tag it for this platform and interpreter."""

    def has_ext_modules(self):
        return True


class BuildWithMeson(build_py):
    def run(self):
        check_torch()
        super().run()
        build = os.path.abspath(os.environ.get("MESHCCL_BUILD_DIR") or os.path.join(HERE, "build", "pip"))
        if not os.path.isfile(os.path.join(build, "build.ninja")):
            subprocess.check_call(["meson", "setup", build, HERE, "-Dtorch=enabled", "-Dtests=disabled",
                                   "-Dperf=disabled", "-Dtrain=disabled"])
        subprocess.check_call(["ninja", "-C", build])
        exts = glob.glob(os.path.join(build, "torch", "meshccl_torch", "_C*.so"))
        if not exts:
            sys.exit("%s has no torch/meshccl_torch/_C*.so: set it up with -Dtorch=enabled" % build)
        pkg = os.path.join(self.build_lib, "meshccl_torch")
        lib = os.path.join(pkg, "lib")
        os.makedirs(lib, exist_ok=True)
        for ext in exts:
            shutil.copy2(ext, pkg)
        # Under its soname, the name the extension asks the loader for.
        shutil.copy2(os.path.realpath(os.path.join(build, "libmeshccl.so")), os.path.join(lib, "libmeshccl.so.0"))
        plugins = os.path.join(lib, "meshccl")
        os.makedirs(plugins, exist_ok=True)
        for plugin in glob.glob(os.path.join(build, "plugins", "libmeshccl-transport-*.so")):
            shutil.copy2(plugin, plugins)


setup(
    version=project_version(),
    packages=["meshccl_torch"],
    package_dir={"meshccl_torch": "torch/meshccl_torch"},
    cmdclass={"build_py": BuildWithMeson},
    distclass=BinaryDistribution,
    zip_safe=False,
)
