"""@sb_venv: the project's virtual environment, made by tools/setup.

The environment lives in the checkout's .venv (Python 3.12 with PyTorch 2.x
from PyPI, never the system's Python), or where the repository environment
variable SWITCHBOARD_VENV says (bazel build --repo_env=SWITCHBOARD_VENV=DIR:
building against another PyTorch). This rule finds it from the
checkout, never from a hard-coded path, asks its interpreter where PyTorch
and Python keep their headers and libraries, and offers:

  @sb_venv//:python   a script that runs the environment's Python with its
                      arguments (a test's data dependency: its runfile is
                      external/sb_venv/python). Without the environment it
                      says so on stderr and exits 3.
  @sb_venv//:torch    PyTorch's C++ headers and libraries (libtorch,
                      libtorch_cpu, libc10; libtorch_python with
                      :torch_python), with Python's headers, for code that
                      links torch. PyTorch's bundled fmt is left out of the
                      include path: it would shadow Debian's, which spdlog
                      needs. Without the environment, building it fails
                      saying to run tools/setup.
  @sb_venv//:versions.txt  "torch=<torch.__version__>" and
                      "python_tag=cp<major><minor>" (the wheel's tags,
                      python/make_wheel.py); absent without the environment.

PyTorch's C++ ABI must be this build's (CXX11 ABI 1; PyPI's wheels are so
from 2.7 on); another is an error naming both.

The rule runs again when Bazel's server restarts (tools/setup shuts a
running server down after it changes the environment).
"""

_PROBE = """
import sys, sysconfig, torch, torch.utils
print(torch.__version__)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.utils.cmake_prefix_path.rsplit('/share/cmake', 1)[0])
print(sysconfig.get_paths()['include'])
print('cp%d%d' % sys.version_info[:2])
"""

_MISSING = """#error "no project virtual environment with PyTorch at {venv}: run tools/setup ({why})"
"""

def _python_script(python):
    return "\n".join([
        "#!/bin/sh",
        "# The project's virtual environment's Python (third_party/venv.bzl).",
        "if [ ! -x '%s' ]; then" % python,
        "  echo 'no project virtual environment at %s: run tools/setup' >&2" % python,
        "  exit 3",
        "fi",
        "exec '%s' \"$@\"" % python,
        "",
    ])

def _missing(ctx, venv, why):
    ctx.file("missing_venv.cc", _MISSING.format(venv = venv, why = why.replace('"', "'")))
    return """
cc_library(
    name = "torch",
    srcs = ["missing_venv.cc"],
    visibility = ["//visibility:public"],
)

cc_library(
    name = "torch_python",
    deps = [":torch"],
    visibility = ["//visibility:public"],
)

cc_library(
    name = "pybind11",
    deps = [":torch"],
    visibility = ["//visibility:public"],
)
"""

def _torch(ctx, torch_root, python_include):
    # A farm of links to torch/include's entries but fmt, and to Python's
    # headers, inside this repository (Bazel takes no include path from
    # outside the execution root).
    include = ctx.path("%s/include" % torch_root)
    for entry in include.readdir():
        if entry.basename != "fmt":
            ctx.symlink(entry, "include/" + entry.basename)
    ctx.symlink(python_include, "python_include")
    lib = "%s/lib" % torch_root
    return """
cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "python_include/**/*.h"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include", "python_include"],
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-ltorch", "-ltorch_cpu", "-lc10"],
    visibility = ["//visibility:public"],
)

cc_library(
    name = "torch_python",
    linkopts = ["-ltorch_python"],
    deps = [":torch"],
    visibility = ["//visibility:public"],
)

# pybind11 (the copy PyTorch ships) and Python's headers, without linking
# PyTorch: for extensions that must not need torch (switchboard._collective).
cc_library(
    name = "pybind11",
    hdrs = glob(["include/pybind11/**/*.h", "python_include/**/*.h"], allow_empty = True),
    includes = ["include", "python_include"],
    visibility = ["//visibility:public"],
)
""".format(lib = lib)

def _sb_venv_impl(ctx):
    root = ctx.path(Label("//:WORKSPACE")).dirname
    venv = ctx.os.environ.get("SWITCHBOARD_VENV", "%s/.venv" % root)
    python = "%s/bin/python" % venv
    ctx.file("python", _python_script(python), executable = True)
    build = 'exports_files(["python"])\n'
    if not ctx.path(python).exists:
        build += _missing(ctx, venv, "it does not exist")
    else:
        probe = ctx.execute([python, "-c", _PROBE])
        lines = probe.stdout.strip().split("\n")
        if probe.return_code != 0 or len(lines) != 5:
            build += _missing(ctx, venv, "its Python cannot import torch: " + probe.stderr.strip()[-300:])
        elif lines[1] != "1":
            fail("@sb_venv: PyTorch %s in %s is built with the C++ ABI %s; this build uses the CXX11 ABI 1" % (lines[0], venv, lines[1]))
        else:
            build += _torch(ctx, lines[2], lines[3])
            ctx.file("versions.txt", "torch=%s\npython_tag=%s\n" % (lines[0], lines[4]))
            build += 'exports_files(["versions.txt"])\n'
    ctx.file("BUILD.bazel", build)

sb_venv = repository_rule(
    implementation = _sb_venv_impl,
    local = True,
    environ = ["SWITCHBOARD_VENV"],
)
