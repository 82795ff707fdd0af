// Which host, and network, IPC and PID namespaces this process runs in, as
// one string: two workers whose keys are equal may share memory (the
// same-host lane's rings, CUDA IPC). Workers in two network namespaces of
// one kernel are two hosts to the group: a link between them can be cut,
// and a shared-memory path would hide it.
// Thread safety: computed once; thread-safe.
#pragma once

#include <string>

namespace switchboard {

const std::string& host_key();

}  // namespace switchboard
