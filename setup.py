"""Builds hetra._core with CMake (Horovod's way: setuptools drives the project's own build) and
packages it with the pure-Python hetra.torch. The C++ libraries are built without LibTorch and
without tests: the module includes no torch header."""
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        jobs = os.environ.get("HETRA_BUILD_JOBS", "2")
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DHETRA_WITH_TORCH=OFF", "-DHETRA_BUILD_TESTS=OFF",
                     f"-DPYTHON_EXECUTABLE={sys.executable}"]
        if subprocess.call(["ninja", "--version"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) == 0:
            configure += ["-G", "Ninja"]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target", "hetra_core"])
        built = os.path.join(build_dir, "python", "hetra", os.path.basename(
            self.get_ext_fullpath(ext.name)))
        self.copy_file(built, self.get_ext_fullpath(ext.name))


setup(
    packages=["hetra", "hetra.torch"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("hetra._core")],
    cmdclass={"build_ext": CMakeBuild},
    # Not build/: that is the Makefile's CMake build directory.
    options={"build": {"build_base": "build-pip"}},
    zip_safe=False,
)
