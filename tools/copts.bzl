"""Compiler options shared by every Switchboard target (one place, as Abseil does)."""

SB_COPTS = [
    "-std=c++20",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]

SB_TEST_COPTS = SB_COPTS + [
    "-Wno-unused-variable",
]
