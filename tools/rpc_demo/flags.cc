#include "tools/rpc_demo/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

namespace switchboard::rpc_demo {

const char* const kUsage =
    "usage: launch --nproc N -- rpc_demo [flags]\n"
    "\n"
    "Rank 0 is the parameter server \"ps\"; ranks 1..N-1 are trainers\n"
    "\"trainer-1\"... that fit a linear regression y = X w* + noise with SGD over\n"
    "RPC in a dynamic group, then check with a Gloo allreduce that they hold the\n"
    "same parameters. With 3 or more trainers, one joins mid-run and one leaves.\n"
    "\n"
    "  --steps S           SGD steps of trainer-1 (default 10000; --quick 200)\n"
    "  --spread P          the last trainer runs P% fewer steps (default 20)\n"
    "  --dim D             parameters (default 128; --quick 64)\n"
    "  --batch B           minibatch rows per step (default 32)\n"
    "  --samples R         rows in each trainer's shard (default 4096; --quick 1024)\n"
    "  --held-out R        rows in the ps's held-out set (default 2048; --quick 1024)\n"
    "  --lr X              SGD step size (default 0.05)\n"
    "  --pushes-per-update K  gradients averaged into one update (default: the\n"
    "                      number of trainers, i.e. one update per round)\n"
    "  --log-every U       updates between progress lines (default: ~10 lines)\n"
    "  --late-joiner R     trainer R joins the group once the ps is halfway\n"
    "                      (default: the last trainer when there are 3 or more;\n"
    "                      0: none)\n"
    "  --leaver R          trainer R leaves the group after a third of its steps\n"
    "                      (default: trainer-2 when there are 3 or more; 0: none)\n"
    "  --seed N            seed of w*, the shards and the held-out set (default 1)\n"
    "  --listen-address A  address PIPE and Gloo bind (default 127.0.0.1)\n"
    "  --quick             a run of about a second, for tests\n"
    "  -h, --help          print this help\n"
    "\n"
    "Exit status: 0 the held-out loss went down and the trainers agree;\n"
    "1 it did not, they do not, or something failed; 2 usage error.\n";

namespace {

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// An integer flag: its name, where it goes, and its smallest allowed value.
struct IntFlag {
  const char* name;
  int64_t DemoFlags::*field;
  int64_t min;
};

constexpr IntFlag kIntFlags[] = {
    {"--steps", &DemoFlags::steps, 1},
    {"--spread", &DemoFlags::spread, 0},
    {"--dim", &DemoFlags::dim, 1},
    {"--batch", &DemoFlags::batch, 1},
    {"--samples", &DemoFlags::samples, 1},
    {"--held-out", &DemoFlags::held_out, 1},
    {"--pushes-per-update", &DemoFlags::pushes_per_update, 0},
    {"--log-every", &DemoFlags::log_every, 0},
    {"--seed", &DemoFlags::seed, 0},
    {"--late-joiner", &DemoFlags::late_joiner, 0},
    {"--leaver", &DemoFlags::leaver, 0},
};

// Applies one "--flag VALUE"; returns an error message, or "" when it fits.
std::string apply_flag(std::string_view flag, std::string_view value, DemoFlags* flags) {
  for (const IntFlag& f : kIntFlags) {
    if (flag != f.name) continue;
    auto n = parse_number<int64_t>(value);
    if (!n || *n < f.min) {
      return fmt::format("{} wants an integer >= {}, not '{}'", flag, f.min, value);
    }
    flags->*f.field = *n;
    return "";
  }
  if (flag == "--lr") {
    auto x = parse_number<double>(value);
    if (!x || !std::isfinite(*x) || *x <= 0) {
      return fmt::format("--lr wants a positive number, not '{}'", value);
    }
    flags->lr = *x;
  } else if (flag == "--listen-address") {
    if (value.empty()) return "--listen-address wants an address";
    flags->listen_address = std::string(value);
  } else {
    return fmt::format("unknown flag '{}'", flag);
  }
  return "";
}

}  // namespace

FlagsResult parse_flags(int argc, char** argv) {
  FlagsResult result;
  const std::vector<std::string_view> args(argv + std::min(argc, 1), argv + argc);
  if (std::find(args.begin(), args.end(), "--quick") != args.end()) {
    result.flags.quick = true;
    result.flags.steps = 200;
    result.flags.dim = 64;
    result.flags.samples = 1024;
    result.flags.held_out = 1024;
  }
  for (size_t i = 0; i < args.size() && result.error.empty(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--quick") continue;
    if (arg == "-h" || arg == "--help") {
      result.help = true;
      return result;
    }
    if (!arg.starts_with("--")) {
      result.error = fmt::format("unexpected argument '{}'", arg);
    } else if (size_t eq = arg.find('='); eq != std::string_view::npos) {
      result.error = apply_flag(arg.substr(0, eq), arg.substr(eq + 1), &result.flags);
    } else if (i + 1 < args.size()) {
      result.error = apply_flag(arg, args[++i], &result.flags);
    } else {
      result.error = fmt::format("{} wants a value", arg);
    }
  }
  if (result.error.empty() && result.flags.spread > 90) {
    result.error = fmt::format("--spread wants a percentage from 0 to 90, not {}",
                               result.flags.spread);
  }
  return result;
}

int64_t late_joiner(const DemoFlags& flags, int trainers) {
  if (flags.late_joiner >= 0) return flags.late_joiner;
  return trainers >= 3 ? trainers : 0;
}

int64_t leaver(const DemoFlags& flags, int trainers) {
  if (flags.leaver >= 0) return flags.leaver;
  return trainers >= 3 ? 2 : 0;
}

int64_t steps_for(const DemoFlags& flags, int trainer, int trainers) {
  if (trainers <= 1) return flags.steps;
  const int64_t fewer =
      flags.steps * flags.spread * (trainer - 1) / (100 * int64_t{trainers - 1});
  return std::max<int64_t>(1, flags.steps - fewer);
}

}  // namespace switchboard::rpc_demo
