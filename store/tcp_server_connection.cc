#include "store/tcp_server_connection.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <utility>

namespace switchboard::tcpstore {
namespace {

// A client that sends requests without reading replies stops being read
// while this much output is queued for it.
constexpr size_t kMaxQueuedOutput = 16 * 1024 * 1024;
// An empty output buffer larger than this is released rather than kept.
constexpr size_t kKeepOutputCapacity = 1024 * 1024;

}  // namespace

std::string endpoint_name(const boost::asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  if (address.is_v6()) {
    const auto v6 = address.to_v6();
    if (v6.is_v4_mapped()) {
      return fmt::format("{}:{}", boost::asio::ip::make_address_v4(
                                      boost::asio::ip::v4_mapped, v6).to_string(),
                         endpoint.port());
    }
    return fmt::format("[{}]:{}", v6.to_string(), endpoint.port());
  }
  return fmt::format("{}:{}", address.to_string(), endpoint.port());
}

Connection::Connection(ServerContext& context, boost::asio::ip::tcp::socket socket,
                       ClientId id)
    : context_(context),
      socket_(std::move(socket)),
      id_(id),
      stream_(context.limits),
      authenticated_(context.secret == nullptr),
      handshake_timer_(socket_.get_executor()) {
  boost::system::error_code error;
  auto endpoint = socket_.remote_endpoint(error);
  peer_name_ = error ? std::string("unknown peer") : endpoint_name(endpoint);
}

void Connection::start() {
  context_.connections.emplace(id_, shared_from_this());
  context_.state.add_client(id_, this);
  size_t open = ++context_.num_connections;
  ++context_.total_connections;
  if (context_.log_connections) {
    spdlog::info("store server: connection from {} opened ({} open)", peer_name_, open);
  }
  if (!authenticated_) {
    handshake_timer_.expires_after(context_.handshake_timeout);
    handshake_timer_.async_wait(
        [self = shared_from_this()](const boost::system::error_code& error) {
          if (error || self->authenticated_ || self->closed_) return;
          self->refuse(fmt::format("it did not authenticate within {} ms",
                                   self->context_.handshake_timeout.count()));
        });
  }
  read();
}

bool Connection::authenticate() {
  if (authenticated_) return true;
  if (draining_ || closed_) return false;
  const Secret& secret = *context_.secret;
  if (!challenged_) {
    constexpr size_t kHello = sizeof(kAuthMagic) + kAuthNonceBytes;
    // Judge the first bytes as soon as they can be: a client that sends a
    // request instead of the magic is refused without waiting for more.
    const size_t seen = std::min(stream_.buffered(), sizeof(kAuthMagic));
    if (std::memcmp(stream_.data(), kAuthMagic, seen) != 0) {
      refuse("its first bytes are not an authentication request (this server requires the "
             "job secret; a client without it, or a PyTorch client, cannot use it)");
      return false;
    }
    if (stream_.buffered() < kHello) return false;
    std::memcpy(client_nonce_.data(), stream_.data() + sizeof(kAuthMagic), kAuthNonceBytes);
    stream_.consume(kHello);
    server_nonce_ = random_nonce();
    const Mac proof = secret.mac({bytes_of(kAuthServerLabel), client_nonce_, server_nonce_});
    output_.insert(output_.end(), server_nonce_.begin(), server_nonce_.end());
    output_.insert(output_.end(), proof.begin(), proof.end());
    challenged_ = true;
  }
  if (stream_.buffered() < kAuthMacBytes) return false;
  const bool valid =
      secret.verify({stream_.data(), kAuthMacBytes},
                    {bytes_of(kAuthClientLabel), server_nonce_, client_nonce_});
  stream_.consume(kAuthMacBytes);
  if (!valid) {
    output_.push_back(kAuthRefused);
    refuse("its proof does not match this server's secret");
    return false;
  }
  output_.push_back(kAuthAccepted);
  authenticated_ = true;
  handshake_timer_.cancel();
  return true;
}

// A client that did not prove the secret: logged with its address, counted,
// and closed once what is queued for it (a refusal) has gone out.
void Connection::refuse(const std::string& reason) {
  ++context_.auth_failures;
  spdlog::warn("store server: refused the connection from {}: {}", peer_name_, reason);
  close_after_output("not authenticated");
}

void Connection::read() {
  reading_ = true;
  uint8_t* space = stream_.prepare();
  socket_.async_read_some(
      boost::asio::buffer(space, stream_.free_space()),
      [self = shared_from_this()](const boost::system::error_code& error, size_t size) {
        self->on_read(error, size);
      });
}

void Connection::on_read(const boost::system::error_code& error, size_t size) {
  reading_ = false;
  if (closed_) return;
  if (error == boost::asio::error::eof) return on_end_of_stream();
  if (error) return close(fmt::format("read failed: {}", error.message()));
  stream_.commit(size);
  process();
  if (closed_ || draining_) return;
  if (output_.size() + sending_.size() < kMaxQueuedOutput) read();
}

// Applies every complete request buffered, in order, then sends the replies
// of the whole batch with one write.
void Connection::process() {
  processing_ = true;
  if (!authenticate()) {
    processing_ = false;
    write();
    return;
  }
  for (;;) {
    ParseStatus status = stream_.next(&request_, &error_);
    if (status == ParseStatus::kNeedMore) break;
    if (status == ParseStatus::kError || !context_.state.apply(id_, request_, &error_)) {
      processing_ = false;
      context_.num_keys.store(context_.state.num_keys(), std::memory_order_relaxed);
      return fail(error_);
    }
  }
  processing_ = false;
  context_.num_keys.store(context_.state.num_keys(), std::memory_order_relaxed);
  write();
}

void Connection::on_end_of_stream() {
  if (!authenticated_) {
    return refuse(fmt::format("it closed the connection during the handshake ({} byte(s) "
                              "sent)",
                              stream_.buffered()));
  }
  if (stream_.buffered() == 0) return close_after_output("closed by peer");
  fail(fmt::format("connection closed inside a request ({} bytes of at least {})",
                   stream_.buffered(), stream_.needed()));
}

// Bad input: there is no error reply in this protocol, so the connection
// closes, as torch's server closes it.
void Connection::fail(const std::string& reason) {
  ++context_.protocol_errors;
  spdlog::warn("store server: closing connection from {}: {}", peer_name_, reason);
  close_after_output("protocol error");
}

void Connection::close_after_output(const std::string& why) {
  // Unregister now: nothing more is owed to a closing connection.
  context_.state.remove_client(id_);
  draining_ = true;
  drain_reason_ = why;
  if (!writing_ && output_.empty()) return close(why);
  write();
}

void Connection::close(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  auto self = shared_from_this();  // erasing from `connections` must not free us
  context_.state.remove_client(id_);
  handshake_timer_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  context_.connections.erase(id_);
  size_t open = --context_.num_connections;
  if (context_.log_connections) {
    spdlog::info("store server: connection from {} closed: {} ({} open)", peer_name_,
                 why, open);
  }
}

void Connection::flush() {
  // Inside process() the whole batch is written at its end.
  if (!processing_) write();
}

void Connection::write() {
  if (writing_ || closed_ || output_.empty()) return;
  std::swap(output_, sending_);
  writing_ = true;
  boost::asio::async_write(
      socket_, boost::asio::buffer(sending_),
      [self = shared_from_this()](const boost::system::error_code& error, size_t) {
        self->on_write(error);
      });
}

void Connection::on_write(const boost::system::error_code& error) {
  writing_ = false;
  if (closed_) return;
  if (error) return close(fmt::format("write failed: {}", error.message()));
  sending_.clear();
  if (sending_.capacity() > kKeepOutputCapacity) Bytes().swap(sending_);
  if (!output_.empty()) return write();
  if (draining_) return close(drain_reason_);
  if (!reading_) read();  // reading paused while the output was large
}

}  // namespace switchboard::tcpstore
