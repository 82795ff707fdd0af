// The command-line conventions every Switchboard tool shares, on top of
// CLI11 (Debian's libcli11-dev 2.1.2, //third_party:cli11):
//   - `-h`/`--help` prints "usage: SYNOPSIS" first, then what the tool does,
//     its flags with their defaults, its subcommands and a footer, on stdout;
//     the tool exits 0.
//   - A usage error prints "PROGRAM: WHAT IS WRONG" (naming the flag and the
//     value), the usage line and a pointer to --help on stderr; the tool
//     exits 2.
//   - The validators below state ranges in the same words in every tool.
//
// A tool declares its flags on a CLI::App, calls set_synopsis() on it (and on
// each subcommand), then parse() and report():
//
//   CLI::App app("Starts ...", "launch");
//   cli::set_synopsis(app, "launch --nproc N [flags] [--] PROGRAM [ARGS...]");
//   app.add_option("--nproc", nproc, "workers to start")->check(cli::in_range(1, 4096));
//   if (auto status = cli::report(app, cli::parse(app, argc, argv))) return *status;
//
// Thread safety: a CLI::App belongs to one thread; parse it once, from main.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace switchboard::cli {

// What parse() found: go on (ok()), a request for help, or a usage error.
struct Outcome {
  bool help = false;  // -h/--help was given
  std::string error;  // non-empty: what is wrong, naming the flag and the value
  bool ok() const { return !help && error.empty(); }
};

// Gives `app` (a program or one of its subcommands) the shared help layout,
// whose first line is "usage: <synopsis>", and the shared flag defaults:
// group "Flags", defaults shown in the help, and the last value wins when a
// flag is given twice. Call it before adding flags and subcommands (which
// inherit both); give each subcommand its own synopsis.
void set_synopsis(CLI::App& app, const std::string& synopsis);

// Parses `args` (argv[1..], in order) into `app` and runs its validators.
// CLI11's parse errors become the outcome; only std::bad_alloc escapes.
// -h/--help wins over errors in the other flags.
Outcome parse(CLI::App& app, std::vector<std::string> args);
Outcome parse(CLI::App& app, int argc, const char* const* argv);

// The help of `app`, or of the subcommand the command line chose.
std::string help_text(const CLI::App& app);

// The usage line ("usage: ...") of `app`, or of the subcommand chosen.
std::string usage_line(const CLI::App& app);

// A flag set parsed on its own (tests of a tool's flags): what
// parse_flags() filled in, and the outcome.
template <typename Flags>
struct Parsed {
  Flags flags;
  Outcome outcome;
};

// Declares the flags of `add` (e.g. add_launch_flags) on a fresh app and
// parses `args` into a default-constructed Flags.
template <typename Flags>
Parsed<Flags> parse_flags(void (*add)(CLI::App&, Flags*), std::vector<std::string> args) {
  Parsed<Flags> parsed;
  CLI::App app;
  add(app, &parsed.flags);
  parsed.outcome = parse(app, std::move(args));
  return parsed;
}

// Prints what `outcome` asks for and returns the exit status: the help on
// stdout, 0; "<program>: <error>", the usage line and a pointer to --help on
// stderr, 2. Returns nullopt, printing nothing, when outcome.ok().
std::optional<int> report(const CLI::App& app, const Outcome& outcome);

// Validators. CLI11 puts the flag's name before their message:
// "--nproc: 0 is not an integer in [1, 4096]".

// An integer from `min` to `max` (both included).
CLI::Validator in_range(int64_t min, int64_t max);
// An integer >= `min`.
CLI::Validator at_least(int64_t min);
// A finite number from `min` to `max` (both included).
CLI::Validator number_in(double min, double max);
// A finite number > 0.
CLI::Validator positive_number();
// A non-empty value that does not start with '-' (CLI11 takes the next
// argument as the value of "--flag=", so this also catches a missing one).
// `what` names the kind of value in the message, e.g. "an address".
CLI::Validator non_empty(const std::string& what);

}  // namespace switchboard::cli
