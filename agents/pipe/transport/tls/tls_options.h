// PipeTlsOptions: the files of mutual TLS for every PIPE connection
// (docs/security.md), as the TLS transport reads them (tls_context.h).
// Plain values; the agent's settings (agents/pipe/options.h) hold one.
#pragma once

#include <cstdlib>
#include <string>

namespace switchboard::agents::pipe::transport {

// Mutual TLS for every PIPE connection (docs/security.md): this worker's
// certificate chain and private key, and the CA whose certificates it
// accepts from its peers, as PEM files. All three or none; the key file
// must be readable by its owner only. Every peer must present a
// certificate signed by the CA (host names are not checked: the CA is
// the job's).
struct PipeTlsOptions {
  // The variables a worker reads when its options name no files.
  static constexpr const char* kCertVariable = "SWITCHBOARD_TLS_CERT_FILE";
  static constexpr const char* kKeyVariable = "SWITCHBOARD_TLS_KEY_FILE";
  static constexpr const char* kCaVariable = "SWITCHBOARD_TLS_CA_FILE";

  std::string cert_file;
  std::string key_file;
  std::string ca_file;

  // Whether any file is named (then all three must be).
  bool enabled() const {
    return !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
  // The files the three variables name (empty where unset).
  static PipeTlsOptions from_environment() {
    auto read = [](const char* name) {
      const char* value = std::getenv(name);
      return std::string(value ? value : "");
    };
    return {read(kCertVariable), read(kKeyVariable), read(kCaVariable)};
  }
};

}  // namespace switchboard::agents::pipe::transport
