// CertificateAuthority: a job's own certificate authority, made on the spot,
// and the certificates it signs, written as PEM files into a directory: what
// PIPE's mutual TLS needs (docs/security.md), without the openssl command.
// P-256 keys, SHA-256 signatures; the CA's certificate is marked as a CA,
// the others carry both the server and the client purpose (a PIPE worker is
// both). Used by `certs` (tools/certs/main.cc), the benchmarks and the tests.
//
// Files: <dir>/ca.pem and <dir>/ca.key (the CA), <dir>/<name>.pem and
// <dir>/<name>.key per certificate; keys are written with mode 0600.
//
// Errors: std::runtime_error naming the OpenSSL step or the file that
// failed. Thread safety: one thread per object.
#pragma once

#include <memory>
#include <string>

namespace switchboard::certs {

struct CertificateFiles {
  std::string cert_file;  // PEM certificate
  std::string key_file;   // PEM private key, mode 0600
};

class CertificateAuthority {
 public:
  // A new self-signed CA named `name`, valid for `days` days, written to
  // the existing directory `dir`.
  CertificateAuthority(std::string dir, const std::string& name, int days = 365);
  ~CertificateAuthority();
  CertificateAuthority(const CertificateAuthority&) = delete;
  CertificateAuthority& operator=(const CertificateAuthority&) = delete;

  // Whether `name` may name a certificate (see issue()).
  static bool plain_name(const std::string& name);

  // The CA's certificate: every worker's CA file.
  const std::string& ca_file() const { return ca_file_; }

  // A certificate for `common_name` signed by this CA, valid from now for
  // `days` days; with `expired`, one whose validity ended yesterday (for
  // tests). `common_name` becomes the files' name: letters, digits, '-',
  // '_' and '.' only (std::invalid_argument otherwise).
  CertificateFiles issue(const std::string& common_name, int days = 365, bool expired = false);

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string dir_;
  std::string ca_file_;
};

}  // namespace switchboard::certs
