// Logging setup (common/logging.h): SWITCHBOARD_LOG_LEVEL's syntax, per-logger
// levels, invalid values, and the identity in every line. Lines are captured
// with an spdlog ostream_sink, or read from a child process that ran
// init_logging() with the variable set; nothing depends on timing.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "tests/util/subprocess.h"

using switchboard::init_logging;
using switchboard::set_log_identity;
using switchboard::set_log_levels;
using Level = spdlog::level::level_enum;

namespace {

// A registered logger writing into a string, with the registry's pattern and
// levels (spdlog::initialize_logger). Dropped from the registry on the way
// out, and every level goes back to info.
class Captured {
 public:
  explicit Captured(const std::string& name)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)),
        logger_(std::make_shared<spdlog::logger>(name, sink_)) {
    spdlog::initialize_logger(logger_);
  }
  ~Captured() {
    spdlog::drop(logger_->name());
    set_log_levels("info");
  }
  spdlog::logger& logger() { return *logger_; }
  const std::shared_ptr<spdlog::logger>& shared() { return logger_; }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> logger_;
};

// Makes a capturing logger the default one (spdlog::warn(...) and the
// library's logs) until destroyed.
class CapturedDefault {
 public:
  CapturedDefault()
      : previous_(spdlog::default_logger()), captured_("logging_test_default") {
    spdlog::set_default_logger(captured_.shared());
  }
  ~CapturedDefault() { spdlog::set_default_logger(previous_); }
  std::string text() const { return captured_.text(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  Captured captured_;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has_line(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& line : lines) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

// "[2024-05-01 12:00:00.123] [info] [w1] message"
const std::regex kLine(
    R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[(\w+)\] \[([^\]]+)\] (.*))");

}  // namespace

// The child: logs from the default logger, from "pipe" (created before
// init_logging) and from "late" (created after), at every level, then again
// as worker "w1". args[0], when given, is SWITCHBOARD_LOG_LEVEL's value.
SB_CHILD_MAIN(logging_child) {
  ::dup2(STDOUT_FILENO, STDERR_FILENO);  // the default logger writes to stderr
  if (!args.empty()) ::setenv(switchboard::kLogLevelVariable, args[0].c_str(), 1);
  auto pipe = spdlog::stdout_color_mt("pipe");
  init_logging("child");
  init_logging("ignored");  // only the first call counts
  auto late = spdlog::stdout_color_mt("late");
  using Named = std::pair<const char*, std::shared_ptr<spdlog::logger>>;
  for (const auto& [name, logger] : {Named{"default", spdlog::default_logger()},
                                     Named{"pipe", pipe}, Named{"late", late}}) {
    for (Level level : {Level::trace, Level::debug, Level::info, Level::warn, Level::err,
                        Level::critical}) {
      logger->log(level, "{} {}", name, spdlog::level::to_string_view(level));
    }
  }
  set_log_identity("w1");
  spdlog::error("as the worker");
  return 0;
}

// The child: logs once through the default logger with stderr sent to the
// file args[0], and prints one line on stdout.
SB_CHILD_MAIN(logging_stderr_child) {
  if (std::freopen(args.at(0).c_str(), "w", stderr) == nullptr) return 2;
  init_logging("child");
  spdlog::info("a log line");
  std::fflush(stderr);
  std::printf("a result\n");
  return 0;
}

namespace {

std::vector<std::string> run_child(const std::vector<std::string>& args) {
  sbtest::Subprocess child = sbtest::spawn_child("logging_child", args);
  std::string out = child.read_all();
  INFO(out);
  REQUIRE(child.wait() == 0);
  return lines_of(out);
}

}  // namespace

TEST_CASE("without SWITCHBOARD_LOG_LEVEL every logger logs info and above", "[logging]") {
  ::unsetenv(switchboard::kLogLevelVariable);
  std::vector<std::string> lines = run_child({});
  for (const char* logger : {"default", "pipe", "late"}) {
    INFO(logger);
    CHECK_FALSE(has_line(lines, fmt::format("{} trace", logger)));
    CHECK_FALSE(has_line(lines, fmt::format("{} debug", logger)));
    CHECK(has_line(lines, fmt::format("[info] [child] {} info", logger)));
    CHECK(has_line(lines, fmt::format("[critical] [child] {} critical", logger)));
  }
  CHECK(lines.size() == 3 * 4 + 1);
}

TEST_CASE("SWITCHBOARD_LOG_LEVEL=debug sets every logger to debug", "[logging]") {
  std::vector<std::string> lines = run_child({"debug"});
  for (const char* logger : {"default", "pipe", "late"}) {
    INFO(logger);
    CHECK_FALSE(has_line(lines, fmt::format("{} trace", logger)));
    CHECK(has_line(lines, fmt::format("[debug] [child] {} debug", logger)));
  }
}

TEST_CASE("SWITCHBOARD_LOG_LEVEL=warn,pipe=trace sets the pipe logger apart",
          "[logging]") {
  std::vector<std::string> lines = run_child({"warn,pipe=trace"});
  CHECK(has_line(lines, "pipe trace"));
  CHECK(has_line(lines, "pipe info"));
  for (const char* logger : {"default", "late"}) {
    INFO(logger);
    CHECK_FALSE(has_line(lines, fmt::format("{} info", logger)));
    CHECK(has_line(lines, fmt::format("[warning] [child] {} warning", logger)));
  }
}

TEST_CASE("an invalid SWITCHBOARD_LOG_LEVEL warns once, naming it, and keeps info",
          "[logging]") {
  std::vector<std::string> lines = run_child({"chatty"});
  int warnings = 0;
  for (const std::string& line : lines) {
    if (line.find("SWITCHBOARD_LOG_LEVEL='chatty'") != std::string::npos) {
      ++warnings;
      CHECK(line.find("[warning] [child] ignoring SWITCHBOARD_LOG_LEVEL='chatty': "
                      "'chatty' is not a level") != std::string::npos);
      CHECK(line.find("(logging stays at info)") != std::string::npos);
    }
  }
  CHECK(warnings == 1);
  CHECK_FALSE(has_line(lines, "default debug"));
  CHECK(has_line(lines, "[info] [child] default info"));
}

TEST_CASE("the library's logs go to stderr, a program's results stay alone on stdout",
          "[logging]") {
  char path[] = "/tmp/sb_logging_stderr_XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  sbtest::Subprocess child = sbtest::spawn_child("logging_stderr_child", {path});
  std::string out = child.read_all();
  REQUIRE(child.wait() == 0);
  std::ifstream file(path);
  std::string err((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ::unlink(path);
  CHECK(out == "a result\n");
  std::vector<std::string> lines = lines_of(err);
  REQUIRE(lines.size() == 1);
  std::smatch match;
  REQUIRE(std::regex_match(lines[0], match, kLine));
  CHECK(match[1] == "info");
  CHECK(match[3] == "a log line");
}

TEST_CASE("every line carries a timestamp, the level and who speaks", "[logging]") {
  std::vector<std::string> lines = run_child({"info"});
  REQUIRE_FALSE(lines.empty());
  for (const std::string& line : lines) {
    INFO(line);
    std::smatch match;
    REQUIRE(std::regex_match(line, match, kLine));
    CHECK(match[2] == (line.ends_with("as the worker") ? "w1" : "child"));
  }
}

TEST_CASE("set_log_levels() reads every level name, in any case", "[logging]") {
  auto [text, level] = GENERATE(table<std::string, Level>({
      {"trace", Level::trace},
      {"DEBUG", Level::debug},
      {" info ", Level::info},
      {"warn", Level::warn},
      {"warning", Level::warn},
      {"err", Level::err},
      {"error", Level::err},
      {"Critical", Level::critical},
      {"off", Level::off},
  }));
  Captured named("logging_test_named");
  REQUIRE(set_log_levels(text));
  CHECK(spdlog::default_logger()->level() == level);
  CHECK(named.logger().level() == level);
  Captured later("logging_test_later");
  CHECK(later.logger().level() == level);
}

TEST_CASE("set_log_levels() sets named loggers apart, also those created later",
          "[logging]") {
  Captured pipe("pipe");
  Captured other("logging_test_other");
  REQUIRE(set_log_levels("warn, pipe = debug"));
  CHECK(pipe.logger().level() == Level::debug);
  CHECK(other.logger().level() == Level::warn);
  CHECK(spdlog::default_logger()->level() == Level::warn);
  Captured store("store");
  CHECK(store.logger().level() == Level::warn);
  spdlog::drop("pipe");
  Captured pipe_again("pipe");
  CHECK(pipe_again.logger().level() == Level::debug);

  // Names alone leave the other loggers as they are.
  REQUIRE(set_log_levels("store=error"));
  CHECK(store.logger().level() == Level::err);
  CHECK(other.logger().level() == Level::warn);
}

TEST_CASE("an invalid value changes nothing and warns once, naming the value",
          "[logging]") {
  auto [text, why] = GENERATE(table<std::string, std::string>({
      {"verbose", "'verbose' is not a level"},
      {"info,pipe=loud", "'loud' is not a level"},
      {"pipe=", "'' is not a level"},
      {"", "it names no level"},
      {",,", "it names no level"},
      {std::string(513, 'x'), "longer than 512 characters"},
  }));
  Captured pipe("pipe");
  REQUIRE(set_log_levels("info,pipe=debug"));
  CapturedDefault warnings;
  CHECK_FALSE(set_log_levels(text));
  CHECK(spdlog::default_logger()->level() == Level::info);
  CHECK(pipe.logger().level() == Level::debug);
  std::vector<std::string> lines = lines_of(warnings.text());
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Contains(fmt::format("SWITCHBOARD_LOG_LEVEL='{}'", text)) &&
                           Catch::Contains(why) && Catch::Contains("warning"));
}

TEST_CASE("the worker's identity appears in every later line", "[logging]") {
  init_logging("logging_test");
  Captured captured("logging_test_identity");
  set_log_identity("");
  captured.logger().info("as the program");
  set_log_identity("w1");
  captured.logger().info("as w1");
  set_log_identity("");
  std::vector<std::string> lines = lines_of(captured.text());
  REQUIRE(lines.size() == 2);
  std::smatch match;
  REQUIRE(std::regex_match(lines[0], match, kLine));
  CHECK(match[1] == "info");
  CHECK(match[2] == "logging_test");
  CHECK(match[3] == "as the program");
  REQUIRE(std::regex_match(lines[1], match, kLine));
  CHECK(match[2] == "w1");
  CHECK(match[3] == "as w1");
}

TEST_CASE("set_default_log_identity() names the first worker and keeps a set identity",
          "[logging]") {
  init_logging("logging_test");
  Captured captured("logging_test_default_identity");
  set_log_identity("");
  switchboard::set_default_log_identity("w2");
  captured.logger().info("first");
  switchboard::set_default_log_identity("w3");  // a second worker in this process
  captured.logger().info("second");
  set_log_identity("trainer");
  switchboard::set_default_log_identity("w4");
  captured.logger().info("third");
  set_log_identity("");
  std::vector<std::string> lines = lines_of(captured.text());
  REQUIRE(lines.size() == 3);
  std::smatch match;
  for (auto [i, who] : {std::pair{0, "w2"}, {1, "w2"}, {2, "trainer"}}) {
    REQUIRE(std::regex_match(lines[i], match, kLine));
    CHECK(match[2] == who);
  }
}

TEST_CASE("init_logging() and set_log_identity() may race with logging", "[logging]") {
  Captured captured("logging_test_threads");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&captured, t] {
      init_logging("logging_test");
      for (int i = 0; i < 100; ++i) {
        set_log_identity(fmt::format("w{}", t));
        captured.logger().info("line {} of thread {}", i, t);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  set_log_identity("");
  std::vector<std::string> lines = lines_of(captured.text());
  CHECK(lines.size() == 400);
  const std::regex identity("w[0-3]");
  for (const std::string& line : lines) {
    std::smatch match;
    REQUIRE(std::regex_match(line, match, kLine));
    CHECK(std::regex_match(match[2].str(), identity));
  }
}
