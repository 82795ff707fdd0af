#include "common/logging.h"

#include <fmt/format.h>
#include <spdlog/cfg/helpers.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace switchboard {

namespace {

// %* is the identity (IdentityFlag); %^...%$ colors the level on a terminal.
constexpr char kPattern[] = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%*] %v";

// spdlog::cfg::helpers::load_levels() ignores longer values.
constexpr size_t kMaxLevelsLength = 512;

// Who speaks. Never destroyed: threads may log during static destruction.
struct Identity {
  Mutex mu;
  std::string program SB_GUARDED_BY(mu);  // init_logging()'s argument
  std::string worker SB_GUARDED_BY(mu);   // set_log_identity()'s; empty: unset
};

Identity& identity() {
  static Identity* const id = new Identity;
  return *id;
}

// The %* flag: the worker's name once set, else the program's.
class IdentityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& /*msg*/, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    Identity& id = identity();
    MutexLock lock(id.mu);
    const std::string& name = id.worker.empty() ? id.program : id.worker;
    dest.append(name.data(), name.data() + name.size());
  }

  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<IdentityFlag>();
  }
};

std::string_view trim(std::string_view text) {
  const char* kSpaces = " \t\r\n";
  size_t begin = text.find_first_not_of(kSpaces);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpaces) - begin + 1);
}

bool is_level(std::string_view text) {
  std::string name(trim(text));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return spdlog::level::from_str(name) != spdlog::level::off || name == "off";
}

// What is wrong with a SWITCHBOARD_LOG_LEVEL value; empty when nothing is.
// Reads it the way spdlog::cfg::helpers::load_levels() does, which skips
// what it does not understand instead of saying so.
std::string check_levels(std::string_view value) {
  if (value.size() > kMaxLevelsLength) {
    return fmt::format("longer than {} characters", kMaxLevelsLength);
  }
  bool any = false;
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view entry = value.substr(0, comma);
    value =
        comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    if (entry.empty()) continue;
    size_t equals = entry.find('=');
    std::string_view level =
        equals == std::string_view::npos ? entry : entry.substr(equals + 1);
    if (!is_level(level)) return fmt::format("'{}' is not a level", trim(level));
    any = true;
  }
  return any ? "" : "it names no level";
}

}  // namespace

void init_logging(std::string_view program) {
  static std::once_flag once;
  std::call_once(once, [program] {
    {
      Identity& id = identity();
      MutexLock lock(id.mu);
      id.program = std::string(program);
    }
    // Logs go to stderr, away from what programs print on stdout (results,
    // `port=N`). Only spdlog's own default logger is replaced (it writes to
    // stdout); a default logger the program installed stays.
    if (spdlog::default_logger()->name().empty()) {
      auto logger = std::make_shared<spdlog::logger>(
          "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
      logger->set_level(spdlog::default_logger()->level());
      spdlog::set_default_logger(std::move(logger));
    }
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<IdentityFlag>('*').set_pattern(kPattern);
    spdlog::set_formatter(std::move(formatter));
    const char* value = std::getenv(kLogLevelVariable);
    if (value != nullptr && *value != '\0') set_log_levels(value);
  });
}

void set_log_identity(std::string_view worker) {
  Identity& id = identity();
  MutexLock lock(id.mu);
  id.worker = std::string(worker);
}

void set_default_log_identity(std::string_view worker) {
  Identity& id = identity();
  MutexLock lock(id.mu);
  if (id.worker.empty()) id.worker = std::string(worker);
}

bool set_log_levels(std::string_view value) {
  std::string error = check_levels(value);
  if (!error.empty()) {
    spdlog::warn(
        "ignoring {}='{}': {}; it takes LEVEL or LEVEL,LOGGER=LEVEL,... with LEVEL "
        "one of trace, debug, info, warn, error, critical, off (logging stays at {})",
        kLogLevelVariable, value, error,
        spdlog::level::to_string_view(spdlog::default_logger()->level()));
    return false;
  }
  spdlog::cfg::helpers::load_levels(std::string(value));
  return true;
}

}  // namespace switchboard
