#include "common/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string_view>
#include <utility>

namespace switchboard::cli {

namespace {

constexpr size_t kNameColumn = 28;  // flag names and values, then their help
constexpr size_t kLineWidth = 90;   // as .clang-format's ColumnLimit

// Breaks `text` into lines of at most `width` characters at spaces, keeping
// its own line breaks.
std::string wrap(std::string_view text, size_t width) {
  std::string out;
  size_t line_length = 0;
  while (!text.empty()) {
    size_t end = text.find_first_of(" \n");
    std::string_view word = text.substr(0, end);
    if (line_length > 0 && line_length + 1 + word.size() > width) {
      out += '\n';
      line_length = 0;
    } else if (line_length > 0) {
      out += ' ';
      ++line_length;
    }
    out += word;
    line_length += word.size();
    if (end == std::string_view::npos) break;
    if (text[end] == '\n') {
      out += '\n';
      line_length = 0;
    }
    text.remove_prefix(end + 1);
  }
  return out;
}

// CLI11's help layout with the usage line first and our synopsis in it. A
// flag's line shows its value's name; its help ends with the accepted range
// (the validators' descriptions), "required" or the default.
class Layout : public CLI::Formatter {
 public:
  explicit Layout(std::string synopsis) : synopsis_(std::move(synopsis)) {
    column_width(kNameColumn);
  }

  std::string make_option_name(const CLI::Option* option,
                               bool positional) const override {
    std::string name = CLI::Formatter::make_option_name(option, positional);
    for (size_t comma = name.find(','); comma != std::string::npos;
         comma = name.find(',', comma + 2)) {
      name.insert(comma + 1, " ");  // "-h,--help" -> "-h, --help"
    }
    return name;
  }

  std::string make_option_opts(const CLI::Option* option) const override {
    if (!option->get_option_text().empty()) return " " + option->get_option_text();
    if (option->get_type_size() == 0) return "";  // a flag without a value
    std::string type = option->get_type_name();
    return " " + type.substr(0, type.find(':'));  // without the validators
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    std::vector<std::string> notes;
    std::string type = option->get_type_name();
    for (size_t colon = type.find(':'); colon != std::string::npos;) {
      size_t next = type.find(':', colon + 1);
      std::string range = type.substr(colon + 1, next - colon - 1);
      if (!range.empty()) notes.push_back(range);
      colon = next;
    }
    if (option->get_required()) {
      notes.push_back("required");
    } else if (!option->get_positional() && option->get_type_size() != 0 &&
               !option->get_default_str().empty()) {
      notes.push_back(fmt::format("default {}", option->get_default_str()));
    }
    std::string text = option->get_description();
    if (!notes.empty()) text += fmt::format(" ({})", fmt::join(notes, "; "));
    return wrap(text, kLineWidth - kNameColumn);
  }

  std::string make_usage(const CLI::App* /*app*/, std::string /*name*/) const override {
    return fmt::format("usage: {}\n", synopsis_);
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(),
                             wrap(sub->get_description(), kLineWidth - kNameColumn),
                             kNameColumn);
    return out.str();
  }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string out = make_usage(app, name);
    if (std::string description = make_description(app); !description.empty()) {
      out += "\n" + description;
    }
    out += make_positionals(app);
    out += make_groups(app, mode);
    out += make_subcommands(app, mode);
    if (std::string footer = make_footer(app); !footer.empty()) out += "\n" + footer;
    return out;
  }

 private:
  std::string synopsis_;
};

// The subcommand the command line chose (the deepest one), or `app`.
const CLI::App* chosen(const CLI::App& app) {
  const CLI::App* current = &app;
  while (true) {
    std::vector<CLI::App*> subs = current->get_subcommands();
    if (subs.empty()) return current;
    current = subs.front();
  }
}

// True when -h/--help was given to `app` or to a subcommand it parsed.
bool asked_for_help(const CLI::App& app) {
  const CLI::Option* help = app.get_help_ptr();
  if (help != nullptr && help->count() > 0) return true;
  for (const CLI::App* sub : app.get_subcommands()) {
    if (asked_for_help(*sub)) return true;
  }
  return false;
}

// "bench rpc" for a subcommand, "launch" for a program.
std::string full_name(const CLI::App* app) {
  std::string name = app->get_name();
  for (const CLI::App* parent = app->get_parent(); parent != nullptr;
       parent = parent->get_parent()) {
    name = parent->get_name() + " " + name;
  }
  return name;
}

// What CLI11 left over, without its "--" marks, as an error message; empty
// when nothing was left over.
std::string describe_extras(const CLI::App& app) {
  const bool wants_subcommand =
      app.get_require_subcommand_min() > 0 && app.get_subcommands().empty();
  std::vector<std::string> parts;
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg == "--") continue;
    if (arg.starts_with("-")) {
      parts.push_back(fmt::format("unknown flag '{}'", arg));
    } else if (wants_subcommand) {
      parts.push_back(fmt::format("unknown subcommand '{}'", arg));
    } else {
      parts.push_back(fmt::format("unexpected argument '{}'", arg));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// CLI11 says "--steps: 1 required S missing" for a flag without its value.
std::string describe_mismatch(std::string_view message) {
  size_t colon = message.find(": ");
  if (colon == std::string_view::npos || !message.ends_with(" missing")) {
    return std::string(message);
  }
  return fmt::format("{} needs a value", message.substr(0, colon));
}

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

void set_synopsis(CLI::App& app, const std::string& synopsis) {
  app.formatter(std::make_shared<Layout>(synopsis));
  // A flag given twice: the last value wins, as with getopt.
  app.option_defaults()->group("Flags")->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.set_help_flag("-h,--help", "print this help and exit");
}

Outcome parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes the last one first
  Outcome outcome;
  try {
    app.parse(std::move(args));
  } catch (const CLI::CallForHelp&) {
    outcome.help = true;
  } catch (const CLI::CallForAllHelp&) {
    outcome.help = true;
  } catch (const CLI::ExtrasError& e) {
    outcome.error = describe_extras(app);
    if (outcome.error.empty()) outcome.error = e.what();
  } catch (const CLI::RequiredError& e) {
    // A mistyped subcommand or flag explains a missing one best.
    outcome.error = describe_extras(app);
    if (outcome.error.empty()) outcome.error = e.what();
  } catch (const CLI::ArgumentMismatch& e) {
    outcome.error = describe_mismatch(e.what());
  } catch (const CLI::ParseError& e) {
    outcome.error = e.what();
  }
  // CLI11 checks values before it looks at --help; help wins.
  if (!outcome.error.empty() && asked_for_help(app))
    outcome = Outcome{.help = true, .error = ""};
  return outcome;
}

Outcome parse(CLI::App& app, int argc, const char* const* argv) {
  return parse(app, std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
}

std::string help_text(const CLI::App& app) { return app.help(); }

std::string usage_line(const CLI::App& app) {
  const CLI::App* sub = chosen(app);
  auto layout = std::dynamic_pointer_cast<Layout>(sub->get_formatter());
  if (layout == nullptr) return fmt::format("usage: {} [flags]\n", full_name(sub));
  return layout->make_usage(sub, full_name(sub));
}

std::optional<int> report(const CLI::App& app, const Outcome& outcome) {
  if (outcome.help) {
    std::fputs(help_text(app).c_str(), stdout);
    return 0;
  }
  if (outcome.error.empty()) return std::nullopt;
  const std::string name = full_name(chosen(app));
  fmt::print(stderr, "{}: {}\n{}Run '{} --help' for the flags.\n", name, outcome.error,
             usage_line(app), name);
  return 2;
}

CLI::Validator in_range(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        std::optional<int64_t> n = parse_number<int64_t>(value);
        if (n && *n >= min && *n <= max) return "";
        return fmt::format("'{}' is not an integer from {} to {}", value, min, max);
      },
      fmt::format("{} to {}", min, max));
}

CLI::Validator at_least(int64_t min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        std::optional<int64_t> n = parse_number<int64_t>(value);
        if (n && *n >= min) return "";
        return fmt::format("'{}' is not an integer >= {}", value, min);
      },
      fmt::format(">= {}", min));
}

CLI::Validator number_in(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        std::optional<double> x = parse_number<double>(value);
        if (x && std::isfinite(*x) && *x >= min && *x <= max) return "";
        return fmt::format("'{}' is not a number from {} to {}", value, min, max);
      },
      fmt::format("{} to {}", min, max));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::optional<double> x = parse_number<double>(value);
        if (x && std::isfinite(*x) && *x > 0) return "";
        return fmt::format("'{}' is not a positive number", value);
      },
      "> 0");
}

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& value) -> std::string {
        if (!value.empty() && !value.starts_with("-")) return "";
        return fmt::format("wants {}, not '{}'", what, value);
      },
      "");
}

}  // namespace switchboard::cli
