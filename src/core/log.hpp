#pragma once
// The library's logger ("rdmakit", stderr). Level from RDMAKIT_LOG
// (trace|debug|info|warn|error|off; default warn: warnings and errors only). Never used
// on the data path.
#include <spdlog/spdlog.h>

namespace rdmakit::core {
spdlog::logger& log();
}  // namespace rdmakit::core
