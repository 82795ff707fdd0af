// TestCa: a CertificateAuthority (common/certificate_authority.h) in a
// fresh directory under TEST_TMPDIR (else /tmp), removed with it: what TLS
// tests need. Certificates are valid for a day. One thread per TestCa.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/certificate_authority.h"

namespace sbtest {

using TlsFiles = switchboard::certs::CertificateFiles;

class TestCa {
 public:
  explicit TestCa(const std::string& name) : directory_(make_directory()), ca_(directory_, name, 1) {}
  ~TestCa() {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }

  const std::string& ca_file() const { return ca_.ca_file(); }
  const std::string& directory() const { return directory_; }
  // A certificate for `name`, valid for a day, or one that expired yesterday.
  TlsFiles issue(const std::string& name, bool expired = false) {
    return ca_.issue(name, 1, expired);
  }

 private:
  static std::string make_directory() {
    const char* root = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(root && *root ? root : "/tmp") + "/tls-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    return pattern;
  }

  std::string directory_;
  switchboard::certs::CertificateAuthority ca_;
};

}  // namespace sbtest
