#include "tools/bench/report.h"

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace switchboard::bench {

void print_value(const std::string& name, const std::string& value) {
  fmt::print("{}={}\n", name, value);
  std::fflush(stdout);
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

std::string load_average() {
  std::ifstream file("/proc/loadavg");
  std::string one_minute;
  return file >> one_minute ? one_minute : "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// When the run started: inherited from the parent through kStartVariable
// (steady_clock is CLOCK_MONOTONIC, one clock for every process of the
// machine), so that worker processes count from the same start; else now,
// exported for the children this process starts.
Clock::time_point run_start() {
  constexpr char kStartVariable[] = "SB_BENCH_START_NS";
  if (const char* inherited = std::getenv(kStartVariable)) {
    char* end = nullptr;
    long long ns = std::strtoll(inherited, &end, 10);
    if (end != inherited && *end == '\0') {
      return Clock::time_point(std::chrono::nanoseconds(ns));
    }
  }
  Clock::time_point now = Clock::now();
  std::string ns = std::to_string(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count());
  ::setenv(kStartVariable, ns.c_str(), 1);
  return now;
}

}  // namespace

void progress_line(const std::string& text) {
  static const Clock::time_point start = run_start();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // One write per line (stderr is unbuffered), so lines of threads and of
  // child processes sharing the terminal do not interleave.
  std::string line = fmt::format("# [{:7.1f} s] {}\n", seconds, text);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace switchboard::bench
