#pragma once
// For tests only: while a factory is set, every Context::open in this
// process builds its context with it instead of a provider (tests/fake: an
// in-process provider with fault injection, so session and stream protocol
// tests can stage a lost completion, an RNR or a peer death at an exact
// moment). Applications never call this.
#include <memory>

#include "rdmakit/context.hpp"
#include "rdmakit/export.hpp"

namespace rdmakit::testing {

using ContextFactory = std::unique_ptr<Context> (*)(const ContextOptions& options);

// nullptr restores the providers. Returns the factory set before.
RDMAKIT_API ContextFactory set_context_factory(ContextFactory factory) noexcept;

}  // namespace rdmakit::testing
