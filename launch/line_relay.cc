#include "launch/line_relay.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace switchboard::launch {

LineRelay::LineRelay(int source, int sink, std::string prefix, std::string pending)
    : source_(source),
      sink_(sink),
      prefix_(std::move(prefix)),
      pending_(std::move(pending)) {
  write_lines(false);
}

LineRelay::LineRelay(LineRelay&& other) noexcept
    : source_(std::exchange(other.source_, -1)),
      sink_(other.sink_),
      sink_failed_(other.sink_failed_),
      prefix_(std::move(other.prefix_)),
      pending_(std::move(other.pending_)) {}

LineRelay::~LineRelay() { finish(); }

void LineRelay::read_some() {
  if (source_ < 0) return;
  char chunk[16 * 1024];
  ssize_t n = ::read(source_, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    finish();
    return;
  }
  pending_.append(chunk, static_cast<size_t>(n));
  write_lines(false);
}

void LineRelay::finish() {
  if (source_ < 0) return;
  write_lines(true);
  ::close(source_);
  source_ = -1;
}

void LineRelay::write_lines(bool flush_partial) {
  std::string out;
  size_t start = 0;
  while (start < pending_.size()) {
    size_t newline = pending_.find('\n', start);
    size_t end;  // the line is [start, end)
    size_t next;
    if (newline != std::string::npos && newline - start <= kMaxLine) {
      end = newline;
      next = newline + 1;
    } else if (pending_.size() - start > kMaxLine) {
      end = next = start + kMaxLine;  // cut an overlong line
    } else if (flush_partial) {
      end = next = pending_.size();
    } else {
      break;  // wait for the rest of the line
    }
    out.append(prefix_).append(pending_, start, end - start).push_back('\n');
    start = next;
  }
  pending_.erase(0, start);
  write_all(out);
}

void LineRelay::write_all(const std::string& bytes) {
  size_t done = 0;
  while (!sink_failed_ && done < bytes.size()) {
    ssize_t n = ::write(sink_, bytes.data() + done, bytes.size() - done);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN) {  // a non-blocking sink: wait until it drains
      pollfd writable{sink_, POLLOUT, 0};
      ::poll(&writable, 1, -1);
    } else if (errno != EINTR) {
      sink_failed_ = true;  // EPIPE and the like: drop the output from now on
    }
  }
}

}  // namespace switchboard::launch
