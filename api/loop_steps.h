// The stepping arguments of a step loop (Session::launch_loop, Tape::launch_loop): what both
// check before computing any iteration's arguments.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "runtime/runtime.h"

namespace vkad {

// Refuses (kInvalidArgument, naming the argument) `step`s of another length than `args`, a
// non-zero step of an argument that is not an i32 scalar, a stepping i32 whose value does not
// fit i32, and one that leaves i32 within `count` iterations. After it succeeds,
// args[p].i + r * step[p] for r < count is an i32 and computing it overflows nothing.
Status check_loop_steps(std::span<const runtime::Arg> args, std::span<const int32_t> step,
                        uint32_t count);

}  // namespace vkad
