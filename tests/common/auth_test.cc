// The job secret: reading it from a file (and refusing files others can
// read, or too short), the environment variable, and the proofs.
#include "common/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

using switchboard::Mac;
using switchboard::Nonce;
using switchboard::Secret;

// A file in the test's temporary directory with `content` and `mode`.
class TempFile {
 public:
  TempFile(const std::string& content, mode_t mode) {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/secret-XXXXXX";
    const int fd = ::mkstemp(path_.data());
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, content.data(), content.size()) ==
            static_cast<ssize_t>(content.size()));
    ::close(fd);
    REQUIRE(::chmod(path_.c_str(), mode) == 0);
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "none";
}

}  // namespace

TEST_CASE("a secret file readable by its owner only is read, one trailing newline dropped",
          "[auth]") {
  TempFile file("0123456789abcdef0123\n", 0600);
  const Secret a = Secret::from_file(file.path());
  const Secret b(std::vector<uint8_t>{'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a',
                                      'b', 'c', 'd', 'e', 'f', '0', '1', '2', '3'});
  const Nonce n{};
  CHECK(a.mac({n}) == b.mac({n}));
}

TEST_CASE("a secret file that others may read, or that is too short, is refused naming it",
          "[auth]") {
  TempFile open_file("0123456789abcdef0123", 0644);
  const std::string open_error = error_of([&] { Secret::from_file(open_file.path()); });
  CHECK_THAT(open_error, Catch::Contains(open_file.path()));
  CHECK_THAT(open_error, Catch::Contains("mode 644"));
  CHECK_THAT(open_error, Catch::Contains("chmod 600"));
  TempFile group_file("0123456789abcdef0123", 0640);
  CHECK_THAT(error_of([&] { Secret::from_file(group_file.path()); }),
             Catch::Contains("mode 640"));
  TempFile short_file("short\n", 0600);
  const std::string short_error = error_of([&] { Secret::from_file(short_file.path()); });
  CHECK_THAT(short_error, Catch::Contains("holds 5 byte(s)"));
  CHECK_THAT(error_of([&] { Secret::from_file("/nonexistent/secret"); }),
             Catch::Contains("\"/nonexistent/secret\""));
}

TEST_CASE("SWITCHBOARD_SECRET_FILE names the job's secret; unset, there is none", "[auth]") {
  ::unsetenv("SWITCHBOARD_SECRET_FILE");
  CHECK(Secret::from_environment() == nullptr);
  TempFile file("0123456789abcdef0123", 0600);
  ::setenv("SWITCHBOARD_SECRET_FILE", file.path().c_str(), 1);
  CHECK(Secret::from_environment() != nullptr);
  TempFile open_file("0123456789abcdef0123", 0604);
  ::setenv("SWITCHBOARD_SECRET_FILE", open_file.path().c_str(), 1);
  CHECK_THAT(error_of([] { Secret::from_environment(); }),
             Catch::StartsWith("SWITCHBOARD_SECRET_FILE: secret file"));
  ::unsetenv("SWITCHBOARD_SECRET_FILE");
}

TEST_CASE("a random secret written to a file is private and reads back the same", "[auth]") {
  const Secret secret = Secret::random();
  TempFile file("placeholder", 0644);  // an existing file with a wider mode
  secret.write_file(file.path());
  struct stat info {};
  REQUIRE(::stat(file.path().c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  const Secret back = Secret::from_file(file.path());
  const Nonce n{};
  CHECK(back.mac({n}) == secret.mac({n}));
  CHECK(Secret::random().mac({n}) != secret.mac({n}));
}

TEST_CASE("a proof verifies only with the same secret and the same parts", "[auth]") {
  const Secret a(std::vector<uint8_t>(32, 1));
  const Secret b(std::vector<uint8_t>(32, 2));
  const Nonce x = switchboard::random_nonce();
  const Nonce y = switchboard::random_nonce();
  CHECK(x != y);
  const Mac proof = a.mac({switchboard::bytes_of("label"), x, y});
  CHECK(a.verify(proof, {switchboard::bytes_of("label"), x, y}));
  CHECK_FALSE(b.verify(proof, {switchboard::bytes_of("label"), x, y}));
  CHECK_FALSE(a.verify(proof, {switchboard::bytes_of("label"), y, x}));
  CHECK_FALSE(a.verify(proof, {switchboard::bytes_of("other"), x, y}));
  CHECK_THROWS_AS(Secret(std::vector<uint8_t>(15, 1)), std::invalid_argument);
}
