#include "agents/pipe/transport/tls/tls_context.h"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace switchboard::agents::pipe::transport {

namespace ssl = boost::asio::ssl;

namespace {

// Throws when `path` cannot be read; `what` names the file's role.
void require_readable(const std::string& agent, const char* what, const std::string& path,
                      bool owner_only) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw std::invalid_argument(fmt::format("PIPE agent \"{}\": TLS {} file \"{}\": {}",
                                            agent, what, path, std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    throw std::invalid_argument(
        fmt::format("PIPE agent \"{}\": TLS {} file \"{}\" is not a regular file", agent,
                    what, path));
  }
  if (owner_only && (info.st_mode & 077) != 0) {
    throw std::invalid_argument(
        fmt::format("PIPE agent \"{}\": TLS {} file \"{}\" has mode {:03o}: others than "
                    "its owner may "
                    "read or change it; run chmod 600 on it",
                    agent, what, path, info.st_mode & 0777));
  }
}

}  // namespace

std::shared_ptr<ssl::context> make_tls_context(const PipeTlsOptions& files,
                                               const std::string& agent_name) {
  std::string missing;
  for (auto [name, value] : {std::pair{PipeTlsOptions::kCertVariable, &files.cert_file},
                             std::pair{PipeTlsOptions::kKeyVariable, &files.key_file},
                             std::pair{PipeTlsOptions::kCaVariable, &files.ca_file}}) {
    if (value->empty()) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
  }
  if (!missing.empty()) {
    throw std::invalid_argument(
        fmt::format("PIPE agent \"{}\": TLS needs a certificate, a key and a CA file; "
                    "missing: {} (or "
                    "the option of that name)",
                    agent_name, missing));
  }
  require_readable(agent_name, "certificate", files.cert_file, false);
  require_readable(agent_name, "key", files.key_file, true);
  require_readable(agent_name, "CA", files.ca_file, false);

  auto context = std::make_shared<ssl::context>(ssl::context::tls);
  // TLS 1.2, and not 1.3: in 1.3 the client's handshake ends before the
  // server has checked the client's certificate, so a joiner whose
  // certificate is refused would learn it only from a later read, as if
  // the member had gone away. In 1.2 both sides know at the handshake.
  // Forward-secret AEAD suites only.
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_cipher_list(native, "ECDHE+AESGCM:ECDHE+CHACHA20");
  auto load = [&](const char* what, const std::string& path, auto&& step) {
    boost::system::error_code error;
    step(error);
    if (error) {
      const bool mismatch = error.message().find("mismatch") != std::string::npos;
      throw std::invalid_argument(fmt::format(
          "PIPE agent \"{}\": TLS {} file \"{}\": {}{}", agent_name, what, path,
          error.message(),
          mismatch ? fmt::format(" (it does not match the certificate in \"{}\")",
                                 files.cert_file)
                   : ""));
    }
  };
  load("certificate", files.cert_file, [&](boost::system::error_code& e) {
    context->use_certificate_chain_file(files.cert_file, e);
  });
  load("key", files.key_file, [&](boost::system::error_code& e) {
    context->use_private_key_file(files.key_file, ssl::context::pem, e);
  });
  if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
    ERR_clear_error();
    throw std::invalid_argument(fmt::format(
        "PIPE agent \"{}\": TLS key file \"{}\" does not match the certificate in \"{}\"",
        agent_name, files.key_file, files.cert_file));
  }
  load("CA", files.ca_file, [&](boost::system::error_code& e) {
    context->load_verify_file(files.ca_file, e);
  });
  context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  return context;
}

std::string tls_failure_reason(const boost::system::error_code& error, SSL* ssl) {
  std::string reason = error.message();
  if (ssl != nullptr) {
    const long verified = SSL_get_verify_result(ssl);
    if (verified != X509_V_OK) {
      reason += fmt::format(" (the peer's certificate: {})",
                            X509_verify_cert_error_string(verified));
    }
  }
  return reason;
}

}  // namespace switchboard::agents::pipe::transport
