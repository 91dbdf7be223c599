// The umbrella header: #include <nodal/nodal.hpp>.
#pragma once

#include <nodal/context.hpp>
#include <nodal/errors.hpp>
#include <nodal/process.hpp>
#include <nodal/process_context.hpp>
#include <nodal/spawn.hpp>
#if __has_include(<nodal/communicator.hpp>)
#include <nodal/communicator.hpp>
#endif
