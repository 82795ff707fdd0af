"""A stand-in for the `expecttest` package, which torch's test utilities
(torch.testing._internal.common_utils) import and no package registry
reachable here ships. It gives what they use of it: the ACCEPT flag and a
TestCase with assertExpectedInline. Expected-output tests are not part of
the RPC suites; assertExpectedInline compares with unittest's assertions
only and never rewrites a file."""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertMultiLineEqual(expect, actual)

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):
        with self.assertRaises(exc_type) as ctx:
            callable(*args, **kwargs)
        self.assertExpectedInline(str(ctx.exception), expect)
