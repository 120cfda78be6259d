#pragma once
// The two roles of a stream test (tests/support/harness.hpp): a server with
// one engine and one accepted stream, a client with one engine and one
// connected stream, on the role's provider.
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "harness.hpp"
#include "helpers.hpp"
#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"

namespace rdmakit::test {

inline stream::EngineOptions engine_options(RoleEnv& env, stream::StreamOptions so = {}) {
  stream::EngineOptions o;
  o.provider = env.kind();
  o.stream = so;
  return o;
}

// Server role: one engine, one accepted stream.
struct Served {
  std::shared_ptr<stream::Engine> engine;
  std::unique_ptr<stream::StreamListener> listener;
  std::unique_ptr<stream::Stream> s;
};
inline Served serve(RoleEnv& env, stream::StreamOptions so = {}) {
  using namespace std::chrono_literals;
  Served r;
  r.engine = stream::Engine::create(engine_options(env, so));
  r.listener = r.engine->listen(env.listen_address());
  env.publish_port(r.listener->port());
  r.s = r.listener->accept(scaled(10s));
  return r;
}

// In split mode (two hosts) the server may not listen yet: retry refusals.
inline std::unique_ptr<stream::Stream> connect_retry(stream::Engine& engine,
                                                     const std::string& address,
                                                     const stream::StreamOptions& so) {
  using namespace std::chrono_literals;
  const auto until = std::chrono::steady_clock::now() + scaled(10s);
  for (;;) {
    try {
      return engine.connect(address, so);
    } catch (const Error& e) {
      if (e.sys_errno() != ECONNREFUSED || std::chrono::steady_clock::now() > until)
        throw;
      std::this_thread::sleep_for(50ms);
    }
  }
}

// Client role: one engine, one connected stream.
struct Connected {
  std::shared_ptr<stream::Engine> engine;
  std::unique_ptr<stream::Stream> s;
};
inline Connected dial(RoleEnv& env, stream::StreamOptions so = {}) {
  Connected r;
  r.engine = stream::Engine::create(engine_options(env, so));
  r.s = connect_retry(*r.engine, env.server_address(), so);
  return r;
}

// Whether fd shows POLLIN right now, or within timeout_ms (the kernel's view).
inline bool fd_readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

}  // namespace rdmakit::test
