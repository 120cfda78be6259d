#pragma once
// rdmakit transport core: include this one header.
#include "rdmakit/completion_queue.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"
#include "rdmakit/memory.hpp"
#include "rdmakit/provider.hpp"
#include "rdmakit/queue_pair.hpp"
#include "rdmakit/shared_receive_queue.hpp"
#include "rdmakit/status.hpp"
#include "rdmakit/types.hpp"
