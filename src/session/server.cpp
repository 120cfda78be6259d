#include <rdmakit/session/server.hpp>

#include "engine.hpp"

namespace rdmakit::session {

Server::Server(const std::string& address, SessionOptions options, Handlers handlers)
    : engine_(std::make_unique<detail::Engine>(std::move(options), std::move(handlers),
                                               true)) {
  engine_->listen(address);
}

Server::~Server() = default;

Context& Server::context() noexcept { return engine_->ctx(); }
MemoryRegion& Server::expose(const std::string& name, size_t size, uint32_t access) {
  return engine_->expose(name, size, access);
}
void Server::expose(const std::string& name, MemoryRegion& region) {
  engine_->expose(name, region);
}
void Server::expose_per_endpoint(const std::string& name, size_t size, uint32_t access) {
  engine_->expose_per_endpoint(name, size, access);
}
void Server::start() { engine_->start_accepting(); }
uint16_t Server::port() const noexcept { return engine_->port(); }
std::string Server::address() const { return engine_->address(); }
int Server::progress(std::chrono::milliseconds timeout) {
  return engine_->app_worker().run_once(timeout);
}
int Server::fd() const { return engine_->app_worker().fd(); }
bool Server::arm() { return engine_->app_worker().arm(); }
size_t Server::endpoints() const { return engine_->endpoints(); }

}  // namespace rdmakit::session
