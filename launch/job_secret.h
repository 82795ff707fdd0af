// JobSecret: the secret of one launched job (docs/security.md) and the file
// its store server and workers read it from: --secret-file, else
// SWITCHBOARD_SECRET_FILE, else, when this launcher runs the job's store
// server on one node, a random secret written for this job into a folder
// only this user can enter (removed with the JobSecret); none with
// --no-secret or otherwise.
//
// Errors: std::invalid_argument for a secret file that is refused (its
// mode, its size); std::runtime_error when the folder cannot be made.
// Not thread-safe; the launcher owns one.
#pragma once

#include <memory>
#include <string>

#include "common/auth.h"
#include "launch/options.h"

namespace switchboard::launch {

class JobSecret {
 public:
  // `make_one`: this launcher runs the job's store server on a single node.
  JobSecret(const LaunchOptions& options, bool make_one);
  ~JobSecret();
  JobSecret(const JobSecret&) = delete;
  JobSecret& operator=(const JobSecret&) = delete;

  // Null without a secret.
  const std::shared_ptr<const Secret>& secret() const { return secret_; }
  // "SWITCHBOARD_SECRET_FILE=<path>" for a child's environment, or the bare
  // name (launch/spawn.h: removes the variable) without a secret.
  std::string variable() const;

 private:
  std::shared_ptr<const Secret> secret_;
  std::string path_;
  std::string made_in_;  // the folder of a secret made for this job
};

}  // namespace switchboard::launch
