#include "tools/launch/options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>

namespace switchboard::launch {

const char* const kUsage =
    "usage: launch --nproc N [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts a store server and N local workers running PROGRAM ARGS, each with\n"
    "torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
    "MASTER_ADDR, MASTER_PORT, plus SWITCHBOARD_STORE=tcp://ADDR:PORT.\n"
    "\n"
    "  --nproc N            number of workers (required, 1 to 4096)\n"
    "  --master-addr ADDR   address the store server listens on and the workers\n"
    "                       connect to (default 127.0.0.1)\n"
    "  --master-port PORT   store server port; 0 lets it pick one (default 0)\n"
    "  --store-server PATH  store server binary (default: $SWITCHBOARD_STORE_SERVER,\n"
    "                       else //tools/store_server from the runfiles or beside\n"
    "                       this binary)\n"
    "  --timeout-stop S     seconds stopped workers get before SIGKILL (default 5)\n"
    "  --no-prefix          leave worker output as is (default: \"[rank N] \"\n"
    "                       before every line of stdout and stderr)\n"
    "  -h, --help           print this help\n"
    "\n"
    "When a worker exits non-zero or is killed by a signal, the others get\n"
    "SIGTERM (SIGKILL after the timeout) and launch exits 1, naming the rank.\n"
    "SIGINT, SIGTERM and SIGHUP are forwarded to every worker; launch then exits\n"
    "128 + the signal number (a second signal kills the workers at once).\n"
    "Exit status: 0 all workers exited 0; 1 a worker or the store server failed;\n"
    "2 usage error; 128+S stopped by signal S.\n";

namespace {

constexpr int kMaxProcesses = 4096;
constexpr double kMaxStopSeconds = 24 * 3600;

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Applies one "--flag VALUE"; returns an error message, or "" when it fits.
std::string apply_flag(std::string_view flag, std::string_view value,
                       LaunchOptions* options) {
  if (flag == "--nproc") {
    auto n = parse_number<int>(value);
    if (!n || *n < 1 || *n > kMaxProcesses) {
      return fmt::format("--nproc wants a number from 1 to {}, not '{}'", kMaxProcesses,
                         value);
    }
    options->nproc = *n;
  } else if (flag == "--master-addr") {
    if (value.empty()) return "--master-addr wants an address";
    options->master_addr = std::string(value);
  } else if (flag == "--master-port") {
    auto port = parse_number<uint32_t>(value);
    if (!port || *port > 65535) return fmt::format("bad --master-port '{}'", value);
    options->master_port = static_cast<uint16_t>(*port);
  } else if (flag == "--store-server") {
    if (value.empty()) return "--store-server wants a path";
    options->store_server = std::string(value);
  } else {  // --timeout-stop
    auto seconds = parse_number<double>(value);
    if (!seconds || !std::isfinite(*seconds) || *seconds < 0 ||
        *seconds > kMaxStopSeconds) {
      return fmt::format("--timeout-stop wants seconds (0 to {}), not '{}'",
                         kMaxStopSeconds, value);
    }
    options->stop_timeout = std::chrono::milliseconds(std::llround(*seconds * 1000));
  }
  return "";
}

bool takes_value(std::string_view flag) {
  return flag == "--nproc" || flag == "--master-addr" || flag == "--master-port" ||
         flag == "--store-server" || flag == "--timeout-stop";
}

bool is_executable_file(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

ParseResult parse_args(int argc, char** argv) {
  ParseResult result;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program starts here
    if (arg == "-h" || arg == "--help") {
      result.help = true;
      return result;
    }
    if (arg == "--no-prefix") {
      result.options.prefix_output = false;
      continue;
    }
    auto equals = arg.find('=');
    std::string_view flag = arg.substr(0, equals);
    if (!takes_value(flag)) {
      result.error = fmt::format("unknown flag '{}'", arg);
      return result;
    }
    std::string_view value;
    if (equals != std::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      result.error = fmt::format("{} needs a value", flag);
      return result;
    }
    result.error = apply_flag(flag, value, &result.options);
    if (!result.error.empty()) return result;
  }
  result.options.command.assign(argv + i, argv + argc);
  if (result.options.nproc == 0) {
    result.error = "--nproc is required";
  } else if (result.options.command.empty() || result.options.command[0].empty()) {
    result.error = "no program given (put it after --)";
  }
  return result;
}

std::string find_store_server(const std::string& argv0) {
  namespace fs = std::filesystem;
  if (const char* path = std::getenv("SWITCHBOARD_STORE_SERVER")) return path;
  const std::string runfile = "switchboard/tools/store_server/store_server";
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(fmt::format("{}/{}", dir, runfile));
  }
  candidates.push_back(fmt::format("{}.runfiles/{}", argv0, runfile));
  std::error_code error;
  fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(fmt::format("{}.runfiles/{}", self.string(), runfile));
    candidates.push_back((self.parent_path() / "../store_server/store_server").string());
    candidates.push_back((self.parent_path() / "store_server").string());
  }
  for (const auto& candidate : candidates) {
    if (!is_executable_file(candidate)) continue;
    fs::path absolute = fs::absolute(candidate, error);
    return error ? candidate : absolute.lexically_normal().string();
  }
  throw std::runtime_error(fmt::format(
      "cannot find the store server (tried {}); pass --store-server PATH or set "
      "SWITCHBOARD_STORE_SERVER",
      fmt::join(candidates, ", ")));
}

std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = dirs.find(':');
    std::string_view dir = dirs.substr(0, colon);
    std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, name);
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) return name;
    dirs.remove_prefix(colon + 1);
  }
}

}  // namespace switchboard::launch
