#include "agents/pipe/transport/tcp/tcp_transport.h"

#include <utility>
#include <vector>

#include "agents/pipe/transport/stream_transport.h"
#include "agents/pipe/transport/tcp/tcp_connection.h"
#include "common/mutex.h"

namespace switchboard::agents::pipe::transport {

namespace {

using boost::asio::ip::tcp;

class TcpTransport final : public StreamTransport {
 public:
  TcpTransport(ConnectionEvents& events, TransportOptions options)
      : StreamTransport(events, std::move(options)) {}
  ~TcpTransport() override { stop_io(); }

  std::string_view name() const override { return "tcp"; }

 private:
  std::shared_ptr<Connection> connected(tcp::socket socket,
                                        std::chrono::milliseconds) override {
    return make_connection(std::move(socket));
  }

  void accepted(tcp::socket socket) override {
    hand_over(make_connection(std::move(socket)));
  }

  // The same-host lane's threads report to the events too, and a
  // connection may outlive this transport (a reference held elsewhere):
  // they are done before the events may go.
  void joined() override {
    std::vector<std::weak_ptr<TcpConnection>> made;
    {
      MutexLock lock(made_mu_);
      made.swap(made_);
    }
    for (const auto& weak : made) {
      if (std::shared_ptr<TcpConnection> connection = weak.lock())
        connection->join_lane();
    }
  }

  std::shared_ptr<TcpConnection> make_connection(tcp::socket socket) {
    auto connection = std::make_shared<TcpConnection>(
        events_, std::move(socket), options_.limits, options_.allocate, options_.progress,
        options_.lane_capacity);
    if (options_.lane_capacity > 0) {
      MutexLock lock(made_mu_);
      std::erase_if(made_,
                    [](const std::weak_ptr<TcpConnection>& w) { return w.expired(); });
      made_.push_back(connection);
    }
    return connection;
  }

  // Every connection with a lane this transport made, for joined().
  Mutex made_mu_;
  std::vector<std::weak_ptr<TcpConnection>> made_ SB_GUARDED_BY(made_mu_);
};

}  // namespace

std::unique_ptr<PipeTransport> make_tcp_transport(ConnectionEvents& events,
                                                  TransportOptions options) {
  return std::make_unique<TcpTransport>(events, std::move(options));
}

}  // namespace switchboard::agents::pipe::transport
