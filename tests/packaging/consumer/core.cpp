// The core API from an installed rdmakit: open a context, name its provider;
// then the session and stream libraries, unless built against the core only.
#include <cstdio>
#include <rdmakit/rdmakit.hpp>

int session_echo();
int stream_echo();

int main() {
  auto ctx = rdmakit::Context::open();
  std::printf("consumer: provider %s\n", ctx->provider_name());
#ifndef RDMAKIT_CONSUMER_CORE_ONLY
  if (session_echo() != 0 || stream_echo() != 0) return 1;
#endif
  return 0;
}
