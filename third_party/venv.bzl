"""@sb_venv: the project's virtual environment, made by tools/setup.

The environment lives in the checkout's .venv (Python 3.12 with PyTorch 2.x
from PyPI, never the system's Python). This rule finds it from the
checkout, never from a hard-coded path, and offers:

  @sb_venv//:python   a script that runs the environment's Python with its
                      arguments (a test's data dependency: its runfile is
                      external/sb_venv/python). Without the environment it
                      says so on stderr and exits 3.

Whether the environment exists is checked when the script runs, so a
checkout that made it after its first build needs no refetch.
"""

def _sb_venv_impl(ctx):
    root = ctx.path(Label("//:WORKSPACE")).dirname
    python = "%s/.venv/bin/python" % root
    ctx.file(
        "python",
        "\n".join([
            "#!/bin/sh",
            "# The project's virtual environment's Python (third_party/venv.bzl).",
            "if [ ! -x '%s' ]; then" % python,
            "  echo 'no project virtual environment at %s: run tools/setup' >&2" % python,
            "  exit 3",
            "fi",
            "exec '%s' \"$@\"" % python,
            "",
        ]),
        executable = True,
    )
    ctx.file("BUILD.bazel", 'exports_files(["python"])\n')

sb_venv = repository_rule(implementation = _sb_venv_impl, local = True)
