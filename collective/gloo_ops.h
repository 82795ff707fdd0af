// Pieces every op of GlooProcessGroup uses: the element type Gloo's
// templates are given, the translation of Gloo's exceptions into ours (and
// the peers' addresses it names ranks by), and the op that carries no
// bytes. Internal to //collective:gloo.
// Pure functions, or run on the calling op's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "store/store.h"

namespace gloo::rendezvous {
class Context;
}

namespace switchboard::collective {

// Picks a same-size integer type so Gloo's templates compute the element
// size; the bytes are never interpreted as that type (reductions run our
// own kernels).
template <typename F>
auto with_element_type(DType dtype, F&& f) {
  switch (dtype_size(dtype)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

// Turns Gloo's exceptions into ours, naming the op, group, rank (in
// `where`) and the timeout; leaves our own errors alone. `peers[r]` is the
// address Gloo names rank r by in its errors (empty: unknown): a failed
// connection whose peer is one of them names that rank. Gloo names the
// other end of a connection this rank accepted by its ephemeral port, which
// matches no address; then `only_peer` (>= 0: the one rank the op talks
// to, as a send's or recv's peer, or the other rank of a group of two) is
// the rank named.
std::exception_ptr translate_gloo_error(const std::string& where,
                                        std::chrono::milliseconds timeout,
                                        std::exception_ptr error,
                                        const std::vector<std::string>& peers = {},
                                        int only_peer = -1);

// Each rank's pair addresses, as Gloo names the other end of a pair in its
// errors ("Connection closed by peer [10.0.0.2]:41234"), by rank (this
// rank's entry empty): what translate_gloo_error's `peers` takes. Every rank
// writes the address of its end of each pair to `store` under `prefix`, and
// reads the other ends of its own. Throws TimeoutError (naming `where` and
// the ranks) when a rank has not written its addresses within `timeout`
// (its own connect failed).
std::vector<std::string> exchange_peer_addresses(Store& store, const std::string& prefix,
                                                 gloo::rendezvous::Context& context,
                                                 const std::string& where,
                                                 std::chrono::milliseconds timeout);

// An op with no bytes still meets the others, under its own tag: a rank
// that disagrees (elements on one side, none on the other) is then stuck
// with the rest, where the SignatureWatch finds it, instead of one rank
// returning while the others wait.
void empty_op(const std::shared_ptr<gloo::rendezvous::Context>& context, uint32_t tag,
              std::chrono::milliseconds timeout);

}  // namespace switchboard::collective
