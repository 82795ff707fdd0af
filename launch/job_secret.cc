#include "launch/job_secret.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace switchboard::launch {

JobSecret::JobSecret(const LaunchOptions& options, bool make_one) {
  if (options.no_secret) return;
  if (!options.secret_file.empty()) {
    secret_ = std::make_shared<const Secret>(Secret::from_file(options.secret_file));
    path_ = std::filesystem::absolute(options.secret_file).string();
    return;
  }
  if ((secret_ = Secret::from_environment())) {
    path_ = std::getenv(Secret::kEnvironmentVariable);
    return;
  }
  if (!make_one) return;  // another store server, with its own secret or none
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = fmt::format("{}/switchboard-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(dir.data()) == nullptr) {
    throw std::runtime_error(fmt::format("cannot make a folder for the job secret in {}: {}",
                                         dir, std::strerror(errno)));
  }
  made_in_ = dir;
  path_ = dir + "/secret";
  const Secret made = Secret::random();
  made.write_file(path_);
  secret_ = std::make_shared<const Secret>(made);
}

JobSecret::~JobSecret() {
  if (made_in_.empty()) return;
  ::unlink(path_.c_str());
  ::rmdir(made_in_.c_str());
}

std::string JobSecret::variable() const {
  if (path_.empty()) return Secret::kEnvironmentVariable;  // removed
  return fmt::format("{}={}", Secret::kEnvironmentVariable, path_);
}

}  // namespace switchboard::launch
