// The FileStore fixture for the Store conformance suite and FileStore's own
// tests: a fresh file per fixture, shared by every handle open() returns.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "store/file_store.h"
#include "store/store.h"

namespace sbtest {

// Creates an empty file with a unique name under $TEST_TMPDIR (or /tmp) and
// returns its path. The caller owns the file.
inline std::string make_temp_file(const std::string& stem = "file_store") {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + stem + "_XXXXXX";
  int fd = ::mkstemp(path.data());
  if (fd < 0) throw std::runtime_error("mkstemp failed for " + path);
  ::close(fd);
  return path;
}

// Holds one FileStore open for the fixture's whole life, so the file (and
// its keys) outlive the handles a test opens and closes; the file is removed
// when the fixture and the last handle are gone.
struct FileStoreFixture {
  static constexpr const char* kName = "FileStore";
  std::string path = make_temp_file();
  std::shared_ptr<switchboard::FileStore> holder =
      std::make_shared<switchboard::FileStore>(path);

  // A new FileStore on the same file, as another process would open it.
  std::shared_ptr<switchboard::Store> open() {
    return std::make_shared<switchboard::FileStore>(path);
  }
};

}  // namespace sbtest
