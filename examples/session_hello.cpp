// The session layer in 30 lines: an echo server and a client that sends a
// message, WRITEs the server's named buffer and READs it back.
//   session_hello server 127.0.0.1:7473 &  session_hello client 127.0.0.1:7473
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "rdmakit/session/session.hpp"

using namespace rdmakit::session;

int main(int argc, char** argv) {
  if (argc != 3)
    return std::fprintf(stderr, "usage: session_hello server|client ADDR\n"), 2;
  if (std::string(argv[1]) == "server") {
    Handlers h;
    h.on_message = [](Channel& ch, Message& m) { ch.send(m.data()); };  // echo
    h.on_disconnect = [](Endpoint& ep, const DisconnectInfo& info) {
      std::printf("%s left: %s\n", ep.peer().c_str(),
                  disconnect_reason_name(info.reason));
    };
    Server server(argv[2], {}, h);
    server.expose("board", 4096);  // peers may WRITE/READ it by name
    server.start();
    std::this_thread::sleep_for(std::chrono::hours(24));
  }
  Client client({});
  Channel& ch = client.connect(argv[2]).channel();
  ch.send("hello");
  Message reply;
  if (OpResult r = ch.recv(&reply, std::chrono::seconds(5)); !r.ok())
    return std::fprintf(stderr, "%s\n", r.detail.c_str()), 1;
  auto buf = client.context().allocate(4096, rdmakit::kAccessLocalWrite);
  std::strcpy(reinterpret_cast<char*>(buf->data()), "written one-sided");
  OpResult w = ch.write_sync("board", 0, Local::of(*buf), 64);  // no server CPU
  OpResult r = ch.read_sync("board", 0, Local::of(*buf), 64);
  std::printf("echo '%.*s', write %s, read %s\n", int(reply.text().size()),
              reply.text().data(), errc_name(w.code), errc_name(r.code));
}
