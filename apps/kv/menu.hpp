#pragma once
// The client's front ends: the lab's numbered menu and line commands.
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "client.hpp"

namespace rdmakit::kv {

// The lab's menu: 0 disconnect and quit, 1 set, 2 query by RPC, 3 query by
// RDMA READ; "Enter key:" / "Enter value:" prompts. Reads until 0 or end of
// input. Returns the exit status (0 unless the connection failed).
int run_menu(Client& client, std::istream& in, std::ostream& out, bool quiet);

// One command: put K V | get K | getr K (GET by READ) | del K. get uses
// default_mode. Prints the result on out; returns false for an error answer.
bool run_command(Client& client, const std::vector<std::string>& words,
                 GetMode default_mode, std::ostream& out, bool quiet);

// Commands from in, one per line ("put K rest of line is the value"). Returns
// the exit status: 0 if every command succeeded (a missing key counts as one).
int run_commands(Client& client, std::istream& in, GetMode default_mode,
                 std::ostream& out, bool quiet);

}  // namespace rdmakit::kv
