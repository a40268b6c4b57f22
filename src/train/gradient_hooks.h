// A hook on a parameter's gradient accumulator, shared by the engines that act on gradients as
// backward produces them (DataParallel, ZeroParallel).
#pragma once

#include <cstdint>
#include <functional>

namespace torch::autograd {
struct Node;
}

namespace hetra::train {

// Runs `ready` each time autograd has accumulated a gradient into the .grad of the parameter that
// `accumulator` belongs to (a post-hook: a tensor hook would see only this backward's part, before
// accumulation). The caller holds the accumulator, so that every backward reuses the node that
// carries the hook. Returns the hook's key, for del_post_hook.
uintptr_t onGradientAccumulated(torch::autograd::Node& accumulator, std::function<void()> ready);

}  // namespace hetra::train
