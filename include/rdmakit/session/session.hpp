#pragma once
// rdmakit sessions: include this one header.
#include <rdmakit/session/buffer_pool.hpp>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/client.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <rdmakit/session/options.hpp>
#include <rdmakit/session/server.hpp>
