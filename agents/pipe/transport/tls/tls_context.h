// The OpenSSL context of the TLS transport (tls/tls_connection.h), built
// from a worker's PipeTlsOptions, and the words for a handshake that
// failed. Internal to the PIPE agent; includes Asio's ssl headers, so only
// the transports' sources include it.
//
// The context asks every peer for a certificate signed by the CA, on both
// sides (mutual TLS), and speaks TLS 1.2 or newer.
//
// Errors: make_tls_context throws std::invalid_argument naming the agent,
// the file and OpenSSL's reason (a file missing, not PEM, a key that does
// not match the certificate, a key file others may read).
// Thread safety: a context is shared by every connection of a transport;
// OpenSSL allows that once it is built.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <boost/system/error_code.hpp>
#include <memory>
#include <string>

#include "agents/pipe/transport/tls/tls_options.h"

namespace switchboard::agents::pipe::transport {

std::shared_ptr<boost::asio::ssl::context> make_tls_context(
    const PipeTlsOptions& files, const std::string& agent_name);

// Why a handshake on `ssl` failed with `error`: Asio's words, and the
// certificate check's result when that is what failed.
std::string tls_failure_reason(const boost::system::error_code& error, SSL* ssl);

}  // namespace switchboard::agents::pipe::transport
