// The RPC demo's parameter server without RPC: its batching rule
// (examples/rpc_demo/parameter_server.h), its refusals, and trainers as
// threads that finish at different times. Every wait is bounded, so a
// deadlock fails the test instead of hanging it.
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "examples/rpc_demo/parameter_server.h"
#include "examples/rpc_demo/regression.h"

using switchboard::DType;
using switchboard::Tensor;
using switchboard::rpc_demo::DoneEvent;
using switchboard::rpc_demo::ParameterServer;
using switchboard::rpc_demo::ServerOptions;
using switchboard::rpc_demo::UpdateEvent;

namespace {

constexpr auto kGuard = std::chrono::seconds(30);

Tensor grad_of(std::vector<float> values) { return Tensor::from_vector(values); }

std::vector<float> values_of(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST_CASE("K pushes make one update with their mean gradient", "[rpc_demo]") {
  std::vector<UpdateEvent> events;
  ParameterServer server(
      {.dim = 2, .learning_rate = 0.5f, .trainers = 2, .pushes_per_update = 2},
      {.on_update = [&](const UpdateEvent& e) { events.push_back(e); }});
  auto first = server.push(1, grad_of({2, 4}));
  CHECK_FALSE(first.done());
  CHECK(server.version() == 0);
  auto second = server.push(2, grad_of({4, 8}));
  REQUIRE(first.wait_for(kGuard));
  REQUIRE(second.wait_for(kGuard));
  CHECK(first.value() == 1);
  CHECK(second.value() == 1);
  CHECK(values_of(server.params()) == std::vector<float>{-1.5f, -3.0f});
  REQUIRE(events.size() == 1);
  CHECK(events[0].batch_size == 2);
  CHECK(events[0].still_training == 2);
}

TEST_CASE("published parameters are never written by later updates", "[rpc_demo]") {
  ParameterServer server(
      {.dim = 1, .learning_rate = 1.0f, .trainers = 1, .pushes_per_update = 1});
  Tensor before = server.params();
  (void)server.push(1, grad_of({1}));
  CHECK(values_of(before) == std::vector<float>{0.0f});
  CHECK(values_of(server.params()) == std::vector<float>{-1.0f});
}

TEST_CASE("a trainer's done releases the partial batch the others wait on",
          "[rpc_demo]") {
  ParameterServer server(
      {.dim = 1, .learning_rate = 1.0f, .trainers = 3, .pushes_per_update = 3});
  auto a = server.push(1, grad_of({1}));
  auto b = server.push(2, grad_of({3}));
  CHECK_FALSE(a.done());
  auto finished = server.done(3);
  REQUIRE(a.wait_for(kGuard));
  CHECK(b.value() == 1);
  CHECK(values_of(server.params()) == std::vector<float>{-2.0f});
  CHECK_FALSE(finished.done());
  CHECK(server.still_training() == std::vector<int64_t>{1, 2});
}

TEST_CASE("the done hook reports each trainer before the final parameters are out",
          "[rpc_demo]") {
  std::vector<DoneEvent> events;
  ParameterServer* self = nullptr;
  ParameterServer server(
      {.dim = 1, .learning_rate = 1.0f, .trainers = 2, .pushes_per_update = 2},
      {.on_done = [&](const DoneEvent& e) {
        events.push_back(e);
        CHECK_FALSE(self->finished().done());
      }});
  self = &server;
  (void)server.push(1, grad_of({1}));
  (void)server.done(2);  // releases trainer 1's push: batches of 1 now
  CHECK(server.version() == 1);
  (void)server.done(1);
  REQUIRE(events.size() == 2);
  CHECK(events[0].trainer == 2);
  CHECK(events[0].pushes == 0);
  CHECK(events[0].still_training == 1);
  CHECK(events[0].batch_target == 1);
  CHECK(events[1].trainer == 1);
  CHECK(events[1].pushes == 1);
  CHECK(events[1].still_training == 0);
  CHECK(server.finished().done());
}

TEST_CASE("the last done completes every done future with the final parameters",
          "[rpc_demo]") {
  ParameterServer server(
      {.dim = 1, .learning_rate = 1.0f, .trainers = 2, .pushes_per_update = 2});
  auto first_done = server.done(1);
  auto pending = server.push(2, grad_of({5}));  // target is now 1: applied at once
  REQUIRE(pending.wait_for(kGuard));
  CHECK_FALSE(first_done.done());
  auto last_done = server.done(2);
  REQUIRE(first_done.wait_for(kGuard));
  CHECK(values_of(first_done.value()) == std::vector<float>{-5.0f});
  CHECK(values_of(last_done.value()) == std::vector<float>{-5.0f});
  CHECK(server.finished().done());
}

TEST_CASE("bad pushes and dones are refused, naming what was wrong", "[rpc_demo]") {
  ParameterServer server(
      {.dim = 2, .learning_rate = 1.0f, .trainers = 2, .pushes_per_update = 2});
  CHECK_THROWS_WITH(server.push(0, grad_of({1, 1})),
                    "push_grad: trainer 0 is not one of 1..2");
  CHECK_THROWS_WITH(server.push(1, grad_of({1, 1, 1})),
                    Catch::Contains("expected a contiguous float32[2] on cpu, got "
                                    "float32[3] on cpu"));
  CHECK_THROWS_WITH(server.push(1, Tensor::zeros({2}, DType::kFloat64)),
                    Catch::Contains("got float64[2] on cpu"));
  (void)server.done(1);
  CHECK_THROWS_WITH(server.push(1, grad_of({1, 1})),
                    "push_grad: trainer 1 already called done");
  CHECK_THROWS_WITH(server.done(1), "done: trainer 1 called done twice");
  CHECK_THROWS_WITH(server.done(3), "done: trainer 3 is not one of 1..2");
  CHECK_THROWS_AS(ParameterServer({.dim = 0, .trainers = 1, .pushes_per_update = 1}),
                  std::invalid_argument);
}

TEST_CASE("trainers that finish at different times all complete, whatever K is",
          "[rpc_demo]") {
  const int trainers = 4;
  const int k = GENERATE(1, 2, 3, 4, 9);
  CAPTURE(k);
  ParameterServer server(
      {.dim = 3, .learning_rate = 0.01f, .trainers = trainers, .pushes_per_update = k});
  std::vector<std::exception_ptr> errors(trainers);
  std::vector<std::thread> threads;
  for (int t = 1; t <= trainers; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int step = 0; step < 10 * t; ++step) {  // trainer t runs 10 * t steps
          auto applied = server.push(t, grad_of({1, 2, 3}));
          if (!applied.wait_for(kGuard)) throw std::runtime_error("push never applied");
        }
        if (!server.done(t).wait_for(kGuard))
          throw std::runtime_error("done never completed");
      } catch (...) {
        errors[t - 1] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  CHECK(server.finished().done());
  CHECK(server.pushes_by_trainer() == std::vector<int64_t>{10, 20, 30, 40});
  // Every gradient is {1, 2, 3}, so every update's mean is too, and each
  // update moves w[0] by -lr.
  const auto w = values_of(server.params());
  CHECK(w[0] == Approx(-0.01 * server.version()).epsilon(1e-4));
}

TEST_CASE("SGD on the demo's synthetic regression lowers the held-out loss",
          "[rpc_demo]") {
  using namespace switchboard::rpc_demo;
  const auto w_star = true_weights(16, 7);
  const Dataset train = make_dataset(w_star, 512, 0.1f, 8);
  const Dataset held_out = make_dataset(w_star, 256, 0.1f, 9);
  std::vector<float> w(16, 0.0f), grad(16);
  std::vector<int64_t> rows(512);
  for (int64_t i = 0; i < 512; ++i) rows[i] = i;
  const double initial = loss(held_out, w);
  for (int step = 0; step < 500; ++step) {
    gradient(train, w, rows, grad);
    for (size_t j = 0; j < w.size(); ++j) w[j] -= 0.5f * grad[j];
  }
  CHECK(loss(held_out, w) < initial / 100);
  CHECK(distance(w, w_star) < distance(std::vector<float>(16, 0.0f), w_star) / 10);
}

// A dynamic group: trainer 3 joins late. Until its join() the batches are
// those of the trainers already training; the run ends only once it, too,
// is done.
TEST_CASE("a late trainer counts only from its join, and the run waits for it",
          "[rpc_demo][dynamic]") {
  ParameterServer server({.dim = 1,
                          .learning_rate = 1.0f,
                          .trainers = 3,
                          .pushes_per_update = 3,
                          .late = {3}});
  CHECK_THROWS_WITH(server.push(3, grad_of({1})), Catch::Contains("has not joined"));
  auto a = server.push(1, grad_of({1}));
  CHECK_FALSE(a.done());
  auto b = server.push(2, grad_of({3}));
  REQUIRE(a.wait_for(kGuard));  // min(3, 2 training) = 2 pushes
  CHECK(b.value() == 1);
  server.join(3);
  CHECK_THROWS_WITH(server.join(3), Catch::Contains("it is training"));
  CHECK_THROWS_WITH(server.join(1), Catch::Contains("not a late trainer"));
  auto c = server.push(1, grad_of({1}));
  auto d = server.push(3, grad_of({1}));
  CHECK_FALSE(c.done());  // now 3 are training
  auto e = server.push(2, grad_of({1}));
  REQUIRE(c.wait_for(kGuard));
  CHECK(d.value() == 2);
  CHECK(e.value() == 2);
  // Trainers 1 and 2 finishing is not the end while 3 still trains.
  auto finished = server.done(1);
  (void)server.done(2);
  CHECK_FALSE(finished.done());
  CHECK(server.still_training() == std::vector<int64_t>{3});
  (void)server.done(3);
  REQUIRE(finished.wait_for(kGuard));
  CHECK(values_of(finished.value()) == std::vector<float>{-3.0f});
}

TEST_CASE("a late trainer that never joins may still be done, ending the run",
          "[rpc_demo][dynamic]") {
  ParameterServer server(
      {.dim = 1, .learning_rate = 1.0f, .trainers = 2, .pushes_per_update = 2, .late = {2}});
  auto a = server.push(1, grad_of({2}));
  REQUIRE(a.wait_for(kGuard));  // only trainer 1 trains
  auto finished = server.done(1);
  CHECK_FALSE(finished.done());
  (void)server.done(2);
  REQUIRE(finished.wait_for(kGuard));
  CHECK(server.version() == 1);
}
