// Logging setup shared by every Switchboard binary, on spdlog: levels from
// the SWITCHBOARD_LOG_LEVEL environment variable, and one line pattern that
// says who speaks:
//
//   [2024-05-01 12:00:00.123] [info] [trainer-1] <message>
//
// (timestamp, level, identity, message). The identity is the worker's name
// once set_log_identity() was called, else the program's name given to
// init_logging(). docs/logging.md describes the variable for users.
//
// Every logger registered with spdlog gets the pattern and the levels: the
// default logger (spdlog::info(...), which the library uses), and named
// loggers created before or after init_logging() through spdlog's factories
// (spdlog::stderr_color_mt(...)) or spdlog::initialize_logger(). Where the
// lines go is up to each logger's sinks; init_logging() changes no sink.
//
// Thread safety: every function here may be called from any thread, also
// while other threads log.
#pragma once

#include <string_view>

namespace switchboard {

// The environment variable init_logging() reads.
inline constexpr char kLogLevelVariable[] = "SWITCHBOARD_LOG_LEVEL";

// Sets up logging for this process: the pattern above on every logger, then
// the levels SWITCHBOARD_LOG_LEVEL names (as set_log_levels() reads them;
// unset or empty: info). An invalid value logs one warning naming the
// variable and the value, and logging stays at info. Call it first thing in
// main(). Only the first call does anything: later calls return at once,
// whatever `program` they pass.
void init_logging(std::string_view program);

// Makes `worker` (e.g. "trainer-1") the identity in every later log line, of
// every logger, instead of the program's name; a later call replaces it.
// One identity per process: worker threads sharing a process share it.
// Called before init_logging(), it takes effect there.
void set_log_identity(std::string_view worker);

// As set_log_identity(), but only when no identity was set yet: init_rpc()
// calls it with the worker's name, so a program that set its own keeps it,
// and in a process that hosts several workers the lines name the first.
void set_default_log_identity(std::string_view worker);

// Applies levels written in SWITCHBOARD_LOG_LEVEL's syntax (spdlog's):
//   LEVEL                   every logger, and those created later
//   LEVEL,NAME=LEVEL,...    the same, but the logger called NAME (also one
//                           created later) at its own level
//   NAME=LEVEL,...          only the loggers named; the others keep theirs
// LEVEL is trace, debug, info, warn (or warning), error (or err), critical
// or off, in any case; spaces around names and levels are ignored. Returns
// true once applied. An unknown level, no level at all, or a value over 512
// characters changes nothing: it logs one warning naming
// SWITCHBOARD_LOG_LEVEL, the value and what is wrong, and returns false.
bool set_log_levels(std::string_view value);

}  // namespace switchboard
