// How the benchmarks report: results as name=value lines on stdout, and
// progress lines on stderr while they run, so that a long run shows what it
// is doing and `bench rpc > results.txt` keeps only the results.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace switchboard::bench {

// Prints "name=value" on stdout and flushes it.
void print_value(const std::string& name, const std::string& value);

// The CPUs this process may run on, as `nproc` counts them (0 if unknown).
int usable_cpus();

// The 1-minute load average, from /proc/loadavg ("?" when unreadable).
std::string load_average();

// Prints "# [   12.3 s] <text>" on stderr: seconds since the run started
// (the first progress line of the parent process; child processes inherit
// it), then what it starts doing. Call it once before starting children.
// Thread-safe.
void progress_line(const std::string& text);

template <typename... Args>
void progress(fmt::format_string<Args...> format, Args&&... args) {
  progress_line(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace switchboard::bench
