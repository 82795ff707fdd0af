"""Runs a unittest suite and ends with the summary line tools/test counts, in
Catch2's words: "test cases: N | P passed | F failed". A skipped test prints
"skipped: <reason>" and counts as neither. Returns the exit status (0: none
failed)."""

import sys
import unittest


def run_and_summarize(suite, stream=sys.stdout, result_class=None):
    runner = unittest.TextTestRunner(stream=stream, verbosity=2)
    if result_class is not None:
        runner.resultclass = result_class
    result = runner.run(suite)
    for test, reason in result.skipped:
        print(f"skipped: {test.id()}: {reason}", file=stream)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    ran = result.testsRun - len(result.skipped)
    print(f"test cases: {ran} | {ran - failed} passed | {failed} failed", file=stream)
    stream.flush()
    return 1 if failed else 0
