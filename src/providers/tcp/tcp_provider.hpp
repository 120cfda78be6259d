#pragma once
// Every class of the tcp provider, for the fuzzer and the white-box tests
// that drive a queue pair over a socketpair without a handshake. The
// provider's own sources include the header of the concept they need.
#include "providers/tcp/tcp_context.hpp"   // IWYU pragma: export
#include "providers/tcp/tcp_cq.hpp"        // IWYU pragma: export
#include "providers/tcp/tcp_mr.hpp"        // IWYU pragma: export
#include "providers/tcp/tcp_progress.hpp"  // IWYU pragma: export
#include "providers/tcp/tcp_qp.hpp"        // IWYU pragma: export
#include "providers/tcp/tcp_srq.hpp"       // IWYU pragma: export
