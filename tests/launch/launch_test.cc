// tools/launch: the launcher run as a process, with this test binary as its
// workers (`launch ... -- <this binary> --sb-child NAME`). Workers say when
// they are ready (a line on stdout, or a key in the launcher's store), and
// the test acts on that, never after a sleep. Processes the test expects to
// be gone are watched through pidfds opened while they still run, so a
// recycled pid cannot fool a check.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/error.h"
#include "store/tcp_store.h"
#include "tests/util/subprocess.h"

using sbtest::Subprocess;
using switchboard::TcpStore;

namespace {

constexpr std::chrono::seconds kGuard{60};  // only a broken test waits this long

// ---- run by the launcher as workers -----------------------------------------

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

std::string env_string(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "<unset>";
}

void say(const std::string& line) {
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

// The launcher's store, with the job's secret (SWITCHBOARD_SECRET_FILE),
// as init_rpc connects to it; `secret` false: without it.
TcpStore connect_store(bool secret = true) {
  switchboard::TcpStoreOptions options;
  options.timeout = std::chrono::seconds(60);
  if (secret) options.secret = switchboard::Secret::from_environment();
  return TcpStore(env_string("MASTER_ADDR"),
                  static_cast<uint16_t>(env_int("MASTER_PORT")), options);
}

[[noreturn]] void block_forever() {
  for (;;) ::pause();
}

}  // namespace

SB_CHILD_MAIN(print_env) {
  say(fmt::format(
      "RANK={} LOCAL_RANK={} WORLD_SIZE={} LOCAL_WORLD_SIZE={} MASTER_ADDR={} "
      "MASTER_PORT={} SWITCHBOARD_STORE={}",
      env_string("RANK"), env_string("LOCAL_RANK"), env_string("WORLD_SIZE"),
      env_string("LOCAL_WORLD_SIZE"), env_string("MASTER_ADDR"),
      env_string("MASTER_PORT"), env_string("SWITCHBOARD_STORE")));
  return 0;
}

// Every rank counts itself in and publishes its key; every rank waits for
// all keys (a barrier), and rank 0 checks the count.
SB_CHILD_MAIN(rendezvous) {
  int rank = env_int("RANK");
  int world_size = env_int("WORLD_SIZE");
  TcpStore store = connect_store();
  store.add("count", 1);
  store.set(fmt::format("rank/{}", rank), std::to_string(rank));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(fmt::format("rank/{}", r));
  store.wait(keys);
  if (rank == 0) say(fmt::format("count={}", store.add("count", 0)));
  return 0;
}

// Says where the job's secret is and its mode, and whether the store
// serves a client with it and one without it.
SB_CHILD_MAIN(secret_check) {
  const std::string path = env_string("SWITCHBOARD_SECRET_FILE");
  struct stat info {};
  const bool exists = path != "<unset>" && ::stat(path.c_str(), &info) == 0;
  say(fmt::format("secret file {} mode {:o}", path, exists ? (info.st_mode & 0777) : 0));
  TcpStore with = connect_store(true);
  with.set("k", "v");
  say(fmt::format("with the secret: {}", with.get("k") == switchboard::Bytes{'v'} ? "served"
                                                                                   : "wrong"));
  TcpStore without = connect_store(false);
  try {
    without.get("k");
    say("without the secret: served");
  } catch (const switchboard::ConnectionError&) {
    say("without the secret: refused");
  }
  return 0;
}

// args: failing rank, how it fails ("exit3", "sigkill"), and whether the
// others ignore SIGTERM ("ignore-term"). The others print their pid and
// block forever; the failing rank fails once the test has set "go".
SB_CHILD_MAIN(fail_one) {
  int rank = env_int("RANK");
  if (rank != std::stoi(args.at(0))) {
    if (args.at(2) == "ignore-term") ::signal(SIGTERM, SIG_IGN);
    say(fmt::format("blocking pid={}", ::getpid()));
    block_forever();
  }
  TcpStore store = connect_store();
  store.get("go");
  if (args.at(1) == "sigkill") ::raise(SIGKILL);
  return 3;
}

// Waits for one of SIGINT/SIGTERM/SIGHUP and reports it.
SB_CHILD_MAIN(wait_for_signal) {
  sigset_t signals;
  sigemptyset(&signals);
  for (int signo : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, signo);
  ::sigprocmask(SIG_BLOCK, &signals, nullptr);
  say(fmt::format("waiting pid={}", ::getpid()));
  int signo = 0;
  ::sigwait(&signals, &signo);
  say(fmt::format("got signal {}", signo));
  return 0;
}

SB_CHILD_MAIN(ignore_sigterm) {
  ::signal(SIGTERM, SIG_IGN);
  say(fmt::format("waiting pid={}", ::getpid()));
  block_forever();
}

SB_CHILD_MAIN(sleep_forever) {
  say(fmt::format("waiting pid={}", ::getpid()));
  block_forever();
}

// args: number of stdout lines. Ends with a line that has no newline.
SB_CHILD_MAIN(print_lines) {
  int rank = env_int("RANK");
  int lines = std::stoi(args.at(0));
  for (int i = 0; i < lines; ++i) fmt::print("out {} {}\n", rank, i);
  fmt::print(stderr, "err {}\n", rank);
  fmt::print("last {}", rank);
  return 0;
}

// One attempt of a job with restarts. args: the failing rank, how it fails
// ("sigkill" or "exit3"), and the first attempt that does not fail. Each
// worker says which attempt it is in (TORCHELASTIC_*), publishes its rank
// under the attempt's keys and waits for every rank's (so the whole group of
// the attempt runs). In an attempt that fails, the failing rank then fails
// and the others block until the launcher stops them; in the others, each
// reads the next rank's value and says "worker<r> attempt <a>: <value + 40>".
SB_CHILD_MAIN(attempts) {
  const int rank = env_int("RANK");
  const int world_size = env_int("WORLD_SIZE");
  const int attempt = env_int("TORCHELASTIC_RESTART_COUNT");
  say(fmt::format("attempt {} of max {} run {}", attempt,
                  env_string("TORCHELASTIC_MAX_RESTARTS"),
                  env_string("TORCHELASTIC_RUN_ID")));
  TcpStore store = connect_store();
  const std::string prefix = fmt::format("attempt/{}/", attempt);
  store.set(fmt::format("{}rank/{}", prefix, rank), std::to_string(rank));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r)
    keys.push_back(fmt::format("{}rank/{}", prefix, r));
  store.wait(keys);
  if (attempt < std::stoi(args.at(2))) {
    if (rank != std::stoi(args.at(0))) block_forever();
    if (args.at(1) == "sigkill") ::raise(SIGKILL);
    return 3;
  }
  const switchboard::Bytes next = store.get(keys[(rank + 1) % world_size]);
  say(fmt::format("worker{} attempt {}: {}", rank, attempt,
                  std::stoi(std::string(next.begin(), next.end())) + 40));
  return 0;
}

// args: a FIFO. Rank 0 writes a line to it (a fake store server exits when
// it reads one); every rank then blocks.
SB_CHILD_MAIN(poke_fifo) {
  if (env_int("RANK") == 0) {
    std::ofstream fifo(args.at(0));
    fifo << "stop\n";
  }
  say("blocking");
  block_forever();
}

namespace {

// ---- the test side ------------------------------------------------------------

std::string self_path() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

// The worker command: this binary as the child `name`.
std::vector<std::string> worker(const std::string& name,
                                const std::vector<std::string>& args = {}) {
  std::vector<std::string> command = {self_path(), "--sb-child", name};
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

// Starts launch with `flags`, then "--" and `command`; stderr is merged into
// stdout (the pipe Subprocess reads), so one stream shows the order.
Subprocess start_launch(const std::vector<std::string>& flags,
                        const std::vector<std::string>& command = {}) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                   sbtest::runfile("tools/launch/launch")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (!command.empty()) argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return Subprocess(argv);
}

struct Finished {
  int status;
  std::string output;
};

Finished run_launch(const std::vector<std::string>& flags,
                    const std::vector<std::string>& command = {}) {
  Subprocess launch = start_launch(flags, command);
  std::string output = launch.read_all(kGuard);
  int status = launch.wait();
  return {status, output};
}

// Output lines of one rank ("[rank R] " stripped).
std::vector<std::string> rank_lines(const std::string& output, int rank) {
  std::vector<std::string> lines;
  std::string prefix = fmt::format("[rank {}] ", rank);
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

// A process the test expects to end: a pidfd, which stays bound to that
// process even after its pid is reused.
class ProcessWatch {
 public:
  explicit ProcessWatch(pid_t pid)
      : pid_(pid), fd_(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))) {
    REQUIRE(fd_ >= 0);  // it must not have been reaped yet
  }
  ProcessWatch(ProcessWatch&& other) noexcept
      : pid_(other.pid_), fd_(std::exchange(other.fd_, -1)) {}
  ~ProcessWatch() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Whether the process has ended within `timeout`.
  bool ended(std::chrono::milliseconds timeout) const {
    pollfd readable{fd_, POLLIN, 0};
    return ::poll(&readable, 1, static_cast<int>(timeout.count())) == 1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  int fd_;
};

// Reads lines from `launch` until `count` of them matched `pattern`; returns
// the first group of each match as a number (a pid, a port). Every line read
// is appended to *output.
std::vector<int> read_until(Subprocess& launch, const std::regex& pattern, size_t count,
                            std::string* output) {
  std::vector<int> numbers;
  while (numbers.size() < count) {
    std::string line = launch.read_line(kGuard);
    output->append(line).push_back('\n');
    std::smatch match;
    if (std::regex_search(line, match, pattern)) {
      numbers.push_back(std::stoi(match[1]));
    }
  }
  return numbers;
}

// The launcher's line naming the store server: group 1 its pid, 2 its port.
const std::regex kStoreLine(
    R"(launch: store server \(pid (\d+)\) at tcp://127\.0\.0\.1:(\d+))");

// A directory for files of one test.
std::string temp_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string templ = fmt::format("{}/launch_test.XXXXXX", base ? base : "/tmp");
  REQUIRE(::mkdtemp(templ.data()) != nullptr);
  return templ;
}

std::string write_script(const std::string& dir, const std::string& text) {
  std::string path = dir + "/fake_store_server";
  std::ofstream(path) << text;
  REQUIRE(::chmod(path.c_str(), 0755) == 0);
  return path;
}

// A job secret the test knows (for --secret-file), in a file of its own.
const std::string& test_secret_file() {
  static const std::string path = [] {
    const std::string file = temp_dir() + "/secret";
    switchboard::Secret::random().write_file(file);
    return file;
  }();
  return path;
}

// Runs the fail_one job: rank 1 fails once every other rank blocks.
// Returns the output; checks that every other worker has ended by the time
// the launcher exits, and that it exits 1.
std::string run_failing_job(int nproc, const std::string& how, const std::string& others,
                            const std::vector<std::string>& extra_flags = {}) {
  // The test itself tells the workers to go through the job's store: with
  // a secret it holds.
  std::vector<std::string> flags = {"--nproc", std::to_string(nproc), "--secret-file",
                                    test_secret_file()};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  Subprocess launch = start_launch(flags, worker("fail_one", {"1", how, others}));
  std::string output;
  ProcessWatch store_server(read_until(launch, kStoreLine, 1, &output).at(0));
  std::smatch store;
  REQUIRE(std::regex_search(output, store, kStoreLine));
  auto port = static_cast<uint16_t>(std::stoi(store[2]));
  std::vector<ProcessWatch> siblings;
  for (int pid :
       read_until(launch, std::regex(R"(blocking pid=(\d+))"), nproc - 1, &output)) {
    siblings.emplace_back(pid);
  }
  switchboard::TcpStoreOptions with_secret;
  with_secret.secret =
      std::make_shared<const switchboard::Secret>(switchboard::Secret::from_file(test_secret_file()));
  TcpStore("127.0.0.1", port, with_secret).set("go", std::string_view("1"));
  output += launch.read_all(kGuard);
  CHECK(launch.wait() == 1);
  for (const ProcessWatch& sibling : siblings) {
    INFO("sibling pid " << sibling.pid());
    CHECK(sibling.ended(std::chrono::milliseconds(0)));
  }
  CHECK(store_server.ended(std::chrono::milliseconds(0)));
  return output;
}

}  // namespace

TEST_CASE("every worker gets torchrun's environment and the same store port",
          "[launch]") {
  int nproc = GENERATE(1, 3);
  Finished run = run_launch({"--nproc", std::to_string(nproc)}, worker("print_env"));
  INFO(run.output);
  REQUIRE(run.status == 0);
  std::set<std::string> ports;
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> lines = rank_lines(run.output, rank);
    REQUIRE(lines.size() == 1);
    std::smatch match;
    std::regex expected(
        fmt::format("^RANK={0} LOCAL_RANK={0} WORLD_SIZE={1} LOCAL_WORLD_SIZE={1} "
                    "MASTER_ADDR=127\\.0\\.0\\.1 MASTER_PORT=(\\d+) "
                    "SWITCHBOARD_STORE=tcp://127\\.0\\.0\\.1:(\\d+)$",
                    rank, nproc));
    REQUIRE(std::regex_search(lines[0], match, expected));
    CHECK(std::stoi(match[1]) > 0);
    CHECK(match[1] == match[2]);
    ports.insert(match[1]);
  }
  CHECK(ports.size() == 1);
}

TEST_CASE("a job gets a secret of its own: its store serves only those who hold it, and the "
          "secret is gone after the job",
          "[launch][auth]") {
  Finished run = run_launch({"--nproc", "1"}, worker("secret_check"));
  INFO(run.output);
  REQUIRE(run.status == 0);
  const std::vector<std::string> lines = rank_lines(run.output, 0);
  REQUIRE(lines.size() == 3);
  std::smatch match;
  REQUIRE(std::regex_search(lines[0], match, std::regex("^secret file (/\\S+) mode 600$")));
  CHECK(lines[1] == "with the secret: served");
  CHECK(lines[2] == "without the secret: refused");
  CHECK_FALSE(std::filesystem::exists(match[1].str()));
}

TEST_CASE("--no-secret runs a job whose store anyone may use", "[launch][auth]") {
  Finished run = run_launch({"--nproc", "1", "--no-secret"}, worker("secret_check"));
  INFO(run.output);
  REQUIRE(run.status == 0);
  const std::vector<std::string> lines = rank_lines(run.output, 0);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "secret file <unset> mode 0");
  CHECK(lines[2] == "without the secret: served");
}

TEST_CASE("workers rendezvous through the launcher's store server", "[launch]") {
  Finished run = run_launch({"--nproc", "4"}, worker("rendezvous"));
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(rank_lines(run.output, 0) == std::vector<std::string>{"count=4"});
}

TEST_CASE("a failing rank stops the job, which names the rank and its exit status",
          "[launch]") {
  std::string output = run_failing_job(3, "exit3", "-");
  INFO(output);
  CHECK(std::regex_search(
      output, std::regex(R"(launch: rank 1 \(pid \d+\) exited with status 3)")));
  CHECK(output.find("stopping 2 running workers: SIGTERM (15) now, SIGKILL after 5 s") !=
        std::string::npos);
}

TEST_CASE("a rank killed by a signal is reported with the signal", "[launch]") {
  std::string output = run_failing_job(2, "sigkill", "-");
  INFO(output);
  CHECK(std::regex_search(
      output,
      std::regex(R"(launch: rank 1 \(pid \d+\) killed by signal SIGKILL \(9\))")));
}

TEST_CASE("workers that ignore SIGTERM are killed after --timeout-stop", "[launch]") {
  std::string output =
      run_failing_job(3, "exit3", "ignore-term", {"--timeout-stop", "0.2"});
  INFO(output);
  CHECK(output.find("exited with status 3") != std::string::npos);
  CHECK(output.find("2 workers still running after 0.2 s; sending SIGKILL") !=
        std::string::npos);
}

TEST_CASE("SIGINT, SIGTERM and SIGHUP reach every worker once; launch exits 128+signal",
          "[launch]") {
  int signo = GENERATE(SIGINT, SIGTERM, SIGHUP);
  Subprocess launch = start_launch({"--nproc", "3"}, worker("wait_for_signal"));
  std::string output;
  read_until(launch, std::regex(R"(waiting pid=(\d+))"), 3, &output);
  launch.kill(signo);
  output += launch.read_all(kGuard);
  INFO(output);
  CHECK(launch.wait() == 128 + signo);
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::string> lines = rank_lines(output, rank);
    CHECK(std::count(lines.begin(), lines.end(), fmt::format("got signal {}", signo)) ==
          1);
  }
}

TEST_CASE("a second signal while stopping kills every worker at once", "[launch]") {
  // The stop timeout is far longer than the guard: only the second signal
  // can end this job in time.
  Subprocess launch =
      start_launch({"--nproc", "2", "--timeout-stop", "3600"}, worker("ignore_sigterm"));
  std::string output;
  std::vector<ProcessWatch> workers;
  for (int pid : read_until(launch, std::regex(R"(waiting pid=(\d+))"), 2, &output)) {
    workers.emplace_back(pid);
  }
  launch.kill(SIGTERM);
  read_until(launch, std::regex(R"(launch: got SIGTERM \(1(5)\))"), 1, &output);
  launch.kill(SIGINT);
  output += launch.read_all(kGuard);
  INFO(output);
  CHECK(launch.wait() == 128 + SIGTERM);  // the first signal decides
  CHECK(output.find("launch: SIGINT (2) while stopping: killing everything now") !=
        std::string::npos);
  for (const ProcessWatch& worker : workers)
    CHECK(worker.ended(std::chrono::milliseconds(0)));
}

TEST_CASE("killing the launcher with SIGKILL leaves no orphans", "[launch]") {
  Subprocess launch = start_launch({"--nproc", "3"}, worker("sleep_forever"));
  std::string output;
  std::vector<ProcessWatch> children;
  children.emplace_back(read_until(launch, kStoreLine, 1, &output).at(0));
  for (int pid : read_until(launch, std::regex(R"(waiting pid=(\d+))"), 3, &output)) {
    children.emplace_back(pid);
  }
  launch.kill(SIGKILL);
  CHECK(launch.wait() == 128 + SIGKILL);
  for (const ProcessWatch& child : children) {
    INFO("pid " << child.pid() << "\n" << output);
    CHECK(child.ended(kGuard));  // PR_SET_PDEATHSIG: at once
  }
}

TEST_CASE("the store server dying stops the workers, restarts left or not", "[launch]") {
  using Args = std::vector<std::string>;
  const Args restarts = GENERATE(Args{}, Args{"--max-restarts", "2"});
  std::string dir = temp_dir();
  std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Prints a port, then exits 7 once a worker writes to the FIFO.
  std::string server = write_script(
      dir, fmt::format("#!/bin/sh\necho port=1\nread line < {}\nexit 7\n", fifo));
  Args flags = {"--nproc", "2", "--store-server", server};
  flags.insert(flags.end(), restarts.begin(), restarts.end());
  Finished run = run_launch(flags, worker("poke_fifo", {fifo}));
  INFO(run.output);
  CHECK(run.status == 1);
  CHECK(std::regex_search(
      run.output,
      std::regex(R"(launch: store server \(pid \d+\) exited with status 7; stopping)")));
  CHECK(run.output.find("restarting") == std::string::npos);
}

TEST_CASE("--master-addr and --master-port reach the store server and the workers",
          "[launch]") {
  // A fake store server that reports the port it is asked for, then waits
  // to be stopped.
  std::string server = write_script(
      temp_dir(),
      "#!/bin/sh\n"
      "while [ $# -gt 0 ]; do\n"
      "  case $1 in --host) echo \"host=$2\" >&2;; --port) port=$2;; esac; shift\n"
      "done\n"
      "echo port=$port\n"
      "exec sleep 1000\n");
  Finished run = run_launch({"--nproc", "2", "--store-server", server, "--master-addr",
                             "localhost", "--master-port=29517"},
                            worker("print_env"));
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("[store] host=localhost") != std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> lines = rank_lines(run.output, rank);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("MASTER_ADDR=localhost MASTER_PORT=29517 "
                        "SWITCHBOARD_STORE=tcp://localhost:29517") != std::string::npos);
  }
}

TEST_CASE("every output line is prefixed with its rank and none is lost", "[launch]") {
  constexpr int kLines = 5000;
  Finished run =
      run_launch({"--nproc", "3"}, worker("print_lines", {std::to_string(kLines)}));
  REQUIRE(run.status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::string> expected;
    for (int i = 0; i < kLines; ++i)
      expected.push_back(fmt::format("out {} {}", rank, i));
    expected.push_back(fmt::format("last {}", rank));
    std::vector<std::string> lines = rank_lines(run.output, rank);
    auto err = std::find(lines.begin(), lines.end(), fmt::format("err {}", rank));
    REQUIRE(err != lines.end());  // stderr: its own pipe, so anywhere
    lines.erase(err);
    CHECK(lines == expected);
  }
}

TEST_CASE("--no-prefix leaves worker output as written", "[launch]") {
  Finished run =
      run_launch({"--nproc", "2", "--no-prefix"}, worker("print_lines", {"2"}));
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(run.output.find("[rank") == std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(run.output.find(fmt::format("out {} 1\n", rank)) != std::string::npos);
    CHECK(run.output.find(fmt::format("last {}", rank)) != std::string::npos);
  }
}

TEST_CASE("a program that cannot be executed fails the job", "[launch]") {
  Finished run = run_launch({"--nproc", "2"}, {"/nonexistent/program"});
  INFO(run.output);
  CHECK(run.status == 1);
  CHECK(run.output.find("launch: rank 0 cannot execute '/nonexistent/program': No such "
                        "file or directory") != std::string::npos);
  CHECK(rank_lines(run.output, 1).empty());
}

TEST_CASE("a store server that cannot be executed fails the job", "[launch]") {
  Finished run = run_launch({"--nproc", "2", "--store-server", "/nonexistent/store"},
                            worker("print_env"));
  INFO(run.output);
  CHECK(run.status == 1);
  CHECK(run.output.find("cannot execute the store server '/nonexistent/store'") !=
        std::string::npos);
  CHECK(rank_lines(run.output, 0).empty());
}

TEST_CASE("usage errors exit 2 with the usage text", "[launch]") {
  using Args = std::vector<std::string>;
  Args flags =
      GENERATE(Args{}, Args{"--nproc"}, Args{"--nproc", "0"}, Args{"--nproc", "x"},
               Args{"--nproc", "2"}, Args{"--nproc", "2", "--"},
               Args{"--bogus", "--nproc", "2", "--", "true"},
               Args{"--nproc", "2", "--master-port", "70000", "--", "true"},
               Args{"--nproc", "2", "--timeout-stop", "-1", "--", "true"},
               Args{"--nproc", "2", "--master-addr=", "--", "true"});
  Finished run = run_launch(flags);
  INFO(run.output);
  CHECK(run.status == 2);
  CHECK(run.output.rfind("launch: ", 0) == 0);
  CHECK(run.output.find("usage: launch --nproc N") != std::string::npos);
}

TEST_CASE("--help prints the usage and exits 0", "[launch]") {
  Finished run = run_launch({"--help"});
  CHECK(run.status == 0);
  CHECK(run.output.rfind("usage: launch --nproc N", 0) == 0);
}

// ---- the restart policy (--max-restarts) -------------------------------------

TEST_CASE(
    "with --max-restarts 1, a rank killed in attempt 0 restarts the group, and attempt "
    "1 completes",
    "[launch][restart]") {
  Finished run = run_launch({"--nproc", "2", "--max-restarts", "1", "--job-id", "run7"},
                            worker("attempts", {"1", "sigkill", "1"}));
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK(std::regex_search(
      run.output,
      std::regex(R"(launch: rank 1 \(pid \d+\) killed by signal SIGKILL \(9\)\n)"
                 R"(launch: attempt 0 failed: rank 1 \(pid \d+\) killed by signal )"
                 R"(SIGKILL \(9\); restarting \(1 of 1\)\n)")));
  CHECK(std::regex_search(
      run.output,
      std::regex(R"(launch: attempt 1: started 2 workers \(pids \d+, \d+\))")));
  CHECK(run.output.find("launch: every worker exited 0 in attempt 1") !=
        std::string::npos);
  // Both attempts ran every rank, with torchrun's variables; only attempt 1
  // got to the results.
  CHECK(rank_lines(run.output, 0) ==
        std::vector<std::string>{"attempt 0 of max 1 run run7",
                                 "attempt 1 of max 1 run run7", "worker0 attempt 1: 41"});
  CHECK(rank_lines(run.output, 1) ==
        std::vector<std::string>{"attempt 0 of max 1 run run7",
                                 "attempt 1 of max 1 run run7", "worker1 attempt 1: 40"});
}

TEST_CASE(
    "with --max-restarts 0 (the default), a rank killed in attempt 0 fails the job, "
    "naming it",
    "[launch][restart]") {
  using Args = std::vector<std::string>;
  const Args restarts = GENERATE(Args{}, Args{"--max-restarts", "0"});
  Args flags = {"--nproc", "2"};
  flags.insert(flags.end(), restarts.begin(), restarts.end());
  Finished run = run_launch(flags, worker("attempts", {"1", "sigkill", "1"}));
  INFO(run.output);
  CHECK(run.status == 1);
  CHECK(std::regex_search(
      run.output,
      std::regex(R"(launch: rank 1 \(pid \d+\) killed by signal SIGKILL \(9\))")));
  CHECK(run.output.find("restarting") == std::string::npos);
  CHECK(rank_lines(run.output, 0) ==
        std::vector<std::string>{"attempt 0 of max 0 run job"});
  CHECK(rank_lines(run.output, 1) ==
        std::vector<std::string>{"attempt 0 of max 0 run job"});
}

TEST_CASE(
    "a rank that fails in every attempt fails the job after the last restart, naming "
    "the attempt",
    "[launch][restart]") {
  Finished run = run_launch({"--nproc", "2", "--max-restarts", "2"},
                            worker("attempts", {"1", "exit3", "1000"}));
  INFO(run.output);
  CHECK(run.status == 1);
  for (int attempt = 0; attempt < 2; ++attempt) {
    CHECK(std::regex_search(
        run.output, std::regex(fmt::format(
                        R"(launch: attempt {} failed: rank 1 \(pid \d+\) exited with )"
                        R"(status 3; restarting \({} of 2\))",
                        attempt, attempt + 1))));
  }
  CHECK(std::regex_search(
      run.output,
      std::regex(R"(launch: attempt 2 failed: rank 1 \(pid \d+\) exited with )"
                 R"(status 3; no restarts left \(--max-restarts 2\))")));
  CHECK(run.output.find("restarting (3 of") == std::string::npos);
  CHECK(rank_lines(run.output, 0) ==
        std::vector<std::string>{"attempt 0 of max 2 run job",
                                 "attempt 1 of max 2 run job",
                                 "attempt 2 of max 2 run job"});
}

TEST_CASE("a signal to the launcher ends the job even with restarts left",
          "[launch][restart]") {
  Subprocess launch =
      start_launch({"--nproc", "2", "--max-restarts", "3"}, worker("sleep_forever"));
  std::string output;
  read_until(launch, std::regex(R"(waiting pid=(\d+))"), 2, &output);
  launch.kill(SIGTERM);
  output += launch.read_all(kGuard);
  INFO(output);
  CHECK(launch.wait() == 128 + SIGTERM);
  CHECK(output.find("restarting") == std::string::npos);
  CHECK(output.find("attempt 1") == std::string::npos);
}
