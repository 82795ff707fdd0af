// LineRelay: copies a child's output pipe to one of our descriptors a line at
// a time, with a prefix before each line ("[rank 3] "), so lines of
// different workers never mix mid-line.
//
// Every byte the child writes is passed on: a last line without a newline
// gets one at EOF, and a line longer than kMaxLine bytes is cut into lines of
// that size. When the sink fails (EPIPE: our reader went away) the relay
// keeps reading and drops the output, so the child never blocks on a full
// pipe.
//
// Thread safety: none; the launcher's single thread owns its relays.
#pragma once

#include <cstddef>
#include <string>

namespace switchboard::launch {

class LineRelay {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  // Takes ownership of `source` (the read end of a pipe); `sink` stays the
  // caller's and must outlive the relay. `pending` is output already read
  // from `source` (the start of a line).
  LineRelay(int source, int sink, std::string prefix, std::string pending = {});
  LineRelay(LineRelay&& other) noexcept;
  LineRelay& operator=(LineRelay&&) = delete;
  // Calls finish().
  ~LineRelay();

  // The descriptor to poll() for input; -1 once finished.
  int source() const { return source_; }
  bool open() const { return source_ >= 0; }

  // Reads once from the source (call it when poll() reports it readable or
  // hung up) and writes the complete lines read so far. At EOF it calls
  // finish().
  void read_some();

  // Writes the partial last line, if any, with a newline and closes the
  // source. Idempotent.
  void finish();

 private:
  // Writes the complete lines at the start of pending_ (all of it when
  // `flush_partial`), each with the prefix, in one write.
  void write_lines(bool flush_partial);
  void write_all(const std::string& bytes);

  int source_ = -1;
  int sink_ = -1;
  bool sink_failed_ = false;
  std::string prefix_;
  std::string pending_;  // read, not yet written: no complete line
};

}  // namespace switchboard::launch
