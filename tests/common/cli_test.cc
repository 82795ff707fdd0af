// The command line every tool shares (common/cli): the help layout, how parse
// errors are worded, and the validators' ranges.
#include "common/cli.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace cli = switchboard::cli;

namespace {

// A small tool: a required integer, a port, a number of seconds, an
// address, a flag and a subcommand with its own flag.
struct Tool {
  int count = 0;
  int port = 0;
  double seconds = 1.5;
  std::string address = "127.0.0.1";
  bool verbose = false;
  int rounds = 3;
  CLI::App app{"Does a thing with a count.", "tool"};
  CLI::App* sub = nullptr;

  Tool() {
    cli::set_synopsis(app, "tool --count N [flags]");
    app.add_option("--count", count, "how many")
        ->type_name("N")
        ->required()
        ->check(cli::at_least(1));
    app.add_option("--port", port, "a port")
        ->type_name("PORT")
        ->check(cli::in_range(0, 65535));
    app.add_option("--seconds", seconds, "how long")
        ->type_name("S")
        ->check(cli::number_in(0, 60));
    app.add_option("--address", address, "where")
        ->type_name("ADDR")
        ->check(cli::non_empty("an address"));
    app.add_flag("--verbose", verbose, "say more");
    sub = app.add_subcommand("again", "does it again");
    cli::set_synopsis(*sub, "tool again [--rounds N]");
    sub->add_option("--rounds", rounds, "rounds")
        ->type_name("N")
        ->check(cli::positive_number());
  }

  cli::Outcome parse(std::vector<std::string> args) { return cli::parse(app, args); }
};

}  // namespace

TEST_CASE("valid flags are parsed, in both --flag VALUE and --flag=VALUE forms",
          "[cli]") {
  Tool tool;
  cli::Outcome outcome = tool.parse({"--count", "3", "--port=65535", "--seconds", "0.25",
                                     "--address=::1", "--verbose"});
  INFO(outcome.error);
  CHECK(outcome.ok());
  CHECK(tool.count == 3);
  CHECK(tool.port == 65535);
  CHECK(tool.seconds == 0.25);
  CHECK(tool.address == "::1");
  CHECK(tool.verbose);
  CHECK_FALSE(tool.sub->parsed());
}

TEST_CASE("defaults stay when a flag is not given", "[cli]") {
  Tool tool;
  CHECK(tool.parse({"--count", "1"}).ok());
  CHECK(tool.port == 0);
  CHECK(tool.seconds == 1.5);
  CHECK(tool.address == "127.0.0.1");
  CHECK_FALSE(tool.verbose);
}

TEST_CASE("a flag given twice keeps the last value", "[cli]") {
  Tool tool;
  CHECK(tool.parse({"--count", "1", "--count", "7"}).ok());
  CHECK(tool.count == 7);
}

TEST_CASE("values out of range are refused, naming the flag and the value", "[cli]") {
  using Args = std::vector<std::string>;
  auto [args, error] = GENERATE(table<Args, std::string>({
      {{"--count", "0"}, "--count: '0' is not an integer >= 1"},
      {{"--count", "x"}, "--count: 'x' is not an integer >= 1"},
      {{"--count", "2.5"}, "--count: '2.5' is not an integer >= 1"},
      {{"--count", "1", "--port", "65536"},
       "--port: '65536' is not an integer from 0 to 65535"},
      {{"--count", "1", "--port", "-1"},
       "--port: '-1' is not an integer from 0 to 65535"},
      {{"--count", "1", "--seconds", "61"},
       "--seconds: '61' is not a number from 0 to 60"},
      {{"--count", "1", "--seconds", "nan"},
       "--seconds: 'nan' is not a number from 0 to 60"},
      {{"--count", "1", "--seconds", "inf"},
       "--seconds: 'inf' is not a number from 0 to 60"},
      {{"--count", "1", "--address="}, "--address needs a value"},
      {{"--count", "1", "--address=", "--verbose"},
       "--address: wants an address, not '--verbose'"},
      {{"--count", "1", "again", "--rounds", "0"},
       "--rounds: '0' is not a positive number"},
  }));
  Tool tool;
  cli::Outcome outcome = tool.parse(args);
  CHECK_FALSE(outcome.help);
  CHECK(outcome.error == error);
}

TEST_CASE("missing, unknown and unexpected arguments are usage errors", "[cli]") {
  using Args = std::vector<std::string>;
  auto [args, error] = GENERATE(table<Args, std::string>({
      {Args{}, "--count is required"},
      {{"--count"}, "--count needs a value"},
      {{"--count", "1", "--bogus"}, "unknown flag '--bogus'"},
      {{"--bogus"}, "unknown flag '--bogus'"},
      {{"--count", "1", "stray"}, "unexpected argument 'stray'"},
      {{"--count", "1", "again", "--bogus"}, "unknown flag '--bogus'"},
  }));
  Tool tool;
  CHECK(tool.parse(args).error == error);
}

TEST_CASE("-h and --help ask for help, wherever they appear", "[cli]") {
  using Args = std::vector<std::string>;
  Args args = GENERATE(Args{"-h"}, Args{"--help"}, Args{"--count", "0", "--help"},
                       Args{"--count", "1", "again", "-h"});
  Tool tool;
  cli::Outcome outcome = tool.parse(args);
  CHECK(outcome.help);
  CHECK(outcome.error.empty());
}

TEST_CASE("the help starts with the usage line and lists flags with ranges and defaults",
          "[cli]") {
  Tool tool;
  REQUIRE(tool.parse({"--help"}).help);
  const std::string help = cli::help_text(tool.app);
  INFO(help);
  CHECK(help.rfind("usage: tool --count N [flags]\n\nDoes a thing with a count.\n", 0) ==
        0);
  CHECK_THAT(help, Catch::Contains("  -h, --help "));
  CHECK_THAT(
      help, Catch::Contains("--count N") && Catch::Contains("how many (>= 1; required)"));
  CHECK_THAT(help, Catch::Contains("--port PORT") &&
                       Catch::Contains("a port (0 to 65535; default 0)"));
  CHECK_THAT(help, Catch::Contains("how long (0 to 60; default 1.5)"));
  CHECK_THAT(help, Catch::Contains("where (default 127.0.0.1)"));
  CHECK_THAT(help, Catch::Contains("again") && Catch::Contains("does it again"));
  for (size_t start = 0, end; start < help.size(); start = end + 1) {
    end = help.find('\n', start);
    if (end == std::string::npos) end = help.size();
    CHECK(end - start <= 90);
  }
}

TEST_CASE("a subcommand's help and usage line are its own", "[cli]") {
  Tool tool;
  REQUIRE(tool.parse({"again", "--help"}).help);
  CHECK(cli::help_text(tool.app).rfind("usage: tool again [--rounds N]\n", 0) == 0);
  CHECK(cli::usage_line(tool.app) == "usage: tool again [--rounds N]\n");
}

TEST_CASE("report() exits 0 for help, 2 for errors, and lets a good command line go on",
          "[cli]") {
  Tool good;
  CHECK_FALSE(cli::report(good.app, good.parse({"--count", "1"})).has_value());
  Tool bad;
  CHECK(cli::report(bad.app, bad.parse({"--count", "0"})) == 2);
}

TEST_CASE("validators accept the ends of their ranges", "[cli]") {
  std::string value;
  CHECK((value = "0", cli::in_range(0, 10)(value)).empty());
  CHECK((value = "10", cli::in_range(0, 10)(value)).empty());
  CHECK((value = "9223372036854775807", cli::at_least(1)(value)).empty());
  CHECK_FALSE((value = "9223372036854775808", cli::at_least(1)(value)).empty());
  CHECK((value = "0", cli::number_in(0, 1)(value)).empty());
  CHECK((value = "1e-3", cli::positive_number()(value)).empty());
  CHECK_FALSE((value = "0", cli::positive_number()(value)).empty());
  CHECK_FALSE((value = "", cli::non_empty("a path")(value)).empty());
}
