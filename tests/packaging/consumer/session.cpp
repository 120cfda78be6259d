// The session library from an installed rdmakit.
#include <cstdio>
#include <rdmakit/session/session.hpp>

void print_session_mode() {
  using namespace rdmakit::session;
  std::printf("consumer: session thread mode %s\n",
              thread_mode_name(parse_thread_mode("workers")));
}
