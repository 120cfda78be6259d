// The stream library from an installed rdmakit: a connected pair of streams
// on one engine, bytes one way and back.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <rdmakit/stream/stream.hpp>
#include <string>
#include <thread>

int stream_echo() {
  using namespace rdmakit::stream;
  auto engine = Engine::create();
  auto listener = engine->listen("127.0.0.1:0");
  // connect() waits for the accepting side's handshake: from another thread.
  std::unique_ptr<Stream> client;
  std::thread connecting(
      [&] { client = engine->connect("127.0.0.1:" + std::to_string(listener->port())); });
  auto server = listener->accept(std::chrono::seconds(5));
  connecting.join();
  const char text[] = "stream bytes";
  char buf[sizeof text] = {};
  if (client->write(text, sizeof text) != ssize_t(sizeof text) ||
      server->read(buf, sizeof buf, Stream::kWaitAll) != ssize_t(sizeof buf) ||
      server->write(buf, sizeof buf) != ssize_t(sizeof buf) ||
      client->read(buf, sizeof buf, Stream::kWaitAll) != ssize_t(sizeof buf) ||
      std::memcmp(buf, text, sizeof text) != 0) {
    std::fprintf(stderr, "consumer: stream echo failed: %s\n",
                 std::strerror(client->error() ? client->error() : server->error()));
    return 1;
  }
  std::printf("consumer: stream echo %s\n", buf);
  return 0;
}
