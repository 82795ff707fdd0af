#!/usr/bin/env bash
# Runs a Python test of switchboard.torch_rpc with the project's virtual
# environment's Python (@sb_venv: PyTorch 2.11 from PyPI, with expecttest
# and pytest) and the package bazel built (//python:package) on the path.
#   run_python_test.sh SCRIPT [ARGS...]   (paths relative to the runfiles root)
set -euo pipefail
cd "${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-switchboard}" 2>/dev/null || true
export PYTHONPATH="$PWD/python/pkg${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec external/sb_venv/python "$@"
