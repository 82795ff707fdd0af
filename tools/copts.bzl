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

# AddressSanitizer, for the few targets built with it (a test and the
# library it checks; the fuzzers build with clang outside Bazel).
SB_ASAN_COPTS = [
    "-fsanitize=address",
    "-fno-omit-frame-pointer",
]

SB_ASAN_LINKOPTS = ["-fsanitize=address"]
