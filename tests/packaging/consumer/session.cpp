// The session library from an installed rdmakit: a server that echoes, a
// client that sends one message and waits for it back.
#include <chrono>
#include <cstdio>
#include <rdmakit/session/session.hpp>
#include <string>

int session_echo() {
  using namespace rdmakit::session;
  SessionOptions options;
  options.thread_mode = parse_thread_mode("workers");
  Handlers handlers;
  handlers.on_message = [](Channel& ch, Message& m) { ch.send(m.data()); };
  Server server("127.0.0.1:0", options, handlers);
  server.start();
  Client client(options);
  Channel& ch = client.connect("127.0.0.1:" + std::to_string(server.port())).channel();
  if (OpResult r = ch.send("hello"); !r.ok()) {
    std::fprintf(stderr, "consumer: session send: %s\n", r.detail.c_str());
    return 1;
  }
  Message reply;
  if (OpResult r = ch.recv(&reply, std::chrono::seconds(5)); !r.ok()) {
    std::fprintf(stderr, "consumer: session recv: %s %s\n", errc_name(r.code),
                 r.detail.c_str());
    return 1;
  }
  std::printf("consumer: session (%s) echo %.*s\n", thread_mode_name(options.thread_mode),
              int(reply.text().size()), reply.text().data());
  return reply.text() == "hello" ? 0 : 1;
}
