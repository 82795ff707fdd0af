#!/usr/bin/env bash
# Runs a Python test of switchboard.torch_rpc with Debian's python3 (PyTorch
# 1.13) and the package bazel built (//python:package) on the path, and the
# expecttest stand-in that torch's test utilities import (stubs/).
#   run_python_test.sh SCRIPT [ARGS...]   (paths relative to the runfiles root)
set -euo pipefail
cd "${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-switchboard}" 2>/dev/null || true
export PYTHONPATH="$PWD/python/pkg:$PWD/tests/python/stubs${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec /usr/bin/python3 "$@"
