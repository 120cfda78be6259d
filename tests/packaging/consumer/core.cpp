// The core API from an installed rdmakit: open a context, name its provider.
#include <cstdio>
#include <rdmakit/rdmakit.hpp>

void print_session_mode();

int main() {
  auto ctx = rdmakit::Context::open();
  std::printf("consumer: provider %s\n", ctx->provider_name());
#ifndef RDMAKIT_CONSUMER_CORE_ONLY
  print_session_mode();
#endif
  return 0;
}
